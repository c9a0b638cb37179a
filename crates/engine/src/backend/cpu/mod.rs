//! The CPU backend: the reference every faster backend is checked against.

mod attention;
pub mod delta_rule;
mod deltanet;
pub mod linear;
mod moe;
pub mod ops;
mod pool;
pub mod weights;

use std::sync::Arc;

use redlite_gguf::GgufModel;

use crate::backend::{segment_rows, Backend, Batch, Norm, Segment, SeqState};
use crate::error::{EngineError, Result};
use crate::model::config::HybridConfig;
use crate::state::{DeltaNetState, KvCache, KvType, SequenceState, Snapshot};
use linear::{MatmulCtx, Precision};
use weights::{CpuWeights, Mixer};

pub struct CpuBackend {
    config: HybridConfig,
    weights: CpuWeights,
    precision: Precision,
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
        })
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
        self.pos = pos;
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
}

impl Backend for CpuBackend {
    type Act = Vec<f32>;
    type State = SequenceState;

    fn config(&self) -> &HybridConfig {
        &self.config
    }

    fn new_act(&self, max_tokens: usize, width: usize) -> Vec<f32> {
        vec![0.0; max_tokens * width]
    }

    fn new_state(&self, capacity: usize, kv_type: KvType) -> SequenceState {
        SequenceState::new(&self.config, capacity, kv_type)
    }

    fn embed(&self, tokens: &[u32], x: &mut Vec<f32>) -> Result<()> {
        let e = self.config.n_embd;
        let w = &self.weights.model.token_embd;
        for (t, &id) in tokens.iter().enumerate() {
            if id as usize >= w.rows {
                return Err(EngineError::BadToken {
                    id,
                    n_vocab: w.rows,
                });
            }
            let row = &self.weights.gguf.data(w.loc)[id as usize * w.row_bytes..][..w.row_bytes];
            redlite_quant::dequantize_row(w.ty, row, &mut x[t * e..(t + 1) * e])?;
        }
        Ok(())
    }

    fn rms_norm(&self, norm: Norm, b: Batch, x: &Vec<f32>, out: &mut Vec<f32>) -> Result<()> {
        let w = match norm {
            Norm::Attn(l) => &self.weights.model.layers[l].attn_norm,
            Norm::Post(l) => &self.weights.model.layers[l].post_norm,
            Norm::Output => &self.weights.model.output_norm,
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
        let Mixer::DeltaNet(w) = &self.weights.model.layers[layer].mixer else {
            return Err(EngineError::BadConfig(format!(
                "layer {layer} is not a DeltaNet layer"
            )));
        };
        let rows = segment_rows(segs) * self.config.n_embd;
        let mut states: Vec<(usize, &mut DeltaNetState)> = segs
            .iter_mut()
            .map(|s| (s.tokens, s.state.deltanet_mut(layer)))
            .collect();
        deltanet::forward(
            &self.config,
            &self.mm(),
            w,
            &h[..rows],
            &mut states,
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
        let Mixer::Attention(w) = &self.weights.model.layers[layer].mixer else {
            return Err(EngineError::BadConfig(format!(
                "layer {layer} is not an attention layer"
            )));
        };
        let rows = segment_rows(segs) * self.config.n_embd;
        let mut caches: Vec<(Batch, &mut KvCache)> = segs
            .iter_mut()
            .map(|s| (s.batch(), s.state.kv_mut(layer)))
            .collect();
        attention::forward(
            &self.config,
            &self.mm(),
            w,
            &h[..rows],
            &mut caches,
            &mut out[..rows],
        )
    }

    fn moe(&self, layer: usize, b: Batch, h: &Vec<f32>, out: &mut Vec<f32>) -> Result<()> {
        let e = self.config.n_embd;
        moe::forward(
            &self.config,
            &self.mm(),
            &self.weights.model.layers[layer].moe,
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
        let e = self.config.n_embd;
        let vocab = self.weights.model.output.rows;
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
        linear::matmul(
            &self.mm(),
            &self.weights.model.output,
            input,
            rows.len(),
            &mut out[start..],
        )
    }

    fn to_host(&self, b: Batch, x: &Vec<f32>) -> Vec<f32> {
        x[..b.tokens * self.config.n_embd].to_vec()
    }
}
