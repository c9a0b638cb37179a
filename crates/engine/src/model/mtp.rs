//! The MTP block's forward pass (spec §4.2), written once for every backend:
//!
//! ```text
//! x = eh_proj · [enorm(embed(token)) ; hnorm(hidden)]     hidden: the trunk's final-normed
//! x = decoder layer n_layer (gated attention + MoE)        output, or the block's own
//! h = shared_head_norm(x);  logits = head · h              output h when chaining
//! ```
//!
//! Row `t` pairs the hidden state of position `p + t` with the token at position `p + t + 1`
//! and runs at position `p + t` of the block's own KV cache (vLLM's proposer uses the
//! target positions the same way). Its logits predict the token at `p + t + 2`. llama.cpp's
//! `draft-mtp` (the pinned sdist's `common/speculative.cpp`) runs the same pairs one position
//! later, which RoPE's relative positions make the same attention, and also puts the prompt's
//! first token, paired with a zero hidden row, at position 0 of the block's cache: its drafts
//! equal ours on a tiny file except right after the prompt (docs/MTP.md).

use crate::backend::{Backend, Batch, Norm, Segment, SeqState};
use crate::error::{EngineError, Result};
use crate::model::forward::Workspace;

/// Where the block's hidden input comes from.
pub enum Hidden<'a, A> {
    /// Rows of the trunk's workspace (its final-normed output), from `row0`.
    Trunk { act: &'a A, row0: usize },
    /// The block's own last output (`h` of its workspace) at `row`: chaining a draft.
    Own { row: usize },
}

/// Runs the MTP block over `tokens` at the state's position and advances it; leaves the
/// normed output in the workspace (`Hidden::Own` reads it). Returns the logits of the last
/// row when `logits` is true (else an empty vector).
pub fn forward_mtp<B: Backend>(
    backend: &B,
    state: &mut B::State,
    work: &mut Workspace<B>,
    tokens: &[u32],
    hidden: Hidden<'_, B::Act>,
    logits: bool,
) -> Result<Vec<f32>> {
    let n = tokens.len();
    if n == 0 || n > work.max_tokens {
        return Err(EngineError::BadConfig(format!(
            "MTP block: {n} rows for a workspace of {}",
            work.max_tokens
        )));
    }
    state.check_room(n)?;
    let layer = backend.config().n_layer;
    let Workspace { x, h, mix, .. } = work;
    match hidden {
        Hidden::Trunk { act, row0 } => backend.mtp_input(tokens, act, row0, x)?,
        Hidden::Own { row } => backend.mtp_input(tokens, h, row, x)?,
    }
    let pos = state.pos();
    let b = Batch {
        tokens: n,
        pos0: pos,
    };
    backend.rms_norm(Norm::Attn(layer), b, x, h)?;
    let mut segs = [Segment {
        row0: 0,
        tokens: n,
        state: &mut *state,
    }];
    backend.attention(layer, &mut segs, h, mix)?;
    backend.add_rms_norm(Norm::Post(layer), b, x, mix, h)?;
    backend.moe(layer, b, h, mix)?;
    state.set_pos(pos + n);
    backend.add_rms_norm(Norm::MtpHead, b, x, mix, h)?;
    let mut out = Vec::new();
    if logits {
        backend.mtp_logits(&[n - 1], h, &mut out)?;
    }
    Ok(out)
}
