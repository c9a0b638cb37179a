//! The backend interface: the few coarse operations the qwen3next forward pass needs.
//! The model (`model::forward`) is written once against it; each backend (CPU now, CUDA
//! later) implements them with its own buffers, weights and per-sequence state.

pub mod cpu;
#[cfg(feature = "cuda")]
pub mod cuda;
mod kept;

use std::ops::Range;

use crate::error::{EngineError, Result};
use crate::model::config::HybridConfig;
use crate::state::KvType;

/// The tokens of one forward call: `tokens` consecutive positions starting at `pos0`.
/// Row-wise ops (norms, MoE, residual adds) read only `tokens`: their rows may belong to
/// several sequences.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Batch {
    pub tokens: usize,
    pub pos0: usize,
}

/// One sequence's rows in a batch that may hold several sequences (the server's continuous
/// batching): `tokens` consecutive rows from `row0`, at the positions that follow the
/// sequence's state. The mixers run their projections over every row at once and their
/// recurrence or attention per segment.
pub struct Segment<'s, S> {
    pub row0: usize,
    pub tokens: usize,
    pub state: &'s mut S,
}

impl<S: SeqState> Segment<'_, S> {
    /// The segment's tokens and positions.
    pub fn batch(&self) -> Batch {
        Batch {
            tokens: self.tokens,
            pos0: self.state.pos(),
        }
    }
}

/// Rows covered by consecutive segments.
pub fn segment_rows<S>(segs: &[Segment<'_, S>]) -> usize {
    segs.last().map_or(0, |s| s.row0 + s.tokens)
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
    /// The MTP block's `shared_head_norm`, before its LM head.
    MtpHead,
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
    /// What `restore` needs to bring the sequence back to this point: the DeltaNet state and
    /// the position. KV entries past the position are overwritten by later tokens, so the
    /// cache itself is not copied (restoring truncates it).
    type Snapshot;
    fn snapshot(&self) -> Result<Self::Snapshot>;
    /// Back to a snapshot of this same sequence state.
    fn restore(&mut self, snapshot: &Self::Snapshot) -> Result<()>;
    /// Speculative decoding: the next forward call records, per DeltaNet layer, the state
    /// after each of its rows but the last (in device memory on a GPU), so that
    /// `rollback_to` can keep any prefix of a verification batch without re-running it.
    fn checkpoint(&mut self) -> Result<()>;
    /// After a recorded call: back to the state after its first `kept` rows (1 to rows - 1);
    /// attention caches are truncated by the position.
    fn rollback_to(&mut self, kept: usize) -> Result<()>;
}

/// Counters of one MoE block's expert cache since the backend was made.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, serde::Serialize)]
pub struct ExpertCacheCounts {
    pub layer: usize,
    /// Chosen experts (distinct per MoE call) found on the GPU.
    pub hits: u64,
    /// Chosen experts copied in from host memory.
    pub misses: u64,
    /// MoE calls that looked experts up.
    pub lookups: u64,
    /// Bytes one miss copies.
    pub bytes_per_miss: u64,
    /// Nanoseconds the products of missing experts waited for their copies (the copies
    /// that computing the cached experts did not hide; one-token steps).
    pub wait_ns: u64,
    /// Experts brought in ahead by the prefetch, and the hits on them (each counted at its
    /// first use).
    pub prefetched: u64,
    pub prefetch_hits: u64,
}

/// Which LM head a greedy pick goes through.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum LmHead {
    /// The trunk's (`output`).
    Trunk,
    /// The MTP block's (the trunk's unless the file has `nextn.shared_head_head`).
    Mtp,
}

fn no_kept_picks() -> EngineError {
    EngineError::BadConfig("this backend keeps no greedy picks on its device".into())
}

pub trait Backend {
    /// Activations `[tokens][width]`, allocated once per workspace for the largest batch.
    type Act;
    type State: SeqState;

