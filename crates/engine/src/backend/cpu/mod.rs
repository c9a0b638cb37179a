//! The CPU backend: the reference every faster backend is checked against.

mod attention;
pub mod delta_rule;
mod deltanet;
mod kept;
pub mod linear;
pub(crate) mod moe;
mod moe_decode;
mod one_token;
pub mod ops;
mod pool;
mod scratch;
pub mod weights;

use std::ops::Range;
use std::sync::{Arc, Mutex};

use arrayvec::ArrayVec;

use redlite_gguf::GgufModel;

use crate::backend::{segment_rows, Backend, Batch, LmHead, Norm, Segment, SeqState, StepPlan};
use crate::error::{EngineError, Result};
use crate::model::config::HybridConfig;
use crate::state::{KvCache, KvType, SequenceState, Snapshot};
use linear::{MatmulCtx, Precision};
use weights::{CpuWeights, Matrix, Mixer};

pub struct CpuBackend {
    config: HybridConfig,
    weights: CpuWeights,
    precision: Precision,
    /// Chained greedy steps: the picks kept (`kept.rs`).
    kept: Mutex<kept::KeptPicks>,
}

impl CpuBackend {
    /// A backend with the precision `REDLITE_CPU_EXACT` selects (ggml-style by default).
    pub fn new(gguf: Arc<GgufModel>, config: HybridConfig) -> Result<CpuBackend> {
        CpuBackend::with_precision(gguf, config, Precision::from_env())
    }

    pub fn with_precision(
        gguf: Arc<GgufModel>,
        config: HybridConfig,
        precision: Precision,
    ) -> Result<CpuBackend> {
        let weights = CpuWeights::load(gguf, &config)?;
        Ok(CpuBackend {
            config,
            weights,
            precision,
            kept: Mutex::default(),
        })
    }

    /// Loads the MTP block (spec §4) next to the main stack; refused when the file has none.
    pub fn load_mtp(&mut self) -> Result<()> {
        self.weights.load_mtp(&self.config)
    }

    fn mm(&self) -> MatmulCtx<'_> {
        MatmulCtx {
            gguf: &self.weights.gguf,
            precision: self.precision,
        }
    }
}

impl SeqState for SequenceState {
    fn pos(&self) -> usize {
        self.pos
    }
    fn set_pos(&mut self, pos: usize) {
        self.advance_to(pos);
    }
    fn check_room(&self, tokens: usize) -> Result<()> {
        SequenceState::check_room(self, tokens)
    }
    fn reset_state(&mut self) {
        self.reset();
    }
    type Snapshot = Snapshot;
    fn snapshot(&self) -> Result<Snapshot> {
        Ok(SequenceState::snapshot(self))
    }
    fn restore(&mut self, snapshot: &Snapshot) -> Result<()> {
        SequenceState::restore(self, snapshot);
        Ok(())
    }
    fn checkpoint(&mut self) -> Result<()> {
        SequenceState::checkpoint(self);
        Ok(())
    }
    fn rollback_to(&mut self, kept: usize) -> Result<()> {
        SequenceState::rollback_to(self, kept)
    }
}

impl Backend for CpuBackend {
    type Act = Vec<f32>;
    type State = SequenceState;

    fn config(&self) -> &HybridConfig {
        &self.config
    }

    fn release_prompt_memory(&self) {
        scratch::return_free_memory();
    }

    fn new_act(&self, max_tokens: usize, width: usize) -> Vec<f32> {
        vec![0.0; max_tokens * width]
    }

    fn new_state(&self, capacity: usize, kv_type: KvType) -> SequenceState {
        SequenceState::new(&self.config, capacity, kv_type)
    }

    fn embed(&self, tokens: &[u32], x: &mut Vec<f32>) -> Result<()> {
        let mut buf = Vec::new();
        let mut kept = self.kept()?;
        kept.check_planned(tokens)?;
        let tokens = kept.substitute(tokens, &mut buf)?;
        drop(kept);
        self.embed_with(&self.weights.model.token_embd, tokens, x)
    }

    fn rms_norm(&self, norm: Norm, b: Batch, x: &Vec<f32>, out: &mut Vec<f32>) -> Result<()> {
        let w = match norm {
            Norm::Attn(l) => &self.weights.model.layer(l)?.attn_norm,
            Norm::Post(l) => &self.weights.model.layer(l)?.post_norm,
            Norm::Output => &self.weights.model.output_norm,
            Norm::MtpHead => &self.weights.model.mtp()?.head_norm,
        };
        let e = w.len();
        for t in 0..b.tokens {
            ops::rms_norm(
                &x[t * e..(t + 1) * e],
                w,
                self.config.rms_eps,
                &mut out[t * e..(t + 1) * e],
            );
        }
        Ok(())
    }

