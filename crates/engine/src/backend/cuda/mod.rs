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
mod deltanet;
mod experts;
mod graph;
mod host_moe;
mod moe;
mod moe_pairs;
mod mtp;
mod prefetch;
mod q8_buffers;
mod scratch;
mod state;
mod weights;

use std::sync::{Arc, Mutex, MutexGuard};

use redlite_cuda::{Device, Dots, Position, RouteSkew};
use redlite_gguf::GgufModel;

pub use crate::backend::cpu::linear::Precision;
use crate::backend::{Backend, Batch, ExpertCacheCounts, Norm, Segment};
use crate::error::{EngineError, Result};
use crate::model::config::HybridConfig;
use crate::state::KvType;
pub use act::CudaAct;
use experts::LayerCache;
pub use experts::{cache_policy_from_env, ExpertResidency};
use graph::{DecodeGraphs, Gate, Op, OpKey, SharedGraphs};
use host_moe::HostMoe;
use moe::LayerSkew;
use prefetch::{NextBlock, PrefetchBuffers};
use scratch::Scratch;
pub use state::CudaState;
use weights::{CudaWeights, Mixer};

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
            prefetch,
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

/// `REDLITE_FUSED_ADD_NORM=0`: the residual add and the next norm as two launches.
fn fuse_add_norm() -> bool {
    static ON: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *ON.get_or_init(|| std::env::var("REDLITE_FUSED_ADD_NORM").as_deref() != Ok("0"))
}

impl Backend for CudaBackend {
    type Act = CudaAct;
    type State = CudaState;

    fn config(&self) -> &HybridConfig {
        &self.config
    }

    fn expert_cache_counts(&self) -> Result<Vec<ExpertCacheCounts>> {
        let caches = self.caches()?;
        let mut all = Vec::new();
        for (layer, cache) in caches.iter().enumerate() {
            if let Some(cache) = cache {
                let c = cache.counts(&self.device)?;
                if c.overflows > 0 {
                    return Err(EngineError::Cuda(format!(
                        "the expert cache of block {layer} overflowed {} times (a batch's experts did not fit its slots)",
                        c.overflows
                    )));
                }
                all.push(ExpertCacheCounts {
                    layer,
                    hits: c.hits,
                    misses: c.misses,
                    lookups: c.lookups,
                    bytes_per_miss: cache.expert_bytes(),
                    wait_ns: c.wait_ns,
                    prefetched: c.prefetched,
                    prefetch_hits: c.prefetch_hits,
                });
            }
        }
        Ok(all)
    }

    /// Also sizes the scratch buffers for `max_tokens` (a failure there is reported by the
    /// first op).
    fn new_act(&self, max_tokens: usize, width: usize) -> CudaAct {
        drop(self.scratch(max_tokens));
        CudaAct::new(&self.device, max_tokens, width, keeps_codes(self.dots))
    }

    fn new_state(&self, capacity: usize, kv_type: KvType) -> CudaState {
        CudaState::new(
            self.device.clone(),
            self.graphs.clone(),
            &self.config,
            capacity,
            kv_type,
        )
    }

    fn embed(&self, tokens: &[u32], x: &mut CudaAct) -> Result<()> {
        let n_vocab = self.weights.token_embd.rows;
        if let Some(&id) = tokens.iter().find(|&&id| id as usize >= n_vocab) {
            return Err(EngineError::BadToken { id, n_vocab });
        }
        let mut scratch = self.scratch(tokens.len())?;
        let mut graphs = graph::lock(&self.graphs)?;
        match self.graphable(tokens.len()) {
            true => graphs.arm(),
            false => graphs.abandon(),
        }
        drop(graphs);
        self.device.mark("embedding");
        let mut ids = scratch.token_ids.slice_mut(..tokens.len());
        self.device.copy_to_device(tokens, &mut ids)?;
        let mut out = x.rows_mut(tokens.len())?;
        redlite_cuda::embed(
            &self.device,
            &self.weights.token_embd.view(),
            &ids.as_view(),
            &mut out,
        )?;
        Ok(())
    }

