//! One sequence on one backend: prefill in chunks, decode token by token, reset, snapshot.

use std::time::Instant;

use crate::backend::{Backend, SeqState};
use crate::error::{EngineError, Result};
use crate::model::forward::{
    forward, forward_greedy_into, forward_into, Logits, Output, Workspace,
};
use crate::model::mtp::{forward_mtp, Hidden};
use crate::sampling::greedy_argmax;
use crate::state::KvType;

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
/// part that reads results (the next draft).
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

/// The MTP block next to a session (speculative decoding). Invariant between calls: the
/// block has processed every position whose next token the session knows, except the last
/// `pending_rows` positions, whose trunk outputs are rows `0..pending_rows` of the
/// session's workspace (`h`, kept normed) and whose next tokens are `pending_next` (one
/// fewer: the last one's next token comes with the next call).
struct MtpState<B: Backend> {
    state: B::State,
    work: Workspace<B>,
    pending_rows: usize,
    pending_next: Vec<u32>,
    /// The verification batch recorded its rows (`accept` rolls back into it).
    checkpointed: bool,
    /// The verification batch (`[next, drafts...]`).
    verified: Vec<u32>,
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

    /// Turns on the MTP block (its weights must be loaded into the backend) for
    /// speculative decoding; the session must be empty.
    pub fn enable_mtp(&mut self) -> Result<()> {
        if self.mtp.is_some() {
            return Ok(());
        }
        if self.state.pos() != 0 {
            return Err(EngineError::BadConfig(
                "MTP must be enabled on an empty session".into(),
            ));
        }
        let state = self.backend.new_mtp_state(self.context, self.kv_type)?;
        // A verification batch is at most MAX_DRAFT + 1 rows, a prefill chunk `chunk` rows.
        let rows = self.chunk.max(MAX_DRAFT + 1);
        if rows > self.work.max_tokens {
            self.work = Workspace::new(&self.backend, rows);
        }
        self.work.keep_normed = true;
        self.mtp = Some(MtpState {
            state,
            work: Workspace::new(&self.backend, rows),
            pending_rows: 0,
            pending_next: Vec::new(),
            checkpointed: false,
            verified: Vec::new(),
        });
        Ok(())
    }

    pub fn mtp_enabled(&self) -> bool {
        self.mtp.is_some()
    }

    /// Drops the MTP block's state: plain decoding without its cost (benchmark baselines).
    /// `enable_mtp` on an empty session brings it back.
    pub fn disable_mtp(&mut self) {
        self.mtp = None;
        self.work.keep_normed = false;
    }

    /// Pairs the pending trunk rows with their next tokens (the last one `next`) and runs
    /// the MTP block over them (its normed output in its workspace); returns the rows run
    /// (0 when nothing was pending).
    fn mtp_catch_up(&mut self, next: u32) -> Result<usize> {
        let Some(mtp) = self.mtp.as_mut() else {
            return Ok(0);
        };
        if mtp.pending_rows == 0 {
            return Ok(0);
        }
        let mut tokens = std::mem::take(&mut mtp.pending_next);
        tokens.push(next);
        mtp.pending_rows = 0;
        forward_mtp(
            &self.backend,
            &mut mtp.state,
            &mut mtp.work,
            &tokens,
            Hidden::Trunk {
                act: &self.work.h,
                row0: 0,
            },
            false,
        )?;
        Ok(tokens.len())
    }

    /// Records the rows of the last forward call as pending for the MTP block.
    fn mtp_pending(&mut self, tokens: &[u32]) {
        if let Some(mtp) = self.mtp.as_mut() {
            mtp.pending_rows = tokens.len();
            mtp.pending_next = tokens[1..].to_vec();
        }
    }

    /// Drafts `n` tokens with the MTP block, `next` being the token sampled after the last
    /// position the session processed; `pick` chooses each draft from its logits.
    pub fn mtp_draft(
        &mut self,
        next: u32,
        n: usize,
        pick: &mut dyn FnMut(&[f32]) -> Result<u32>,
    ) -> Result<Vec<u32>> {
        let start = Instant::now();
        let drafts = self.mtp_draft_inner(next, n, DraftPick::Logits(pick));
        self.timings.draft_seconds += start.elapsed().as_secs_f64();
        drafts
    }

