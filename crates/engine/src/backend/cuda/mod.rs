//! The CUDA backend: every weight resident on the GPU (matrices in their GGUF block format,
//! decoded inside the kernels), activations and per-sequence state in device memory. The
//! matrix products follow the CPU backend's [`Precision`]: by default (`Ggml`) the
//! activations of the k-quant and IQ products are quantized to Q8_K inside the kernels and
//! the block dots are integer (`REDLITE_CUDA_EXACT=1` or `Precision::Exact`: f32
//! activations everywhere, the exact math of the dequantized weights).
//!
//! Every op only queues kernels on the device's stream; the host waits only where data
//! comes back (`logits`, `to_host`). Intermediate buffers (`Scratch`) are allocated once
//! for the largest batch, so a decode step allocates nothing — the precondition for
//! capturing a whole one-token decode step in one CUDA graph (`graph`), replayed with the
//! token id and position read from device memory.

mod act;
mod attention;
mod beside;
mod deltanet;
mod experts;
mod forward_ops;
mod graph;
mod head;
mod host_moe;
mod kept;
mod moe;
mod moe_pairs;
mod moe_route;
mod mtp;
mod prefetch;
mod q8_buffers;
mod scratch;
mod state;
mod step_clocks;
mod step_graph;
mod step_times;
mod weights;

use std::sync::{Arc, Mutex, MutexGuard};

use redlite_cuda::{Device, Dots, RouteSkew};
use redlite_gguf::GgufModel;

pub use crate::backend::cpu::linear::Precision;
use crate::backend::Norm;
use crate::error::{EngineError, Result};
use crate::model::config::HybridConfig;
pub use act::CudaAct;
/// Switches of paths written without a GPU, which GPU tests set to compare them with the
/// default paths in one process.
pub mod switches {
    pub use super::head::{CHAINED_GREEDY, DEVICE_GREEDY, LOGITS_HALVING, PINNED_LOGITS};
    pub use super::step_graph::STEP_GRAPH;
}
use experts::LayerCache;
pub use experts::{cache_policy_from_env, ExpertResidency};
use graph::{DecodeGraphs, Gate, Op, OpKey, SharedGraphs};
use host_moe::HostMoe;
use prefetch::PrefetchBuffers;
use scratch::Scratch;
pub use state::CudaState;
pub use step_graph::StepGraphCounts;
use weights::CudaWeights;

pub struct CudaBackend {
    config: HybridConfig,
    device: Arc<Device>,
    weights: CudaWeights,
    /// Behind a lock because `Backend` ops take `&self`; uncontended (one sequence at a time).
    scratch: Mutex<Scratch>,
    /// The recorded one-token decode steps (shared with every state, whose `set_pos` ends
    /// a step).
    graphs: SharedGraphs,
    /// How every matrix's products are computed (the MTP block, loaded later, matches).
    dots: Dots,
    /// Where the routed experts live (the MTP block, loaded later, matches).
    residency: ExpertResidency,
    /// With an expert cache: each block's (index `n_layer`: the MTP block's). Behind a lock
    /// for the same reason as `scratch`.
    caches: Mutex<Vec<Option<LayerCache>>>,
    /// Benchmark only: the skewed routing law that replaces the router's choice
    /// (`REDLITE_BENCH_ROUTE_SKEW`), or `None` (the router's choice).
    route_skew: Option<RouteSkew>,
    /// With `ExpertResidency::Cpu`: the MoE blocks on the CPU.
    host_moe: Option<HostMoe>,
    /// The MTP block's input buffers, grown to the largest batch it saw.
    mtp_buffers: Mutex<mtp::MtpBuffers>,
    /// With an expert cache and `REDLITE_CACHE_PREFETCH=1`: the prefetch's buffers.
    prefetch: Mutex<Option<PrefetchBuffers>>,
    /// With `REDLITE_PINNED_LOGITS=1`: the page-locked buffer logits come back through.
    logits_stage: Mutex<redlite_cuda::HostStage>,
    /// Chained greedy steps: the picks kept on the device.
    kept: Mutex<kept::KeptPicks>,
}