    fn deltanet(
        &self,
        layer: usize,
        segs: &mut [Segment<'_, SequenceState>],
        h: &Vec<f32>,
        out: &mut Vec<f32>,
    ) -> Result<()> {
        let Mixer::DeltaNet(w) = &self.weights.model.layer(layer)?.mixer else {
            return Err(EngineError::BadConfig(format!(
                "layer {layer} is not a DeltaNet layer"
            )));
        };
        let rows = segment_rows(segs) * self.config.n_embd;
        let states = segs.iter_mut().map(|s| {
            let (state, record) = s.state.deltanet_recording(layer);
            deltanet::SeqRows {
                tokens: s.tokens,
                state,
                record,
            }
        });
        let mut one: ArrayVec<deltanet::SeqRows<'_>, 1> = ArrayVec::new();
        let mut many = Vec::new();
        let states = collect_without_allocating_one(states, &mut one, &mut many);
        deltanet::forward(
            &self.config,
            &self.mm(),
            w,
            &h[..rows],
            states,
            &mut out[..rows],
        )
    }

    fn attention(
        &self,
        layer: usize,
        segs: &mut [Segment<'_, SequenceState>],
        h: &Vec<f32>,
        out: &mut Vec<f32>,
    ) -> Result<()> {
        let Mixer::Attention(w) = &self.weights.model.layer(layer)?.mixer else {
            return Err(EngineError::BadConfig(format!(
                "layer {layer} is not an attention layer"
            )));
        };
        let rows = segment_rows(segs) * self.config.n_embd;
        let caches = segs.iter_mut().map(|s| (s.batch(), s.state.kv_mut(layer)));
        let mut one: ArrayVec<(Batch, &mut KvCache), 1> = ArrayVec::new();
        let mut many = Vec::new();
        let caches = collect_without_allocating_one(caches, &mut one, &mut many);
        attention::forward(
            &self.config,
            &self.mm(),
            w,
            &h[..rows],
            caches,
            &mut out[..rows],
        )
    }

    fn moe(&self, layer: usize, b: Batch, h: &Vec<f32>, out: &mut Vec<f32>) -> Result<()> {
        let e = self.config.n_embd;
        moe::forward(
            &self.config,
            &self.mm(),
            &self.weights.model.layer(layer)?.moe,
            &h[..b.tokens * e],
            b.tokens,
            &mut out[..b.tokens * e],
        )
    }

    fn add(&self, b: Batch, x: &mut Vec<f32>, y: &Vec<f32>) -> Result<()> {
        let n = b.tokens * self.config.n_embd;
        x[..n].iter_mut().zip(&y[..n]).for_each(|(a, b)| *a += b);
        Ok(())
    }

    fn logits(&self, rows: &[usize], x: &Vec<f32>, out: &mut Vec<f32>) -> Result<()> {
        self.head_logits(&self.weights.model.output, rows, x, out)
    }

    fn to_host(&self, b: Batch, x: &Vec<f32>) -> Vec<f32> {
        x[..b.tokens * self.config.n_embd].to_vec()
    }

    fn new_mtp_state(&self, capacity: usize, kv_type: KvType) -> Result<SequenceState> {
        self.weights.model.mtp()?;
        Ok(SequenceState::new_mtp(&self.config, capacity, kv_type))
    }

    fn mtp_input(
        &self,
        tokens: &[u32],
        hidden: &Vec<f32>,
        hidden_row0: usize,
        out: &mut Vec<f32>,
    ) -> Result<()> {
        let mtp = self.weights.model.mtp()?;
        let e = self.config.n_embd;
        let n = tokens.len();
        if (hidden_row0 + n) * e > hidden.len() || n * e > out.len() {
            return Err(EngineError::BadConfig(format!(
                "MTP input: {n} rows from row {hidden_row0} exceed the activation buffers"
            )));
        }
        let mut buf = Vec::new();
        let mut kept = self.kept()?;
        kept.check_planned(tokens)?;
        let tokens = kept.substitute(tokens, &mut buf)?;
        drop(kept);
        let mut embedded = vec![0f32; n * e];
        self.embed_with(self.weights.model.mtp_embed()?, tokens, &mut embedded)?;
        let mut concat = vec![0f32; n * 2 * e];
        for (t, row) in concat.chunks_exact_mut(2 * e).enumerate() {
            let (left, right) = row.split_at_mut(e);
            let eps = self.config.rms_eps;
            ops::rms_norm(&embedded[t * e..(t + 1) * e], &mtp.enorm, eps, left);
            let h = &hidden[(hidden_row0 + t) * e..(hidden_row0 + t + 1) * e];
            ops::rms_norm(h, &mtp.hnorm, eps, right);
        }
        linear::matmul(&self.mm(), &mtp.eh_proj, &concat, n, &mut out[..n * e])
    }

    fn mtp_logits(&self, rows: &[usize], x: &Vec<f32>, out: &mut Vec<f32>) -> Result<()> {
        self.head_logits(self.weights.model.mtp_head()?, rows, x, out)
    }

    /// Always (`kept.rs` says why).
    fn keeps_greedy_tokens(&self) -> bool {
        true
    }

    fn keep_greedy_tokens(&self, head: LmHead, rows: &[usize], x: &Vec<f32>) -> Result<()> {
        self.keep_picks(head, rows, x)
    }

    fn embed_kept(&self, at: usize, picks: Range<usize>) -> Result<()> {
        self.kept()?.embed_next(at, picks)
    }

    fn take_kept_tokens(&self, out: &mut Vec<u32>) -> Result<()> {
        out.clear();
        self.kept()?.take(out);
        Ok(())
    }

    fn last_head_logits(&self, rows: usize, out: &mut Vec<f32>) -> Result<()> {
        CpuBackend::last_head_logits(self, rows, out)
    }

    /// Nothing is recorded on the CPU; the plan is checked against the step's embeddings
    /// (`kept.rs`).
    fn begin_step(
        &self,
        plan: StepPlan,
        _states: [&SequenceState; 2],
        _acts: [&Vec<f32>; 6],
    ) -> Result<()> {
        self.kept()?.begin_plan(plan);
        Ok(())
    }

    fn end_step(&self) -> Result<()> {
        self.kept()?.end_plan()
    }

    fn abort_step(&self) {
        if let Ok(mut kept) = self.kept() {
            kept.drop_plan();
        }
    }
}

/// The items of `items` as a slice: in `one` when there is a single item (a decode step's
/// one sequence, no allocation), else in `many`.
fn collect_without_allocating_one<'a, T>(
    items: impl ExactSizeIterator<Item = T>,
    one: &'a mut ArrayVec<T, 1>,
    many: &'a mut Vec<T>,
) -> &'a mut [T] {
    if items.len() == 1 {
        one.extend(items);
        one
    } else {
        many.extend(items);
        many
    }
}