    /// [`Session::mtp_draft`] picking the largest logit (greedy sampling without penalties):
    /// the backend picks where it can, so only the drafts' ids come to the host.
    pub fn mtp_draft_greedy(&mut self, next: u32, n: usize) -> Result<Vec<u32>> {
        let start = Instant::now();
        let drafts = self.mtp_draft_inner(next, n, DraftPick::Greedy);
        self.timings.draft_seconds += start.elapsed().as_secs_f64();
        drafts
    }

    fn mtp_draft_inner(
        &mut self,
        next: u32,
        n: usize,
        mut pick: DraftPick<'_>,
    ) -> Result<Vec<u32>> {
        if self.mtp.is_none() {
            return Err(EngineError::NoMtpBlock);
        }
        if n == 0 || n > MAX_DRAFT {
            return Err(EngineError::BadConfig(format!(
                "drafts per step must be 1 to {MAX_DRAFT}, got {n}"
            )));
        }
        let rows = self.mtp_catch_up(next)?;
        if rows == 0 {
            return Err(EngineError::BadConfig(
                "MTP draft: the MTP block is out of step with the session (feed a prompt first)"
                    .into(),
            ));
        }
        let Some(mtp) = self.mtp.as_mut() else {
            return Err(EngineError::NoMtpBlock);
        };
        // The block's own output at its last row feeds the next draft.
        let mut row = rows - 1;
        let mut drafts = vec![pick.pick(&self.backend, &mtp.work, row)?];
        while drafts.len() < n {
            let prev = drafts[drafts.len() - 1];
            forward_mtp(
                &self.backend,
                &mut mtp.state,
                &mut mtp.work,
                &[prev],
                Hidden::Own { row },
                false,
            )?;
            row = 0;
            drafts.push(pick.pick(&self.backend, &mtp.work, row)?);
        }
        Ok(drafts)
    }

    /// Runs the verification batch `[next, drafts...]` (`next`: the token the drafts
    /// follow) and returns the logits of every row; `mtp_accept` then keeps a prefix.
    pub fn mtp_verify(&mut self, tokens: &[u32]) -> Result<Vec<f32>> {
        let start = Instant::now();
        let logits = self.mtp_verify_inner(tokens, false).map(|out| out.logits);
        self.timings.verify_seconds += start.elapsed().as_secs_f64();
        self.timings.steps += 1;
        logits
    }

    /// [`Session::mtp_verify`] returning each row's greedy token (the largest logit) instead
    /// of its logits: the backend picks where it can, so only the ids come to the host.
    pub fn mtp_verify_greedy(&mut self, tokens: &[u32]) -> Result<Vec<u32>> {
        let start = Instant::now();
        let vocab = self.n_vocab();
        let picks = self.mtp_verify_inner(tokens, true).and_then(|out| {
            let mut picks = Vec::with_capacity(tokens.len());
            out.greedy_tokens(vocab, &mut picks)?;
            Ok(picks)
        });
        self.timings.verify_seconds += start.elapsed().as_secs_f64();
        self.timings.steps += 1;
        picks
    }

    fn mtp_verify_inner(&mut self, tokens: &[u32], greedy: bool) -> Result<Output> {
        if self.mtp.is_none() {
            return Err(EngineError::NoMtpBlock);
        }
        if tokens.len() < 2 || tokens.len() > MAX_DRAFT + 1 {
            return Err(EngineError::BadConfig(format!(
                "a verification batch holds 2 to {} tokens, got {}",
                MAX_DRAFT + 1,
                tokens.len()
            )));
        }
        let start = Instant::now();
        self.state.checkpoint()?;
        self.timings.checkpoint_seconds += start.elapsed().as_secs_f64();
        let mut out = Output::default();
        let (backend, state, work) = (&self.backend, &mut self.state, &mut self.work);
        match greedy {
            true => forward_greedy_into(backend, state, work, tokens, Logits::All, &mut out)?,
            false => forward_into(backend, state, work, tokens, Logits::All, false, &mut out)?,
        }
        if let Some(mtp) = self.mtp.as_mut() {
            mtp.checkpointed = true;
            mtp.verified = tokens.to_vec();
        }
        Ok(out)
    }