impl CudaBackend {
    /// Opens GPU 0 and uploads every tensor of the model to it.
    pub fn new(gguf: Arc<GgufModel>, config: HybridConfig) -> Result<CudaBackend> {
        let device = Arc::new(Device::open(0)?);
        CudaBackend::with_device(device, &gguf, config)
    }

    /// Uploads every tensor to an already opened device (tests share one), with the
    /// precision `REDLITE_CUDA_EXACT` selects.
    pub fn with_device(
        device: Arc<Device>,
        gguf: &GgufModel,
        config: HybridConfig,
    ) -> Result<CudaBackend> {
        CudaBackend::with_precision(device, gguf, config, CudaBackend::precision_from_env())
    }

    /// The precision `REDLITE_CUDA_EXACT` selects (`Ggml` unless it is 1 or true).
    pub fn precision_from_env() -> Precision {
        let exact = matches!(
            std::env::var("REDLITE_CUDA_EXACT").as_deref(),
            Ok("1") | Ok("true")
        );
        if exact {
            Precision::Exact
        } else {
            Precision::Ggml
        }
    }

    /// Uploads every tensor to an already opened device; products in `precision`.
    pub fn with_precision(
        device: Arc<Device>,
        gguf: &GgufModel,
        config: HybridConfig,
        precision: Precision,
    ) -> Result<CudaBackend> {
        CudaBackend::with_options(device, gguf, config, precision, ExpertResidency::Resident)
    }

    /// Uploads every tensor to an already opened device, the routed experts as `residency`
    /// says; products in `precision`.
    pub fn with_options(
        device: Arc<Device>,
        gguf: &GgufModel,
        config: HybridConfig,
        precision: Precision,
        residency: ExpertResidency,
    ) -> Result<CudaBackend> {
        let dots = match precision {
            Precision::Exact => Dots::F32,
            Precision::Ggml => Dots::Q8K,
        };
        if let ExpertResidency::Cache { slots, .. } = residency {
            if slots < config.n_expert_used.max(1) || slots >= config.n_expert {
                return Err(EngineError::BadConfig(format!(
                    "an expert cache of {slots} slots per layer: expected {} (the router's top-k) to {} (one short of every expert)",
                    config.n_expert_used,
                    config.n_expert.saturating_sub(1)
                )));
            }
        }
        let (weights, cached) = weights::upload(&device, gguf, &config, dots, residency)?;
        let mut caches: Vec<Option<LayerCache>> = (0..=config.n_layer).map(|_| None).collect();
        for (layer, cache) in cached {
            caches[layer] = Some(cache);
        }
        let route_skew = route_skew_from_env()?;
        let scratch = Mutex::new(Scratch::new(&device, &config, 1, keeps_codes(dots))?);
        let prefetch = match residency {
            ExpertResidency::Cache { .. } if prefetch::prefetch_on() => {
                Some(PrefetchBuffers::new(&device, &config)?)
            }
            _ => None,
        };
        let prefetch = Mutex::new(prefetch);
        let graphs = DecodeGraphs::new(device.clone())?;
        Ok(CudaBackend {
            config,
            device,
            weights,
            scratch,
            graphs,
            dots,
            residency,
            caches: Mutex::new(caches),
            route_skew,
            host_moe: None,
            mtp_buffers: Mutex::new(mtp::MtpBuffers::default()),
            kept: Mutex::new(kept::KeptPicks::default()),
            prefetch,
            logits_stage: Mutex::new(redlite_cuda::HostStage::new()),
        })
    }