impl CpuBackend {
    /// `x[t] = table[tokens[t]]`.
    fn embed_with(&self, table: &Matrix, tokens: &[u32], x: &mut [f32]) -> Result<()> {
        let e = self.config.n_embd;
        for (t, &id) in tokens.iter().enumerate() {
            if id as usize >= table.rows {
                return Err(EngineError::BadToken {
                    id,
                    n_vocab: table.rows,
                });
            }
            let row = &self.weights.gguf.data(table.loc)[id as usize * table.row_bytes..]
                [..table.row_bytes];
            redlite_quant::dequantize_row(table.ty, row, &mut x[t * e..(t + 1) * e])?;
        }
        Ok(())
    }

    /// LM-head logits of `rows` of `x` through `head`, appended to `out`.
    fn head_logits(
        &self,
        head: &Matrix,
        rows: &[usize],
        x: &[f32],
        out: &mut Vec<f32>,
    ) -> Result<()> {
        let e = self.config.n_embd;
        let vocab = head.rows;
        let start = out.len();
        out.resize(start + rows.len() * vocab, 0.0);
        // Consecutive rows are multiplied straight from the activations; others are
        // gathered first.
        let contiguous = rows.windows(2).all(|p| p[1] == p[0] + 1);
        let gathered;
        let input = match rows.first() {
            Some(&first) if contiguous => &x[first * e..(first + rows.len()) * e],
            _ => {
                gathered = rows
                    .iter()
                    .flat_map(|&r| x[r * e..(r + 1) * e].iter().copied())
                    .collect::<Vec<f32>>();
                &gathered[..]
            }
        };
        linear::matmul(&self.mm(), head, input, rows.len(), &mut out[start..])
    }
}