    fn config(&self) -> &HybridConfig;

    /// The expert cache's counters per cached block (waits for queued work); empty when
    /// every expert is resident (the default).
    fn expert_cache_counts(&self) -> Result<Vec<ExpertCacheCounts>> {
        Ok(Vec::new())
    }
    /// After a prompt: hands back to the system the memory its scratch buffers took, which
    /// decoding does not need (the CPU backend's are tens of MiB a layer).
    fn release_prompt_memory(&self) {}
    fn new_act(&self, max_tokens: usize, width: usize) -> Self::Act;
    fn new_state(&self, capacity: usize, kv_type: KvType) -> Self::State;

    /// `x[t] = token_embd[tokens[t]]`.
    fn embed(&self, tokens: &[u32], x: &mut Self::Act) -> Result<()>;
    fn rms_norm(&self, norm: Norm, b: Batch, x: &Self::Act, out: &mut Self::Act) -> Result<()>;
    /// A DeltaNet mixer: projections, conv, delta rule, gated norm, output projection, for
    /// the rows of every segment (consecutive, from row 0), each with its own state.
    fn deltanet(
        &self,
        layer: usize,
        segs: &mut [Segment<'_, Self::State>],
        h: &Self::Act,
        out: &mut Self::Act,
    ) -> Result<()>;
    /// A gated-attention mixer, reading and extending each segment's KV cache of the layer.
    fn attention(
        &self,
        layer: usize,
        segs: &mut [Segment<'_, Self::State>],
        h: &Self::Act,
        out: &mut Self::Act,
    ) -> Result<()>;
    /// Routed experts plus the gated shared expert.
    fn moe(&self, layer: usize, b: Batch, h: &Self::Act, out: &mut Self::Act) -> Result<()>;
    /// `x += y`.
    fn add(&self, b: Batch, x: &mut Self::Act, y: &Self::Act) -> Result<()>;
    /// `x += y`, then `out = rms_norm(x)`: the residual add and the next norm, which a
    /// backend may fuse (the same bits as the two calls).
    fn add_rms_norm(
        &self,
        norm: Norm,
        b: Batch,
        x: &mut Self::Act,
        y: &Self::Act,
        out: &mut Self::Act,
    ) -> Result<()> {
        self.add(b, x, y)?;
        self.rms_norm(norm, b, x, out)
    }
    /// LM-head logits of the given rows (ascending), appended to `out` (`[rows][vocab]`).
    fn logits(&self, rows: &[usize], x: &Self::Act, out: &mut Vec<f32>) -> Result<()>;
    /// The greedy token of each of `rows` (ascending; the largest finite logit, the lower id
    /// on ties; an error where none is finite), appended to `out`, where the backend picks
    /// them without handing the logits over; `false` (nothing appended): it does not, ask
    /// [`Backend::logits`].
    fn greedy_tokens(&self, rows: &[usize], x: &Self::Act, out: &mut Vec<u32>) -> Result<bool> {
        let _ = (rows, x, out);
        Ok(false)
    }
    /// The activations of a batch, copied to the host (per-layer parity checks).
    fn to_host(&self, b: Batch, x: &Self::Act) -> Vec<f32>;

    // The MTP block (spec §4), once the backend has loaded it. Its decoder layer is layer
    // `n_layer` for `rms_norm`, `attention` and `moe`, with its own state.

    /// A state holding only the MTP layer's KV cache.
    fn new_mtp_state(&self, capacity: usize, kv_type: KvType) -> Result<Self::State>;
    /// The MTP block's input: `out[t] = eh_proj · [enorm(embed(tokens[t])) ;
    /// hnorm(hidden[hidden_row0 + t])]` for every token (the embedding half first).
    fn mtp_input(
        &self,
        tokens: &[u32],
        hidden: &Self::Act,
        hidden_row0: usize,
        out: &mut Self::Act,
    ) -> Result<()>;
    /// Logits of the given rows through the MTP block's LM head (the trunk's unless the
    /// file has `nextn.shared_head_head`), appended to `out`.
    fn mtp_logits(&self, rows: &[usize], x: &Self::Act, out: &mut Vec<f32>) -> Result<()>;
    /// [`Backend::greedy_tokens`] through the MTP block's LM head.
    fn mtp_greedy_tokens(&self, rows: &[usize], x: &Self::Act, out: &mut Vec<u32>) -> Result<bool> {
        let _ = (rows, x, out);
        Ok(false)
    }

    // Chained greedy steps: an MTP step's drafts feed the next draft and the verification
    // on the device, and the host reads every pick of the step once, after the verification
    // (no host round trip between the step's forward calls). Backends that do not chain say
    // so in `keeps_greedy_tokens` and the session takes the picks one call at a time.

    /// Whether the backend keeps greedy picks on the device ([`Backend::keep_greedy_tokens`]).
    fn keeps_greedy_tokens(&self) -> bool {
        false
    }
    /// The greedy token of each of `rows` (ascending) through `head`, kept in the next pick
    /// slots on the device in row order; nothing comes to the host.
    fn keep_greedy_tokens(&self, head: LmHead, rows: &[usize], x: &Self::Act) -> Result<()> {
        let _ = (head, rows, x);
        Err(no_kept_picks())
    }
    /// The next embedding ([`Backend::embed`] or [`Backend::mtp_input`]) takes its tokens
    /// `at..at + picks.len()` from the kept pick slots `picks`, whatever ids it is given
    /// there.
    fn embed_kept(&self, at: usize, picks: Range<usize>) -> Result<()> {
        let _ = (at, picks);
        Err(no_kept_picks())
    }
    /// Every kept pick in slot order, read to the host (after the work queued before it),
    /// into `out`; the slots and a pending [`Backend::embed_kept`] are dropped, also when the
    /// read fails (an error where a row had no finite logit).
    fn take_kept_tokens(&self, out: &mut Vec<u32>) -> Result<()> {
        out.clear();
        Ok(())
    }

    /// The first `rows` rows of logits of the last LM head product (after the work queued
    /// before it), appended to `out`: a chained step's verification rows, whose picks were
    /// taken on the device, for a sampler that is not greedy. Backends that do not keep
    /// them (those that do not chain steps) refuse.
    fn last_head_logits(&self, rows: usize, out: &mut Vec<f32>) -> Result<()> {
        let _ = (rows, out);
        Err(no_kept_picks())
    }

    /// A chained greedy step about to run every forward call of `plan`, in order, on
    /// `states` (the trunk's, the MTP block's) and `acts` (both workspaces' buffers): a
    /// backend may record the whole step once and replay it (the CUDA backend: one graph for
    /// the drafts and the verification). [`Backend::end_step`] closes it before the picks
    /// are read, [`Backend::abort_step`] after a failure. By default nothing is recorded.
    fn begin_step(
        &self,
        plan: StepPlan,
        states: [&Self::State; 2],
        acts: [&Self::Act; 6],
    ) -> Result<()> {
        let _ = (plan, states, acts);
        Ok(())
    }
    /// The step begun by [`Backend::begin_step`] has queued all its work.
    fn end_step(&self) -> Result<()> {
        Ok(())
    }
    /// The step begun by [`Backend::begin_step`] failed half-way: nothing of it is kept.
    fn abort_step(&self) {}
}

/// One forward call of a chained greedy step: the host's ids of its embedding (stand-ins
/// where kept picks go) and its position in its state.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct StepForward {
    pub ids: Vec<u32>,
    pub pos: usize,
}

/// Every forward call of a chained greedy step, in order ([`Backend::begin_step`]): the MTP
/// block's catch-up and chained drafts, then the trunk's verification.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct StepPlan {
    pub forwards: Vec<StepForward>,
}