    /// Keeps the first `accepted` drafts of the last verification batch (and the token
    /// before them): when some were rejected the state goes back to the one the batch
    /// recorded after its last kept row; the MTP block drops its draft chain.
    pub fn mtp_accept(&mut self, accepted: usize) -> Result<()> {
        let start = Instant::now();
        let done = self.mtp_accept_inner(accepted);
        self.timings.accept_seconds += start.elapsed().as_secs_f64();
        done
    }

    /// Time spent in each part of the speculative steps since the last call, then zeroed.
    pub fn take_mtp_timings(&mut self) -> MtpTimings {
        std::mem::take(&mut self.timings)
    }

    fn mtp_accept_inner(&mut self, accepted: usize) -> Result<()> {
        let Some(mtp) = self.mtp.as_mut() else {
            return Err(EngineError::NoMtpBlock);
        };
        if !std::mem::take(&mut mtp.checkpointed) {
            return Err(EngineError::BadConfig(
                "MTP accept without a verification batch".into(),
            ));
        }
        let verified = std::mem::take(&mut mtp.verified);
        if accepted + 1 > verified.len() {
            return Err(EngineError::BadConfig(format!(
                "accepted {accepted} of {} drafts",
                verified.len() - 1
            )));
        }
        let kept = &verified[..accepted + 1];
        let pos0 = self.state.pos() - verified.len();
        mtp.state.set_pos(pos0);
        if kept.len() < verified.len() {
            // The verification recorded the DeltaNet state after each row: nothing to re-run.
            self.state.rollback_to(kept.len())?;
        }
        self.mtp_pending(kept);
        Ok(())
    }

    pub fn n_vocab(&self) -> usize {
        self.backend.config().n_vocab
    }

    /// Back to an empty sequence (the cache keeps its size).
    pub fn reset(&mut self) {
        self.state.reset_state();
        if let Some(mtp) = self.mtp.as_mut() {
            mtp.state.reset_state();
            mtp.pending_rows = 0;
            mtp.pending_next.clear();
            mtp.checkpointed = false;
            mtp.verified.clear();
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
    /// See [`Session::mtp_draft_greedy`].
    fn mtp_draft_greedy(&mut self, next: u32, n: usize) -> Result<Vec<u32>>;
    /// See [`Session::mtp_verify`].
    fn mtp_verify(&mut self, tokens: &[u32]) -> Result<Vec<f32>>;
    /// See [`Session::mtp_verify_greedy`].
    fn mtp_verify_greedy(&mut self, tokens: &[u32]) -> Result<Vec<u32>>;
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
    fn mtp_draft_greedy(&mut self, next: u32, n: usize) -> Result<Vec<u32>> {
        Session::mtp_draft_greedy(self, next, n)
    }
    fn mtp_verify(&mut self, tokens: &[u32]) -> Result<Vec<f32>> {
        Session::mtp_verify(self, tokens)
    }
    fn mtp_verify_greedy(&mut self, tokens: &[u32]) -> Result<Vec<u32>> {
        Session::mtp_verify_greedy(self, tokens)
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

/// How a draft is chosen from the MTP block's output row: by the caller from its logits,
/// or greedily (the largest logit) by the backend where it can.
enum DraftPick<'p> {
    Logits(&'p mut dyn FnMut(&[f32]) -> Result<u32>),
    Greedy,
}

impl DraftPick<'_> {
    /// The draft of row `row` of the block's last output (`work.h`).
    fn pick<B: Backend>(&mut self, backend: &B, work: &Workspace<B>, row: usize) -> Result<u32> {
        match self {
            DraftPick::Logits(pick) => {
                let mut logits = Vec::new();
                backend.mtp_logits(&[row], &work.h, &mut logits)?;
                pick(&logits)
            }
            DraftPick::Greedy => {
                let mut picked = Vec::with_capacity(1);
                if backend.mtp_greedy_tokens(&[row], &work.h, &mut picked)? {
                    if let Some(&token) = picked.first() {
                        return Ok(token);
                    }
                }
                let mut logits = Vec::new();
                backend.mtp_logits(&[row], &work.h, &mut logits)?;
                Ok(greedy_argmax(&logits)?)
            }
        }
    }
}