    /// Uploads every tensor but the routed experts, which stay in the file's mapping: each
    /// MoE block runs on the CPU (`--experts cpu`), and the decode graph is off (the host
    /// takes part in every layer).
    pub fn with_host_experts(
        device: Arc<Device>,
        gguf: &Arc<GgufModel>,
        config: HybridConfig,
        precision: Precision,
    ) -> Result<CudaBackend> {
        let host = HostMoe::new(gguf.clone(), &config, precision)?;
        let mut backend =
            CudaBackend::with_options(device, gguf, config, precision, ExpertResidency::Cpu)?;
        backend.host_moe = Some(host);
        backend.disable_graphs()?;
        Ok(backend)
    }

    /// Where the routed experts live.
    pub fn residency(&self) -> ExpertResidency {
        self.residency
    }

    /// Which slot holds each expert of block `layer` (-1: none); `None` without a cache
    /// there. For tests.
    pub fn cache_slots(&self, layer: usize) -> Result<Option<Vec<i32>>> {
        let caches = self.caches()?;
        match caches.get(layer).and_then(|c| c.as_ref()) {
            Some(cache) => Ok(Some(cache.slot_of(&self.device)?)),
            None => Ok(None),
        }
    }

    fn caches(&self) -> Result<MutexGuard<'_, Vec<Option<LayerCache>>>> {
        self.caches
            .lock()
            .map_err(|_| EngineError::Cuda("expert cache lock poisoned by a panic".into()))
    }

    /// Uploads the MTP block (spec §4) next to the main stack; refused when the file has
    /// none. A no-op when already loaded.
    pub fn load_mtp(&mut self, gguf: &GgufModel) -> Result<()> {
        if self.weights.mtp.is_none() {
            let (mtp, cached) =
                weights::upload_mtp(&self.device, gguf, &self.config, self.dots, self.residency)?;
            self.weights.mtp = Some(mtp);
            let mut caches = self.caches()?;
            for (layer, cache) in cached {
                if let Some(place) = caches.get_mut(layer) {
                    *place = Some(cache);
                }
            }
            drop(caches);
            if let Some(host) = self.host_moe.as_mut() {
                host.load_mtp(&self.config)?;
            }
        }
        Ok(())
    }

    pub fn device(&self) -> &Arc<Device> {
        &self.device
    }

    /// Turns the one-token decode graphs off for this backend (as `REDLITE_CUDA_GRAPH=0`
    /// does for every backend): tests compare the graph with eager launches.
    pub fn disable_graphs(&self) -> Result<()> {
        graph::lock(&self.graphs)?.disable();
        Ok(())
    }

    /// Turns the expert cache's prefetch (`prefetch.rs`) on or off for this backend (by
    /// default as `REDLITE_CACHE_PREFETCH` says); without a cache there is nothing to do.
    /// Call it before decoding: a decode graph already recorded keeps what it recorded.
    pub fn set_prefetch(&self, on: bool) -> Result<()> {
        let mut buffers = self
            .prefetch
            .lock()
            .map_err(|_| EngineError::Cuda("prefetch lock poisoned by a panic".into()))?;
        let cached = matches!(self.residency, ExpertResidency::Cache { .. });
        *buffers = match on && cached {
            true => Some(PrefetchBuffers::new(&self.device, &self.config)?),
            false => None,
        };
        Ok(())
    }

    /// The scratch buffers, with room for `tokens`.
    fn scratch(&self, tokens: usize) -> Result<MutexGuard<'_, Scratch>> {
        let mut scratch = self
            .scratch
            .lock()
            .map_err(|_| EngineError::Cuda("scratch lock poisoned by a panic".into()))?;
        scratch.reserve(&self.device, &self.config, tokens)?;
        Ok(scratch)
    }

    /// What op `op` on a batch of `tokens` and `buffers` does in the current step (see
    /// `graph`).
    fn gate(&self, op: Op, tokens: usize, buffers: [u64; 3]) -> Result<Gate> {
        graph::lock(&self.graphs)?.gate(self.key(op, tokens, buffers)?)
    }

    /// The same for a mixer of a sequence at `pos`, one of the batch's `sequences` (which may
    /// start a capture or replay).
    fn mixer_gate(
        &self,
        op: Op,
        tokens: usize,
        buffers: [u64; 3],
        (pos, sequences): (usize, usize),
    ) -> Result<Gate> {
        let key = self.key(op, tokens, buffers)?;
        graph::lock(&self.graphs)?.mixer(key, pos, sequences)
    }

    /// An op with its token count, buffers and the scratch generation (the scratch buffers
    /// it uses).
    fn key(&self, op: Op, tokens: usize, [a, b, c]: [u64; 3]) -> Result<OpKey> {
        let generation = self.scratch(1)?.generation;
        Ok(OpKey {
            op,
            tokens,
            buffers: [a, b, c, generation],
        })
    }

    /// A forward pass of `tokens` rows launches its kernels overlapping the previous one
    /// (PDL) where it is of decode size; a prompt's launches wait as plain launches do.
    fn overlap_for(&self, tokens: usize) {
        self.device
            .overlap_launches(tokens <= redlite_cuda::ONE_TOKEN_KERNELS_MAX_TOKENS);
    }

    /// Whether a batch of `tokens` may be recorded as a graph: one token, or a small batch
    /// when every expert is resident (a cache's misses and the CPU's experts need the host
    /// in the middle of a batch of several tokens).
    fn graphable(&self, tokens: usize) -> bool {
        tokens == 1
            || (tokens <= redlite_cuda::SMALL_BATCH_MAX_TOKENS
                && self.residency == ExpertResidency::Resident)
    }

    /// The weight of a norm; layer `n_layer` is the MTP block's.
    fn norm_weights(&self, norm: Norm) -> Result<&redlite_cuda::CudaSlice<f32>> {
        Ok(match norm {
            Norm::Attn(l) => &self.weights.layer(l)?.attn_norm,
            Norm::Post(l) => &self.weights.layer(l)?.post_norm,
            Norm::Output => &self.weights.output_norm,
            Norm::MtpHead => &self.weights.mtp()?.head_norm,
        })
    }

    fn not_a(&self, layer: usize, kind: &str) -> EngineError {
        EngineError::BadConfig(format!("layer {layer} is not {kind} layer"))
    }
}

