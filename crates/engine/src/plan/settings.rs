//! What the user asks of a plan: the GPU memory limit and how the engine will run.

use std::fmt;

use serde::{Serialize, Serializer};

use crate::plan::error::{PlanError, Result};
use crate::plan::units::{parse_bytes, GIB, MIB};
use crate::state::KvType;

/// The engine's defaults (`redlite generate`, `chat`, `serve`).
pub const DEFAULT_CTX: usize = 4096;
pub const DEFAULT_CHUNK: usize = crate::session::DEFAULT_CHUNK;

/// Where the routed experts live.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ExpertPolicy {
    /// The best that fits: all resident, else the largest cache, else on the CPU.
    Auto,
    /// All on the GPU, or the plan does not fit.
    Resident,
    /// A GPU cache of at most this many bytes (rounded down to whole slots).
    Cache(u64),
    /// All in host memory, computed on the CPU.
    Cpu,
}

impl ExpertPolicy {
    /// `auto`, `resident`, `cpu` or `cache=SIZE` (`cache=12GiB`).
    pub fn parse(s: &str) -> Result<ExpertPolicy> {
        match s {
            "auto" => Ok(ExpertPolicy::Auto),
            "resident" => Ok(ExpertPolicy::Resident),
            "cpu" => Ok(ExpertPolicy::Cpu),
            _ => match s.strip_prefix("cache=") {
                Some(size) => Ok(ExpertPolicy::Cache(parse_bytes(size)?)),
                None => Err(PlanError::BadSetting {
                    name: "--experts",
                    value: s.to_string(),
                    why: "expected auto, resident, cache=SIZE or cpu".into(),
                }),
            },
        }
    }
}

impl fmt::Display for ExpertPolicy {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ExpertPolicy::Auto => f.write_str("auto"),
            ExpertPolicy::Resident => f.write_str("resident"),
            // Whole MiB rounded up, so that parsing it back gives the same whole slots (a slot
            // set is tens of MiB).
            ExpertPolicy::Cache(bytes) if bytes % GIB == 0 => write!(f, "cache={}GiB", bytes / GIB),
            ExpertPolicy::Cache(bytes) => write!(f, "cache={}MiB", bytes.div_ceil(MIB)),
            ExpertPolicy::Cpu => f.write_str("cpu"),
        }
    }
}

/// The inputs of a plan besides the model.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct PlanSettings {
    /// Bytes of GPU memory the engine may use, the CUDA context included.
    pub gpu_limit: u64,
    /// KV positions per slot.
    pub ctx: usize,
    /// Prompt tokens per forward call.
    pub chunk: usize,
    #[serde(serialize_with = "kv_name")]
    pub kv: KvType,
    /// Sequences served at once, each with its own KV cache and DeltaNet state.
    pub slots: usize,
    /// Count the MTP block (its weights, its KV layer, its draft rows, the DeltaNet states
    /// a verification records for a rollback).
    pub mtp: bool,
    /// With `mtp`: tokens drafted per step (each slot verifies `1 + draft` rows).
    pub draft: usize,
    #[serde(serialize_with = "policy_name")]
    pub experts: ExpertPolicy,
}

fn kv_name<S: Serializer>(kv: &KvType, s: S) -> std::result::Result<S::Ok, S::Error> {
    s.serialize_str(kv_str(*kv))
}

fn policy_name<S: Serializer>(p: &ExpertPolicy, s: S) -> std::result::Result<S::Ok, S::Error> {
    s.serialize_str(&p.to_string())
}

pub fn kv_str(kv: KvType) -> &'static str {
    match kv {
        KvType::F32 => "f32",
        KvType::F16 => "f16",
    }
}

/// Bytes of one KV value.
pub fn kv_value_bytes(kv: KvType) -> u64 {
    match kv {
        KvType::F32 => 4,
        KvType::F16 => 2,
    }
}

impl PlanSettings {
    /// The engine's defaults under a memory limit.
    pub fn new(gpu_limit: u64) -> PlanSettings {
        PlanSettings {
            gpu_limit,
            ctx: DEFAULT_CTX,
            chunk: DEFAULT_CHUNK,
            kv: KvType::F32,
            slots: 1,
            mtp: false,
            draft: 1,
            experts: ExpertPolicy::Auto,
        }
    }

    /// Refuses settings no engine could run with.
    pub fn validate(&self) -> Result<()> {
        let bad = |name, value: usize| PlanError::BadSetting {
            name,
            value: value.to_string(),
            why: "must be at least 1".into(),
        };
        if self.ctx == 0 {
            return Err(bad("--ctx", self.ctx));
        }
        if self.chunk == 0 {
            return Err(bad("--chunk", self.chunk));
        }
        if self.slots == 0 {
            return Err(bad("--slots", self.slots));
        }
        if self.mtp && !(1..=crate::session::MAX_DRAFT).contains(&self.draft) {
            return Err(PlanError::BadSetting {
                name: "--draft",
                value: self.draft.to_string(),
                why: format!("must be 1 to {}", crate::session::MAX_DRAFT),
            });
        }
        if self.gpu_limit == 0 {
            return Err(PlanError::BadSetting {
                name: "--gpu-limit",
                value: "0".into(),
                why: "must be more than 0 bytes".into(),
            });
        }
        Ok(())
    }
}
