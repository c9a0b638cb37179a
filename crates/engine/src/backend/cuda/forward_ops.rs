//! The forward pass's ops of the [`Backend`] trait on the GPU: embedding, norms, the DeltaNet
//! and attention mixers, the MoE block (with its expert cache and prefetch), residual adds,
//! logits and the MTP block's input; each queues kernels (or is skipped when the decode
//! graph recorded it: `graph`).

use redlite_cuda::{CudaViewMut, Position};

use super::act::CudaAct;
use super::graph::{self, Gate, Op};
use super::head::{device_greedy, CHAINED_GREEDY};
use super::moe::{self, LayerSkew};
use super::prefetch::{self, NextBlock};
use super::state::CudaState;
use super::weights::{DeviceMatrix, Mixer};
use super::{attention, deltanet, keeps_codes, mtp, CudaBackend, ExpertResidency};
use crate::backend::{Backend, Batch, ExpertCacheCounts, LmHead, Norm, Segment, StepPlan};
use crate::error::{EngineError, Result};
use crate::model::config::HybridConfig;
use crate::state::KvType;

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
        let n = tokens.len();
        // Room for the batch first: the keys name the scratch buffers' generation. The guard
        // goes before a key is taken (`key` locks the scratch too).
        let mut scratch = self.scratch(n)?;
        self.overlap_for(n);
        if self.arm_for(n)? {
            drop(scratch);
            let buffers = [x.address(&self.device)?, 0, 0];
            return self.with_step_ids(Op::Embed, tokens, buffers, |ids, gate| {
                self.embed_ids(ids, gate, x)
            });
        }
        let mut ids = scratch.token_ids.slice_mut(..n);
        self.device.copy_to_device(tokens, &mut ids)?;
        self.embed_ids(&mut ids, Gate::Run, x)
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
                Some(rows) => self.device.address(rows.recurrent.first_buffer()),
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
            let slot = match gate {
                Gate::Capture => Some(graphs.position()?),
                _ => None,
            };
            let position = match &slot {
                Some(slot) => Position::Device(slot),
                None => Position::Host,
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
        self.moe_launches(layer, b, h, out)
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

    /// The LM head of `rows` and their argmaxes on the device: only the tokens come back
    /// (`REDLITE_DEVICE_GREEDY=0`: none, the caller picks from the logits).
    fn greedy_tokens(&self, rows: &[usize], x: &CudaAct, out: &mut Vec<u32>) -> Result<bool> {
        if !device_greedy() {
            return Ok(false);
        }
        self.read_picks(LmHead::Trunk, rows, x, out)?;
        Ok(true)
    }

    /// The batch's activations; empty if the copy fails (the trait returns no `Result`), or
    /// within a whole-step graph (whose replay has not run the step's ops at the walk's point).
    fn to_host(&self, b: Batch, x: &CudaAct) -> Vec<f32> {
        let interrupted = graph::lock(&self.graphs).and_then(|mut g| match g.step.in_step() {
            true => Err(EngineError::Cuda("host access within a step graph".into())),
            false => g.interrupt(),
        });
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
        // As `embed`: the scratch reserved before, and released before, the op's key.
        let mut scratch = self.scratch(n)?;
        self.overlap_for(n);
        let block = (table, hidden, hidden_row0);
        if self.arm_for(n)? {
            drop(scratch);
            let buffers = [
                hidden.address(&self.device)?,
                out.address(&self.device)?,
                hidden_row0 as u64,
            ];
            return self.with_step_ids(Op::MtpInput, tokens, buffers, |ids, gate| {
                self.mtp_input_ids(ids, gate, block, out)
            });
        }
        let mut ids = scratch.token_ids.slice_mut(..n);
        self.device.copy_to_device(tokens, &mut ids)?;
        self.mtp_input_ids(&mut ids, Gate::Run, block, out)
    }

    fn mtp_logits(&self, rows: &[usize], x: &CudaAct, out: &mut Vec<f32>) -> Result<()> {
        self.device.mark("MTP head");
        self.head_logits(self.weights.mtp_head()?, rows, x, out)
    }

    fn mtp_greedy_tokens(&self, rows: &[usize], x: &CudaAct, out: &mut Vec<u32>) -> Result<bool> {
        if !device_greedy() {
            return Ok(false);
        }
        self.read_picks(LmHead::Mtp, rows, x, out)?;
        Ok(true)
    }

    /// With the device argmax (unless `REDLITE_DEVICE_GREEDY=0`) unless `REDLITE_CHAINED_GREEDY=0`:
    /// `kept.rs`.
    fn keeps_greedy_tokens(&self) -> bool {
        device_greedy() && CHAINED_GREEDY.on()
    }

    fn keep_greedy_tokens(&self, head: LmHead, rows: &[usize], x: &CudaAct) -> Result<()> {
        self.keep_picks(head, rows, x)
    }

    fn embed_kept(&self, at: usize, picks: std::ops::Range<usize>) -> Result<()> {
        self.kept()?.embed_next(at, picks)
    }

    fn take_kept_tokens(&self, out: &mut Vec<u32>) -> Result<()> {
        out.clear();
        self.kept()?
            .take(&self.device, self.weights.output.rows, out)?;
        graph::lock(&self.graphs)?.step.clocks.picks_back();
        Ok(())
    }

    fn last_head_logits(&self, rows: usize, out: &mut Vec<f32>) -> Result<()> {
        CudaBackend::last_head_logits(self, rows, out)
    }

    fn begin_step(
        &self,
        plan: StepPlan,
        states: [&CudaState; 2],
        acts: [&CudaAct; 6],
    ) -> Result<()> {
        self.begin_step_graph(plan, states, acts)
    }

    fn end_step(&self) -> Result<()> {
        self.end_step_graph()
    }

    fn abort_step(&self) {
        self.abort_step_graph();
    }
}

