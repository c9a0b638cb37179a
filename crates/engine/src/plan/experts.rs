//! Where the routed experts live: all resident, a per-layer GPU cache of whole expert
//! slots, or host memory with the experts computed on the CPU.
//!
//! A cache holds the same number of slots in every MoE layer (routing is per layer, and
//! random or real routing spreads over layers about evenly), each slot sized for one expert
//! of its layer (types differ by layer: the first `ffn_down_exps` are Q2_K in IQ2_XXS files,
//! half are Q6_K in Q4_K_M files). Its minimum is top-k slots per layer: one token's experts
//! of a layer must be on the GPU together for the layer to run there; below that the GPU
//! cannot compute a layer without waiting on copies inside it, and the CPU is the better
//! place for the experts.

use serde::Serialize;

use crate::plan::settings::ExpertPolicy;
use crate::plan::shape::ModelShape;

/// Facts about the experts the engine will run (main stack, plus the MTP block when asked).
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct ExpertPool {
    pub moe_layers: u64,
    pub experts_per_layer: u64,
    /// Bytes of every routed expert.
    pub total: u64,
    /// Bytes of one slot in every MoE layer: what one more cache slot per layer costs.
    pub slot_set: u64,
    /// Smallest and largest single expert (bytes) over the layers.
    pub per_expert_min: u64,
    pub per_expert_max: u64,
    /// The smallest useful cache, in slots per layer (the top-k of the router).
    pub min_cache_slots: u64,
}

impl ExpertPool {
    pub fn new(shape: &ModelShape, mtp: bool) -> ExpertPool {
        let mtp_layer = shape.mtp.as_ref().filter(|_| mtp).map(|m| &m.experts);
        let layers: Vec<_> = shape.experts.iter().chain(mtp_layer).collect();
        ExpertPool {
            moe_layers: layers.len() as u64,
            experts_per_layer: shape.config.n_expert as u64,
            total: layers.iter().map(|l| l.bytes).sum(),
            slot_set: layers.iter().map(|l| l.per_expert).sum(),
            per_expert_min: layers.iter().map(|l| l.per_expert).min().unwrap_or(0),
            per_expert_max: layers.iter().map(|l| l.per_expert).max().unwrap_or(0),
            min_cache_slots: shape.config.n_expert_used as u64,
        }
    }

    /// Bytes of a cache of `slots` per layer.
    pub fn cache_bytes(&self, slots: u64) -> u64 {
        slots.saturating_mul(self.slot_set)
    }

    /// Whole slots per layer that `bytes` hold, at most one short of every expert (a cache
    /// of every expert is residency).
    pub fn slots_in(&self, bytes: u64) -> u64 {
        (bytes / self.slot_set.max(1)).min(self.experts_per_layer.saturating_sub(1))
    }
}

/// The residency a plan settles on.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Serialize)]
#[serde(rename_all = "snake_case", tag = "kind")]
pub enum Residency {
    /// Experts in host memory, computed on the CPU.
    Cpu,
    /// `slots_per_layer` experts of every MoE layer on the GPU; misses copied from host memory.
    Cache { slots_per_layer: u64 },
    /// Every expert on the GPU.
    Resident,
}

/// The expert half of a plan.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct ExpertPlan {
    pub pool: ExpertPool,
    pub residency: Residency,
    /// Bytes the experts take on the GPU.
    pub gpu_bytes: u64,
    /// Bytes of experts kept in host memory (a pinned copy for the cache, or the CPU's).
    pub host_bytes: u64,
    /// Whether this residency fits in what the rest of the plan leaves.
    pub fits: bool,
    /// Why it does not fit, when it does not.
    pub problem: Option<String>,
}

fn settled(pool: &ExpertPool, residency: Residency, available: i128) -> ExpertPlan {
    let gpu_bytes = match residency {
        Residency::Resident => pool.total,
        Residency::Cache { slots_per_layer } => pool.cache_bytes(slots_per_layer),
        Residency::Cpu => 0,
    };
    let fits = available >= i128::from(gpu_bytes);
    let problem = (!fits).then(|| match residency {
        Residency::Cpu => {
            "the weights, state and buffers besides the experts exceed the limit".into()
        }
        _ => "the experts' share exceeds what the rest of the plan leaves".into(),
    });
    ExpertPlan {
        pool: pool.clone(),
        residency,
        gpu_bytes,
        host_bytes: if residency == Residency::Resident {
            0
        } else {
            pool.total
        },
        fits,
        problem,
    }
}

/// Settles the experts given the bytes the rest of the plan leaves (`available`, negative
/// when the rest alone exceeds the limit).
pub fn decide(pool: &ExpertPool, policy: ExpertPolicy, available: i128) -> ExpertPlan {
    let room = u64::try_from(available.max(0)).unwrap_or(u64::MAX);
    match policy {
        ExpertPolicy::Resident => settled(pool, Residency::Resident, available),
        ExpertPolicy::Cpu => settled(pool, Residency::Cpu, available),
        ExpertPolicy::Auto => {
            let slots = pool.slots_in(room);
            let residency = if room >= pool.total {
                Residency::Resident
            } else if slots >= pool.min_cache_slots {
                Residency::Cache {
                    slots_per_layer: slots,
                }
            } else {
                Residency::Cpu
            };
            settled(pool, residency, available)
        }
        ExpertPolicy::Cache(bytes) => {
            if bytes >= pool.total {
                return settled(pool, Residency::Resident, available);
            }
            let slots = pool.slots_in(bytes);
            let mut plan = settled(
                pool,
                Residency::Cache {
                    slots_per_layer: slots,
                },
                available,
            );
            if slots < pool.min_cache_slots {
                plan.fits = false;
                plan.problem = Some(format!(
                    "a cache of {slots} slots per layer is below the minimum of {} (the router's top-k)",
                    pool.min_cache_slots
                ));
            }
            plan
        }
    }
}
