//! The qwen3next forward pass, written once for every backend. Reads like the block
//! diagram: per layer, norm → mixer (DeltaNet or attention) → residual → norm → MoE →
//! residual; then the final norm and the LM head.

use crate::backend::{Backend, Batch, Norm, SeqState};
use crate::error::Result;
use crate::model::config::LayerKind;

/// Buffers of one forward call, allocated once for the largest batch and reused.
pub struct Workspace<B: Backend> {
    pub max_tokens: usize,
    x: B::Act,
    h: B::Act,
    mix: B::Act,
}

impl<B: Backend> Workspace<B> {
    pub fn new(backend: &B, max_tokens: usize) -> Workspace<B> {
        let e = backend.config().n_embd;
        Workspace {
            max_tokens,
            x: backend.new_act(max_tokens, e),
            h: backend.new_act(max_tokens, e),
            mix: backend.new_act(max_tokens, e),
        }
    }
}

/// Which logits a call returns.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Logits {
    /// None (prefill of a chunk that is not the last).
    None,
    /// The last position only.
    Last,
    /// Every position of the batch.
    All,
}

/// What a forward call produced.
#[derive(Debug, Default)]
pub struct Output {
    /// `[rows][vocab]` for the rows asked for.
    pub logits: Vec<f32>,
    /// With `capture_hidden`: the residual stream after the embedding and after each layer,
    /// each `[tokens][n_embd]`.
    pub hidden: Vec<Vec<f32>>,
}

/// Runs `tokens` (at most `work.max_tokens`) through the model at the state's position and
/// advances the state.
pub fn forward<B: Backend>(
    backend: &B,
    state: &mut B::State,
    work: &mut Workspace<B>,
    tokens: &[u32],
    logits: Logits,
    capture_hidden: bool,
) -> Result<Output> {
    debug_assert!(tokens.len() <= work.max_tokens && !tokens.is_empty());
    state.check_room(tokens.len())?;
    let b = Batch {
        tokens: tokens.len(),
        pos0: state.pos(),
    };
    let mut output = Output::default();
    let Workspace { x, h, mix, .. } = work;
    backend.embed(tokens, x)?;
    if capture_hidden {
        output.hidden.push(backend.to_host(b, x));
    }
    for (layer, kind) in backend.config().layers.iter().enumerate() {
        backend.rms_norm(Norm::Attn(layer), b, x, h)?;
        match kind {
            LayerKind::DeltaNet => backend.deltanet(layer, b, h, state, mix)?,
            LayerKind::Attention => backend.attention(layer, b, h, state, mix)?,
        }
        backend.add(b, x, mix)?;
        backend.rms_norm(Norm::Post(layer), b, x, h)?;
        backend.moe(layer, b, h, mix)?;
        backend.add(b, x, mix)?;
        if capture_hidden {
            output.hidden.push(backend.to_host(b, x));
        }
    }
    state.set_pos(b.pos0 + b.tokens);
    let first = match logits {
        Logits::None => return Ok(output),
        Logits::Last => b.tokens - 1,
        Logits::All => 0,
    };
    backend.rms_norm(Norm::Output, b, x, h)?;
    backend.logits(b, first, h, &mut output.logits)?;
    Ok(output)
}
