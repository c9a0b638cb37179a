//! One sequence on one backend: prefill in chunks, decode token by token, reset, snapshot.

use crate::backend::{Backend, SeqState};
use crate::error::{EngineError, Result};
use crate::model::forward::{
    forward, forward_greedy_into, forward_into, Logits, Output, Workspace,
};
use crate::sampling::greedy_argmax;
use crate::state::KvType;

mod mtp;
pub use mtp::GreedyStep;
use mtp::MtpState;

/// Default prefill chunk (`--chunk`).
pub const DEFAULT_CHUNK: usize = 512;

/// Most tokens the MTP block drafts per step (`--draft`).
pub const MAX_DRAFT: usize = 3;

pub struct Session<B: Backend> {
    pub backend: B,
    pub state: B::State,
    work: Workspace<B>,
    chunk: usize,
    /// Positions of the KV cache, and its type (the MTP block's cache matches them).
    context: usize,
    kv_type: KvType,
    /// The MTP block's state, once `enable_mtp` was called.
    mtp: Option<MtpState<B>>,
    timings: MtpTimings,
    /// The last decode step's output, its buffer reused by the next step.
    last: Output,
}

/// Wall time of the parts of speculative steps. The GPU queues work: a part's kernels that
/// no copy waits for (the rollback's copies) finish during, and are counted in, the next
/// part that reads results (the next draft). A chained greedy step (`mtp_greedy_step` on a
/// backend that keeps its picks) reads nothing before its verification, so its drafts' GPU
/// time is counted in `verify_seconds`.
#[derive(Clone, Copy, Debug, Default, PartialEq, serde::Serialize)]
pub struct MtpTimings {
    /// Verification batches run.
    pub steps: usize,
    /// The MTP block: catching up on the trunk's rows and drafting (LM head included).
    pub draft_seconds: f64,
    /// The verification forward (all rows' logits), recording the DeltaNet state per row.
    pub verify_seconds: f64,
    /// Of which arming the recording.
    pub checkpoint_seconds: f64,
    /// Rolling back to the last kept row after a rejection.
    pub accept_seconds: f64,
}

impl<B: Backend> Session<B> {
    /// A session with a KV cache of `context` positions, prefilling `chunk` tokens at a time.
    pub fn new(backend: B, context: usize, kv_type: KvType, chunk: usize) -> Result<Session<B>> {
        if chunk == 0 {
            return Err(EngineError::BadConfig(
                "the prefill chunk must be at least 1 token".into(),
            ));
        }
        let state = backend.new_state(context, kv_type);
        let work = Workspace::new(&backend, chunk);
        Ok(Session {
            backend,
            state,
            work,
            chunk,
            context,
            kv_type,
            mtp: None,
            timings: MtpTimings::default(),
            last: Output::default(),
        })
    }

    /// The backend the session runs on.
    pub fn backend(&self) -> &B {
        &self.backend
    }

    pub fn n_vocab(&self) -> usize {
        self.backend.config().n_vocab
    }

    /// Back to an empty sequence (the cache keeps its size).
    pub fn reset(&mut self) {
        self.state.reset_state();
        if let Some(mtp) = self.mtp.as_mut() {
            mtp.reset();
        }
    }

    /// Tokens processed so far.
    pub fn pos(&self) -> usize {
        self.state.pos()
    }

    /// Feeds `tokens` in chunks; returns the logits of the last one (or of all with `all`),
    /// and with `capture_hidden` the per-layer residual stream of every chunk, concatenated.
    pub fn feed(&mut self, tokens: &[u32], all: bool, capture_hidden: bool) -> Result<Output> {
        if tokens.is_empty() {
            return Err(EngineError::BadConfig("no tokens to process".into()));
        }
        self.state.check_room(tokens.len())?;
        let mut total = Output::default();
        let n_chunks = tokens.len().div_ceil(self.chunk);
        for (i, piece) in tokens.chunks(self.chunk).enumerate() {
            let want = match (all, i + 1 == n_chunks) {
                (true, _) => Logits::All,
                (false, true) => Logits::Last,
                (false, false) => Logits::None,
            };
            self.mtp_catch_up(piece[0])?;
            let out = forward(
                &self.backend,
                &mut self.state,
                &mut self.work,
                piece,
                want,
                capture_hidden,
            )?;
            self.mtp_pending(piece);
            total.logits.extend_from_slice(&out.logits);
            if total.hidden.is_empty() {
                total.hidden = out.hidden;
            } else {
                for (acc, layer) in total.hidden.iter_mut().zip(out.hidden) {
                    acc.extend_from_slice(&layer);
                }
            }
        }
        if tokens.len() > 1 {
            self.backend.release_prompt_memory();
        }
        Ok(total)
    }

    /// Logits after one more token. The buffer is the session's, reused by the next step:
    /// a decode step allocates nothing once it has grown.
    pub fn step(&mut self, token: u32) -> Result<&[f32]> {
        self.mtp_catch_up(token)?;
        forward_into(
            &self.backend,
            &mut self.state,
            &mut self.work,
            &[token],
            Logits::Last,
            false,
            &mut self.last,
        )?;
        self.mtp_pending(&[token]);
        Ok(&self.last.logits)
    }

