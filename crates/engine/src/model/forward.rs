//! The qwen3next forward pass, written once for every backend. Reads like the block
//! diagram: per layer, norm → mixer (DeltaNet or attention) → residual → norm → MoE →
//! residual; then the final norm and the LM head.

use crate::backend::{Backend, Batch, LmHead, Norm, Segment, SeqState};
use crate::error::{EngineError, Result};
use crate::model::config::LayerKind;
use crate::sampling::greedy_argmax;

/// Buffers of one forward call, allocated once for the largest batch and reused.
pub struct Workspace<B: Backend> {
    pub max_tokens: usize,
    /// Apply the final norm to every row even when no logits are asked for, so `h` holds
    /// the trunk's output for the MTP block after each call (`Workspace::normed`).
    pub keep_normed: bool,
    pub(crate) x: B::Act,
    pub(crate) h: B::Act,
    pub(crate) mix: B::Act,
}

impl<B: Backend> Workspace<B> {
    pub fn new(backend: &B, max_tokens: usize) -> Workspace<B> {
        let e = backend.config().n_embd;
        Workspace {
            max_tokens,
            keep_normed: false,
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
    /// [`forward_greedy_into`] on a backend that picks the greedy tokens itself: the rows'
    /// tokens (then `logits` is empty).
    pub tokens: Vec<u32>,
    /// With `capture_hidden`: the residual stream after the embedding and after each layer,
    /// each `[tokens][n_embd]`.
    pub hidden: Vec<Vec<f32>>,
}

/// One sequence's part of a multi-sequence forward call.
pub struct SeqInput<'s, S> {
    pub state: &'s mut S,
    pub tokens: &'s [u32],
    pub logits: Logits,
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
    let mut output = Output::default();
    forward_into(
        backend,
        state,
        work,
        tokens,
        logits,
        capture_hidden,
        &mut output,
    )?;
    Ok(output)
}

/// [`forward`] into `output`, whose buffers are cleared and reused: once they have grown,
/// a decode step allocates nothing here.
pub fn forward_into<B: Backend>(
    backend: &B,
    state: &mut B::State,
    work: &mut Workspace<B>,
    tokens: &[u32],
    logits: Logits,
    capture_hidden: bool,
    output: &mut Output,
) -> Result<()> {
    let head = (logits, Picks::Logits);
    one_sequence(backend, (state, work, tokens), head, capture_hidden, output)
}

/// [`forward_into`] for greedy decoding: the most likely token of the rows `logits` asks
/// for, in `output.tokens` where the backend picks them itself (the CUDA backend, on the
/// device: no logits copied to the host), else their logits in `output.logits`
/// ([`Output::greedy_tokens`] reads either).
pub fn forward_greedy_into<B: Backend>(
    backend: &B,
    state: &mut B::State,
    work: &mut Workspace<B>,
    tokens: &[u32],
    logits: Logits,
    output: &mut Output,
) -> Result<()> {
    let head = (logits, Picks::Greedy);
    one_sequence(backend, (state, work, tokens), head, false, output)
}

/// [`forward_greedy_into`] whose greedy tokens stay on the device, in the backend's next
/// pick slots ([`Backend::keep_greedy_tokens`]; an error where it keeps none): a chained
/// greedy step reads them with the rest of its picks.
pub fn forward_kept<B: Backend>(
    backend: &B,
    state: &mut B::State,
    work: &mut Workspace<B>,
    tokens: &[u32],
    logits: Logits,
) -> Result<()> {
    let head = (logits, Picks::Kept);
    one_sequence(
        backend,
        (state, work, tokens),
        head,
        false,
        &mut Output::default(),
    )
}

/// What the LM head gives for the rows asked for.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Picks {
    /// Their logits.
    Logits,
    /// Their greedy tokens where the backend picks them itself, else their logits.
    Greedy,
    /// Their greedy tokens, kept on the device.
    Kept,
}

/// `f` on the rows of `n` that `logits` asks for (no allocation for the last row alone).
fn with_rows<R>(logits: Logits, n: usize, f: impl FnOnce(&[usize]) -> R) -> R {
    match logits {
        Logits::None => f(&[]),
        Logits::Last => f(&[n.saturating_sub(1)]),
        Logits::All => f(&(0..n).collect::<Vec<_>>()),
    }
}

impl Output {
    /// The greedy token of each row of a [`forward_greedy_into`] call, into `out`: the
    /// backend's picks, or the host's from the logits (`vocab` a row).
    pub fn greedy_tokens(&self, vocab: usize, out: &mut Vec<u32>) -> Result<()> {
        out.clear();
        if !self.tokens.is_empty() {
            out.extend_from_slice(&self.tokens);
            return Ok(());
        }
        for row in self.logits.chunks(vocab.max(1)) {
            out.push(greedy_argmax(row)?);
        }
        Ok(())
    }
}