/// `REDLITE_BENCH_ROUTE_SKEW=<decay>` (benchmark only, docs/CUDA.md): every MoE layer's
/// experts drawn from [`RouteSkew`]'s law of that decay (0.22: the skew measured on
/// Qwen3-30B-A3B); unset, empty or 0: the router's choice. Anything else is refused.
fn route_skew_from_env() -> Result<Option<RouteSkew>> {
    let value = std::env::var("REDLITE_BENCH_ROUTE_SKEW").unwrap_or_default();
    if value.is_empty() || value == "0" {
        return Ok(None);
    }
    match value.parse::<f32>().ok().and_then(RouteSkew::new) {
        Some(skew) => Ok(Some(skew)),
        None => Err(EngineError::BadConfig(format!(
            "REDLITE_BENCH_ROUTE_SKEW={value}: expected a decay from 0.01 to 100 (a fraction of the experts; {} fits Qwen3-30B-A3B's measured routing), or 0 for the router's choice",
            RouteSkew::QWEN3_DIVERSE
        ))),
    }
}

/// Whether the activations keep Q8_K codes for the q8 products (their `dots`), unless
/// `REDLITE_Q8_ONCE=0`: then the norms do not quantize their output and the products
/// quantize it in each CTA (the same bits; docs/PERF.md, tenth session).
fn keeps_codes(dots: Dots) -> bool {
    static ON: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    dots == Dots::Q8K && *ON.get_or_init(|| std::env::var("REDLITE_Q8_ONCE").as_deref() != Ok("0"))
}
