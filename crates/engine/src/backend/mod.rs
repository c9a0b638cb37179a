//! The backend interface: the few coarse operations the qwen3next forward pass needs.
//! The model (`model::forward`) is written once against it; each backend (CPU now, CUDA
//! later) implements them with its own buffers, weights and per-sequence state.

pub mod cpu;
#[cfg(feature = "cuda")]
pub mod cuda;

use crate::error::Result;
use crate::model::config::HybridConfig;
use crate::state::KvType;

/// The tokens of one forward call: `tokens` consecutive positions starting at `pos0`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Batch {
    pub tokens: usize,
    pub pos0: usize,
}

/// Which RMSNorm weight to apply.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Norm {
    /// Before the mixer of a layer.
    Attn(usize),
    /// Before the MoE of a layer.
    Post(usize),
    /// Before the LM head.
    Output,
}

/// Per-sequence state as the forward pass sees it.
pub trait SeqState {
    /// The next token's position.
    fn pos(&self) -> usize;
    fn set_pos(&mut self, pos: usize);
    /// Refuses a batch that would overflow the cache.
    fn check_room(&self, tokens: usize) -> Result<()>;
    /// Back to an empty sequence.
    fn reset_state(&mut self);
}

pub trait Backend {
    /// Activations `[tokens][width]`, allocated once per workspace for the largest batch.
    type Act;
    type State: SeqState;

    fn config(&self) -> &HybridConfig;
    fn new_act(&self, max_tokens: usize, width: usize) -> Self::Act;
    fn new_state(&self, capacity: usize, kv_type: KvType) -> Self::State;

    /// `x[t] = token_embd[tokens[t]]`.
    fn embed(&self, tokens: &[u32], x: &mut Self::Act) -> Result<()>;
    fn rms_norm(&self, norm: Norm, b: Batch, x: &Self::Act, out: &mut Self::Act) -> Result<()>;
    /// A DeltaNet mixer: projections, conv, delta rule, gated norm, output projection.
    fn deltanet(
        &self,
        layer: usize,
        b: Batch,
        h: &Self::Act,
        state: &mut Self::State,
        out: &mut Self::Act,
    ) -> Result<()>;
    /// A gated-attention mixer, reading and extending the layer's KV cache.
    fn attention(
        &self,
        layer: usize,
        b: Batch,
        h: &Self::Act,
        state: &mut Self::State,
        out: &mut Self::Act,
    ) -> Result<()>;
    /// Routed experts plus the gated shared expert.
    fn moe(&self, layer: usize, b: Batch, h: &Self::Act, out: &mut Self::Act) -> Result<()>;
    /// `x += y`.
    fn add(&self, b: Batch, x: &mut Self::Act, y: &Self::Act) -> Result<()>;
    /// LM-head logits of batch rows `first..b.tokens`, appended to `out` (`[rows][vocab]`).
    fn logits(&self, b: Batch, first: usize, x: &Self::Act, out: &mut Vec<f32>) -> Result<()>;
    /// The activations of a batch, copied to the host (per-layer parity checks).
    fn to_host(&self, b: Batch, x: &Self::Act) -> Vec<f32>;
}