/// One sequence's forward call (see [`run`]): `head` says which rows' logits and what of
/// them.
fn one_sequence<B: Backend>(
    backend: &B,
    (state, work, tokens): (&mut B::State, &mut Workspace<B>, &[u32]),
    (logits, picks): (Logits, Picks),
    capture_hidden: bool,
    output: &mut Output,
) -> Result<()> {
    let n = tokens.len();
    check_batch(work, n)?;
    state.check_room(n)?;
    let b = Batch {
        tokens: n,
        pos0: state.pos(),
    };
    let mut segs = [Segment {
        row0: 0,
        tokens: n,
        state,
    }];
    with_rows(logits, n, |rows| {
        run(
            backend,
            work,
            tokens,
            &mut segs,
            (rows, picks),
            b,
            capture_hidden,
            output,
        )
    })
}

/// Refuses an empty batch or one larger than the workspace.
fn check_batch<B: Backend>(work: &Workspace<B>, total: usize) -> Result<()> {
    if total == 0 {
        return Err(EngineError::BadConfig("no tokens to process".into()));
    }
    if total > work.max_tokens {
        return Err(EngineError::BadConfig(format!(
            "a batch of {total} tokens exceeds the workspace of {}",
            work.max_tokens
        )));
    }
    Ok(())
}

/// Runs several sequences in one forward call: their rows are stacked (in order) so every
/// weight is read once for all of them, while each mixer step uses its own sequence's state.
/// Logits come back in sequence order, each sequence's rows as its `Logits` asks.
/// A row's result does not depend on the other rows of the batch.
pub fn forward_batch<B: Backend>(
    backend: &B,
    work: &mut Workspace<B>,
    seqs: &mut [SeqInput<'_, B::State>],
    capture_hidden: bool,
) -> Result<Output> {
    let total: usize = seqs.iter().map(|s| s.tokens.len()).sum();
    if seqs.iter().any(|s| s.tokens.is_empty()) {
        return Err(EngineError::BadConfig("no tokens to process".into()));
    }
    check_batch(work, total)?;
    let mut ids = Vec::with_capacity(total);
    let mut logit_rows = Vec::new();
    let mut segs = Vec::with_capacity(seqs.len());
    for seq in seqs.iter_mut() {
        seq.state.check_room(seq.tokens.len())?;
        let row0 = ids.len();
        ids.extend_from_slice(seq.tokens);
        let n = seq.tokens.len();
        match seq.logits {
            Logits::None => {}
            Logits::Last => logit_rows.push(row0 + n - 1),
            Logits::All => logit_rows.extend(row0..row0 + n),
        }
        segs.push(Segment {
            row0,
            tokens: n,
            state: &mut *seq.state,
        });
    }
    let b = Batch {
        tokens: total,
        pos0: if segs.len() == 1 {
            segs[0].state.pos()
        } else {
            0
        },
    };
    let mut output = Output::default();
    run(
        backend,
        work,
        &ids,
        &mut segs,
        (&logit_rows, Picks::Logits),
        b,
        capture_hidden,
        &mut output,
    )?;
    Ok(output)
}

/// The layers, the final norm and what `picks` asks of the LM head for `logit_rows`, into
/// `output` (cleared first). Every segment's state advances by its tokens.
#[allow(clippy::too_many_arguments)]
fn run<B: Backend>(
    backend: &B,
    work: &mut Workspace<B>,
    ids: &[u32],
    segs: &mut [Segment<'_, B::State>],
    (logit_rows, picks): (&[usize], Picks),
    b: Batch,
    capture_hidden: bool,
    output: &mut Output,
) -> Result<()> {
    output.logits.clear();
    output.tokens.clear();
    output.hidden.clear();
    let keep_normed = work.keep_normed;
    let Workspace { x, h, mix, .. } = work;
    backend.embed(ids, x)?;
    if capture_hidden {
        output.hidden.push(backend.to_host(b, x));
    }
    let layers = &backend.config().layers;
    if !layers.is_empty() {
        backend.rms_norm(Norm::Attn(0), b, x, h)?;
    }
    for (layer, kind) in layers.iter().enumerate() {
        match kind {
            LayerKind::DeltaNet => backend.deltanet(layer, segs, h, mix)?,
            LayerKind::Attention => backend.attention(layer, segs, h, mix)?,
        }
        backend.add_rms_norm(Norm::Post(layer), b, x, mix, h)?;
        backend.moe(layer, b, h, mix)?;
        // The residual add, fused with the next layer's input norm.
        if layer + 1 < layers.len() {
            backend.add_rms_norm(Norm::Attn(layer + 1), b, x, mix, h)?;
        } else {
            backend.add(b, x, mix)?;
        }
        if capture_hidden {
            output.hidden.push(backend.to_host(b, x));
        }
    }
    for seg in segs.iter_mut() {
        let pos = seg.state.pos();
        seg.state.set_pos(pos + seg.tokens);
    }
    if logit_rows.is_empty() && !keep_normed {
        return Ok(());
    }
    backend.rms_norm(Norm::Output, b, x, h)?;
    if logit_rows.is_empty() {
        return Ok(());
    }
    match picks {
        Picks::Kept => backend.keep_greedy_tokens(LmHead::Trunk, logit_rows, h),
        Picks::Greedy if backend.greedy_tokens(logit_rows, h, &mut output.tokens)? => Ok(()),
        Picks::Greedy | Picks::Logits => backend.logits(logit_rows, h, &mut output.logits),
    }
}