    /// The greedy token after one more token (what [`Session::step`]'s logits give to
    /// `sampling::greedy_argmax`): picked on the device where the backend can, so that a
    /// greedy step copies one id to the host instead of the vocabulary's logits.
    pub fn step_greedy(&mut self, token: u32) -> Result<u32> {
        self.mtp_catch_up(token)?;
        forward_greedy_into(
            &self.backend,
            &mut self.state,
            &mut self.work,
            &[token],
            Logits::Last,
            &mut self.last,
        )?;
        self.mtp_pending(&[token]);
        match self.last.tokens.first() {
            Some(&next) => Ok(next),
            None => Ok(greedy_argmax(&self.last.logits)?),
        }
    }
}

/// A session seen without its backend type: what the generation loop, the benchmarks and
/// the CLI need, so one code path drives any backend.
pub trait Runner {
    /// See [`Session::feed`].
    fn feed(&mut self, tokens: &[u32], all: bool, capture_hidden: bool) -> Result<Output>;
    /// Logits after one more token.
    fn step(&mut self, token: u32) -> Result<&[f32]>;
    /// See [`Session::step_greedy`].
    fn step_greedy(&mut self, token: u32) -> Result<u32>;
    /// Back to an empty sequence.
    fn reset(&mut self);
    /// Tokens processed so far.
    fn pos(&self) -> usize;
    /// Positions the context holds.
    fn capacity(&self) -> usize;
    fn n_vocab(&self) -> usize;
    /// See [`Session::enable_mtp`].
    fn enable_mtp(&mut self) -> Result<()>;
    fn mtp_enabled(&self) -> bool;
    /// See [`Session::disable_mtp`].
    fn disable_mtp(&mut self);
    /// See [`Session::mtp_draft`].
    fn mtp_draft(
        &mut self,
        next: u32,
        n: usize,
        pick: &mut dyn FnMut(&[f32]) -> Result<u32>,
    ) -> Result<Vec<u32>>;
    /// See [`Session::mtp_verify`].
    fn mtp_verify(&mut self, tokens: &[u32]) -> Result<Vec<f32>>;
    /// See [`Session::mtp_greedy_step`].
    fn mtp_greedy_step(&mut self, next: u32, n: usize) -> Result<GreedyStep>;
    /// See [`Session::mtp_argmax_step`].
    fn mtp_argmax_step(&mut self, next: u32, n: usize) -> Result<(Vec<u32>, Vec<f32>)>;
    /// See [`Session::mtp_accept`].
    fn mtp_accept(&mut self, accepted: usize) -> Result<()>;
    /// See [`Session::take_mtp_timings`].
    fn take_mtp_timings(&mut self) -> MtpTimings;
    /// See [`Backend::expert_cache_counts`].
    fn expert_cache_counts(&self) -> Result<Vec<crate::backend::ExpertCacheCounts>>;
}

impl<B: Backend> Runner for Session<B> {
    fn feed(&mut self, tokens: &[u32], all: bool, capture_hidden: bool) -> Result<Output> {
        Session::feed(self, tokens, all, capture_hidden)
    }
    fn step(&mut self, token: u32) -> Result<&[f32]> {
        Session::step(self, token)
    }
    fn step_greedy(&mut self, token: u32) -> Result<u32> {
        Session::step_greedy(self, token)
    }
    fn reset(&mut self) {
        Session::reset(self)
    }
    fn pos(&self) -> usize {
        Session::pos(self)
    }
    fn capacity(&self) -> usize {
        self.context
    }
    fn n_vocab(&self) -> usize {
        Session::n_vocab(self)
    }
    fn enable_mtp(&mut self) -> Result<()> {
        Session::enable_mtp(self)
    }
    fn mtp_enabled(&self) -> bool {
        Session::mtp_enabled(self)
    }
    fn disable_mtp(&mut self) {
        Session::disable_mtp(self)
    }
    fn mtp_draft(
        &mut self,
        next: u32,
        n: usize,
        pick: &mut dyn FnMut(&[f32]) -> Result<u32>,
    ) -> Result<Vec<u32>> {
        Session::mtp_draft(self, next, n, pick)
    }
    fn mtp_verify(&mut self, tokens: &[u32]) -> Result<Vec<f32>> {
        Session::mtp_verify(self, tokens)
    }
    fn mtp_greedy_step(&mut self, next: u32, n: usize) -> Result<GreedyStep> {
        Session::mtp_greedy_step(self, next, n)
    }
    fn mtp_argmax_step(&mut self, next: u32, n: usize) -> Result<(Vec<u32>, Vec<f32>)> {
        Session::mtp_argmax_step(self, next, n)
    }
    fn mtp_accept(&mut self, accepted: usize) -> Result<()> {
        Session::mtp_accept(self, accepted)
    }
    fn take_mtp_timings(&mut self) -> MtpTimings {
        Session::take_mtp_timings(self)
    }
    fn expert_cache_counts(&self) -> Result<Vec<crate::backend::ExpertCacheCounts>> {
        self.backend.expert_cache_counts()
    }
}