impl CudaBackend {
    /// An embedding of `tokens` tokens begins a forward call: a one-token step (or a small
    /// batch) is armed for its graph, anything else drops a capture left open; `true` within
    /// a whole-step graph, whose ops then all ask its gate.
    fn arm_for(&self, tokens: usize) -> Result<bool> {
        let mut graphs = graph::lock(&self.graphs)?;
        match self.graphable(tokens) {
            true => graphs.arm(),
            false => graphs.abandon(),
        }
        let in_step = graphs.step.in_step();
        if !in_step {
            // A forward of its own (a plain step, a prompt) is not part of a step boundary.
            graphs.step.clocks.interrupt();
        }
        Ok(in_step)
    }

    /// Within a whole-step graph: the embedding op `op`'s gate and its ids, which are the
    /// step's inputs (uploaded as it began), handed to `embed`.
    fn with_step_ids(
        &self,
        op: Op,
        tokens: &[u32],
        buffers: [u64; 3],
        embed: impl FnOnce(&mut CudaViewMut<'_, u32>, Gate) -> Result<()>,
    ) -> Result<()> {
        let key = self.key(op, tokens.len(), buffers)?;
        let mut graphs = graph::lock(&self.graphs)?;
        let gate = graphs.gate(key)?;
        let mut ids = graphs.step.ids(tokens)?;
        embed(&mut ids, gate)
    }

    /// The trunk's embedding of the ids in `ids` (on the device; kept picks written over
    /// their stand-ins first), or its bookkeeping only where a replayed step graph does it.
    fn embed_ids(&self, ids: &mut CudaViewMut<'_, u32>, gate: Gate, x: &mut CudaAct) -> Result<()> {
        if !self.ids_with_picks(ids, gate, x, "embedding")? {
            return Ok(());
        }
        let mut out = x.rows_mut(ids.len())?;
        redlite_cuda::embed(
            &self.device,
            &self.weights.token_embd.view(),
            &ids.as_view(),
            &mut out,
        )?;
        Ok(())
    }

    /// The kept picks an embedding of `ids` into `out` takes, written over their stand-ins
    /// (`component` marks the launches); `false` where a replayed step graph does that and the
    /// embedding itself, only their bookkeeping done here.
    fn ids_with_picks(
        &self,
        ids: &mut CudaViewMut<'_, u32>,
        gate: Gate,
        out: &mut CudaAct,
        component: &'static str,
    ) -> Result<bool> {
        if gate == Gate::Skip {
            self.kept()?.substitute_recorded(ids.len())?;
            out.rows_mut(ids.len())?;
            return Ok(false);
        }
        self.device.mark(component);
        self.kept()?.substitute(&self.device, ids)?;
        Ok(true)
    }

    /// The MTP block's input of the ids in `ids` (as `embed_ids`).
    fn mtp_input_ids(
        &self,
        ids: &mut CudaViewMut<'_, u32>,
        gate: Gate,
        (table, hidden, hidden_row0): (&DeviceMatrix, &CudaAct, usize),
        out: &mut CudaAct,
    ) -> Result<()> {
        if !self.ids_with_picks(ids, gate, out, "MTP block")? {
            return Ok(());
        }
        let n = ids.len();
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
}

impl CudaBackend {
    /// The MoE block's launches (its gate passed).
    fn moe_launches(&self, layer: usize, b: Batch, h: &CudaAct, out: &mut CudaAct) -> Result<()> {
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
}