    /// Into a buffer that keeps Q8_K codes (a batch of decode size), the rows are quantized
    /// too, for the q8 products that read them (`CudaAct::q8_range`).
    fn rms_norm(&self, norm: Norm, b: Batch, x: &CudaAct, out: &mut CudaAct) -> Result<()> {
        let buffers = [x.address(&self.device)?, out.address(&self.device)?, 0];
        if self.gate(Op::Norm(norm), b.tokens, buffers)? == Gate::Skip {
            // The graph that replays it writes the codes too (recorded by the same code).
            out.norm_writes(b.tokens);
            return Ok(());
        }
        self.device.mark("norms and residuals");
        let (x, w) = (x.rows(b.tokens)?, self.norm_weights(norm)?.as_view());
        let eps = self.config.rms_eps;
        match out.rows_mut_quantized(b.tokens)? {
            (mut out, Some(mut q8)) => {
                redlite_cuda::rms_norm_quantized(&self.device, &x, &w, &mut out, &mut q8, eps)?
            }
            (mut out, None) => redlite_cuda::rms_norm(&self.device, &x, &w, &mut out, eps)?,
        }
        Ok(())
    }

    /// One sequence at a time (the kernels take one state); each segment's rows are a view
    /// into the batch's activations.
    fn deltanet(
        &self,
        layer: usize,
        segs: &mut [Segment<'_, CudaState>],
        h: &CudaAct,
        out: &mut CudaAct,
    ) -> Result<()> {
        let Mixer::DeltaNet(w) = &self.weights.layer(layer)?.mixer else {
            return Err(self.not_a(layer, "a DeltaNet"));
        };
        let sequences = segs.len();
        for seg in segs.iter_mut() {
            let pos = seg.batch().pos0;
            let (delta, record) = seg
                .state
                .deltanet_recording(&self.device, layer, seg.tokens)?;
            // A recording step writes its rows' states too: it is another graph.
            let state = match &record {
                Some(rows) => self.device.address(&rows.recurrent),
                None => self.device.address(&delta.recurrent),
            };
            let buffers = [h.address(&self.device)?, out.address(&self.device)?, state];
            let at = (pos, sequences);
            if self.mixer_gate(Op::DeltaNet(layer), seg.tokens, buffers, at)? == Gate::Skip {
                continue;
            }
            let mut scratch = self.scratch(seg.tokens)?;
            let (first, last) = (seg.row0, seg.row0 + seg.tokens);
            deltanet::forward(
                &self.device,
                &self.config,
                w,
                &mut scratch,
                (&h.row_range(first, last)?, h.q8_range(first, last).as_ref()),
                delta,
                record,
                &mut out.row_range_mut(first, last)?,
            )?;
        }
        Ok(())
    }

    fn attention(
        &self,
        layer: usize,
        segs: &mut [Segment<'_, CudaState>],
        h: &CudaAct,
        out: &mut CudaAct,
    ) -> Result<()> {
        let Mixer::Attention(w) = &self.weights.layer(layer)?.mixer else {
            return Err(self.not_a(layer, "an attention"));
        };
        let sequences = segs.len();
        for seg in segs.iter_mut() {
            let b = seg.batch();
            let capacity = seg.state.capacity;
            let kv = seg.state.kv_mut(layer)?;
            let state = kv.address(&self.device);
            let buffers = [h.address(&self.device)?, out.address(&self.device)?, state];
            let at = (b.pos0, sequences);
            let gate = self.mixer_gate(Op::Attention(layer), seg.tokens, buffers, at)?;
            if gate == Gate::Skip {
                continue;
            }
            let mut scratch = self.scratch(seg.tokens)?;
            let graphs = graph::lock(&self.graphs)?;
            let position = match gate {
                Gate::Capture => Position::Device(&graphs.position()),
                _ => Position::Host,
            };
            let (first, last) = (seg.row0, seg.row0 + seg.tokens);
            attention::forward(
                &self.device,
                &self.config,
                w,
                &mut scratch,
                b,
                (&h.row_range(first, last)?, h.q8_range(first, last).as_ref()),
                kv,
                capacity,
                &mut out.row_range_mut(first, last)?,
                position,
            )?;
        }
        Ok(())
    }

    fn moe(&self, layer: usize, b: Batch, h: &CudaAct, out: &mut CudaAct) -> Result<()> {
        let buffers = [h.address(&self.device)?, out.address(&self.device)?, 0];
        if self.gate(Op::Moe(layer), b.tokens, buffers)? == Gate::Skip {
            return Ok(());
        }
        if self.residency == ExpertResidency::Cpu {
            let host = self.host_moe.as_ref().ok_or_else(|| {
                EngineError::BadConfig(
                    "experts on the CPU need the host weights (CudaBackend::with_host_experts)"
                        .into(),
                )
            })?;
            self.device.mark("routed + shared experts (on the CPU)");
            return host.forward(
                &self.device,
                &self.config,
                layer,
                b.tokens,
                &h.rows(b.tokens)?,
                &mut out.rows_mut(b.tokens)?,
            );
        }
        let mut scratch = self.scratch(b.tokens)?;
        let mut caches = self.caches()?;
        let mut buffers = self
            .prefetch
            .lock()
            .map_err(|_| EngineError::Cuda("prefetch lock poisoned by a panic".into()))?;
        let at = (layer, self.config.n_layer);
        let (cache, next) = prefetch::split_caches(&mut caches, at, buffers.is_some());
        let next = match (next, buffers.as_mut()) {
            (Some(cache), Some(buffers)) => {
                let w = &self.weights.layer(layer + 1)?.moe;
                Some((NextBlock::of(w, cache), buffers))
            }
            _ => None,
        };
        let skew = self.route_skew.map(|skew| LayerSkew { skew, layer });
        moe::forward(
            &self.device,
            &self.config,
            &self.weights.layer(layer)?.moe,
            (cache, skew),
            next,
            &mut scratch,
            (&h.rows(b.tokens)?, h.q8_range(0, b.tokens).as_ref()),
            &mut out.rows_mut(b.tokens)?,
        )
    }

    fn add(&self, b: Batch, x: &mut CudaAct, y: &CudaAct) -> Result<()> {
        let buffers = [x.address(&self.device)?, y.address(&self.device)?, 0];
        if self.gate(Op::Add, b.tokens, buffers)? == Gate::Skip {
            return Ok(());
        }
        self.device.mark("norms and residuals");
        redlite_cuda::add(&self.device, &mut x.rows_mut(b.tokens)?, &y.rows(b.tokens)?)?;
        Ok(())
    }

    fn add_rms_norm(
        &self,
        norm: Norm,
        b: Batch,
        x: &mut CudaAct,
        y: &CudaAct,
        out: &mut CudaAct,
    ) -> Result<()> {
        if !fuse_add_norm() {
            self.add(b, x, y)?;
            return self.rms_norm(norm, b, x, out);
        }
        let buffers = [
            x.address(&self.device)?,
            y.address(&self.device)?,
            out.address(&self.device)?,
        ];
        if self.gate(Op::AddNorm(norm), b.tokens, buffers)? == Gate::Skip {
            x.rows_mut(b.tokens)?;
            out.norm_writes(b.tokens);
            return Ok(());
        }
        self.device.mark("norms and residuals");
        let (mut x, y) = (x.rows_mut(b.tokens)?, y.rows(b.tokens)?);
        let (w, eps) = (self.norm_weights(norm)?.as_view(), self.config.rms_eps);
        match out.rows_mut_quantized(b.tokens)? {
            (mut out, Some(mut q8)) => redlite_cuda::add_rms_norm_quantized(
                &self.device,
                &mut x,
                &y,
                &w,
                &mut out,
                &mut q8,
                eps,
            )?,
            (mut out, None) => {
                redlite_cuda::add_rms_norm(&self.device, &mut x, &y, &w, &mut out, eps)?
            }
        }
        Ok(())
    }

    fn logits(&self, rows: &[usize], x: &CudaAct, out: &mut Vec<f32>) -> Result<()> {
        self.device.mark("LM head");
        self.head_logits(&self.weights.output, rows, x, out)
    }

    /// The batch's activations; empty if the copy fails (the trait returns no `Result`).
    fn to_host(&self, b: Batch, x: &CudaAct) -> Vec<f32> {
        let interrupted = graph::lock(&self.graphs).and_then(|mut g| g.interrupt());
        if interrupted.is_err() {
            return Vec::new();
        }
        let mut host = vec![0f32; b.tokens * x.width];
        match x.rows(b.tokens) {
            Ok(view) if self.device.copy_to_host(&view, &mut host).is_ok() => host,
            _ => Vec::new(),
        }
    }

    fn new_mtp_state(&self, capacity: usize, kv_type: KvType) -> Result<CudaState> {
        self.weights.mtp()?;
        Ok(CudaState::new_mtp(
            self.device.clone(),
            self.graphs.clone(),
            &self.config,
            capacity,
            kv_type,
        ))
    }

    fn mtp_input(
        &self,
        tokens: &[u32],
        hidden: &CudaAct,
        hidden_row0: usize,
        out: &mut CudaAct,
    ) -> Result<()> {
        let table = self.weights.mtp_embed()?;
        if let Some(&id) = tokens.iter().find(|&&id| id as usize >= table.rows) {
            return Err(EngineError::BadToken {
                id,
                n_vocab: table.rows,
            });
        }
        // Eager, like the trunk's embedding: the block's layer may then be recorded.
        let n = tokens.len();
        let mut graphs = graph::lock(&self.graphs)?;
        match self.graphable(n) {
            true => graphs.arm(),
            false => graphs.abandon(),
        }
        drop(graphs);
        let mut scratch = self.scratch(n)?;
        self.device.mark("MTP block");
        let mut ids = scratch.token_ids.slice_mut(..n);
        self.device.copy_to_device(tokens, &mut ids)?;
        let mut buffers = self
            .mtp_buffers
            .lock()
            .map_err(|_| EngineError::Cuda("MTP buffers lock poisoned by a panic".into()))?;
        mtp::input(
            &self.device,
            self.weights.mtp()?,
            table,
            self.config.rms_eps,
            &ids.as_view(),
            &hidden.row_range(hidden_row0, hidden_row0 + n)?,
            &mut out.rows_mut(n)?,
            &mut buffers,
        )
    }

    fn mtp_logits(&self, rows: &[usize], x: &CudaAct, out: &mut Vec<f32>) -> Result<()> {
        self.device.mark("MTP head");
        self.head_logits(self.weights.mtp_head()?, rows, x, out)
    }
}

impl CudaBackend {
    /// Logits of `rows` through `head`; runs of consecutive rows each take one product.
    fn head_logits(
        &self,
        head: &weights::DeviceMatrix,
        rows: &[usize],
        x: &CudaAct,
        out: &mut Vec<f32>,
    ) -> Result<()> {
        graph::lock(&self.graphs)?.interrupt()?;
        let vocab = head.rows;
        let mut i = 0;
        while i < rows.len() {
            let mut j = i + 1;
            while j < rows.len() && rows[j] == rows[j - 1] + 1 {
                j += 1;
            }
            let (first, n) = (rows[i], j - i);
            let mut scratch = self.scratch(first + n)?;
            scratch.reserve_logits(&self.device, &self.config, n)?;
            let mut logits = scratch.logits.slice_mut(..n * vocab);
            let rows = x.row_range(first, first + n)?;
            let q8 = x.q8_range(first, first + n);
            redlite_cuda::matmul_quantized(
                &self.device,
                &head.view(),
                (&rows, q8.as_ref()),
                &mut logits,
            )?;
            let start = out.len();
            out.resize(start + n * vocab, 0.0);
            self.device
                .copy_to_host(&logits.as_view(), &mut out[start..])?;
            i = j;
        }
        Ok(())
    }
}
