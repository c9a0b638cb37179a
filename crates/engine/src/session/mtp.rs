//! The session's MTP block: drafting, verifying a batch of drafts, keeping a prefix of it
//! (speculative decoding; `speculative.rs` holds the acceptance rule).

use std::time::Instant;

use super::{MtpTimings, Session, MAX_DRAFT};
use crate::backend::{Backend, LmHead, SeqState, StepForward, StepPlan};
use crate::error::{EngineError, Result};
use crate::model::forward::{
    forward_greedy_into, forward_into, forward_kept, Logits, Output, Workspace,
};
use crate::model::mtp::{forward_mtp, Hidden};
use crate::sampling::greedy_argmax;

/// The MTP block next to a session (speculative decoding). Invariant between calls: the
/// block has processed every position whose next token the session knows, except the last
/// `pending_rows` positions, whose trunk outputs are rows `0..pending_rows` of the
/// session's workspace (`h`, kept normed) and whose next tokens are `pending_next` (one
/// fewer: the last one's next token comes with the next call).
pub(super) struct MtpState<B: Backend> {
    state: B::State,
    work: Workspace<B>,
    pending_rows: usize,
    pending_next: Vec<u32>,
    /// The verification batch recorded its rows (`accept` rolls back into it).
    checkpointed: bool,
    /// The verification batch (`[next, drafts...]`).
    verified: Vec<u32>,
}

impl<B: Backend> MtpState<B> {
    /// Back to an empty sequence, like the session's.
    pub(super) fn reset(&mut self) {
        self.state.reset_state();
        self.pending_rows = 0;
        self.pending_next.clear();
        self.checkpointed = false;
        self.verified.clear();
    }
}

impl<B: Backend> Session<B> {
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
    pub(super) fn mtp_catch_up(&mut self, next: u32) -> Result<usize> {
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
    pub(super) fn mtp_pending(&mut self, tokens: &[u32]) {
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
            if let DraftPick::Kept = pick {
                // `prev` is a stand-in: the draft is in its slot on the device.
                self.backend.embed_kept(0, drafts.len() - 1..drafts.len())?;
            }
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
        let logits = self
            .mtp_verify_inner(tokens, Verify::Logits)
            .map(|out| out.logits);
        self.timings.verify_seconds += start.elapsed().as_secs_f64();
        self.timings.steps += 1;
        logits
    }

    /// [`Session::mtp_verify`] returning each row's greedy token (the largest logit) instead
    /// of its logits: the backend picks where it can, so only the ids come to the host.
    pub fn mtp_verify_greedy(&mut self, tokens: &[u32]) -> Result<Vec<u32>> {
        let start = Instant::now();
        let vocab = self.n_vocab();
        let picks = self
            .mtp_verify_inner(tokens, Verify::Greedy)
            .and_then(|out| {
                let mut picks = Vec::with_capacity(tokens.len());
                out.greedy_tokens(vocab, &mut picks)?;
                Ok(picks)
            });
        self.timings.verify_seconds += start.elapsed().as_secs_f64();
        self.timings.steps += 1;
        picks
    }

    /// [`Session::mtp_draft_greedy`] then [`Session::mtp_verify_greedy`] of `[next,
    /// drafts...]` in one call; [`Session::mtp_accept`] then keeps a prefix. On a backend that
    /// keeps greedy picks on its device (the CUDA backend, unless `REDLITE_DEVICE_GREEDY=0`) each
    /// draft feeds the next draft and the verification there and the host reads the step's
    /// picks once, after the verification, so no host read holds the device up within a
    /// step; the same tokens either way.
    pub fn mtp_greedy_step(&mut self, next: u32, n: usize) -> Result<GreedyStep> {
        if !self.backend.keeps_greedy_tokens() {
            let drafts = self.mtp_draft_greedy(next, n)?;
            let mut batch = Vec::with_capacity(n + 1);
            batch.push(next);
            batch.extend_from_slice(&drafts);
            let picks = self.mtp_verify_greedy(&batch)?;
            return Ok(GreedyStep { drafts, picks });
        }
        let step = self
            .begin_chained_step(next, n)
            .and_then(|()| self.mtp_chained_step(next, n));
        if step.is_err() {
            // Drop what the failed step kept or recorded; its own error is the one to report.
            self.backend.abort_step();
            let _ = self.backend.take_kept_tokens(&mut Vec::new());
        }
        step
    }

    /// Drafts `n` tokens by the MTP block's largest logit and verifies `[next, drafts...]`:
    /// the drafts and every verification row's logits (`[n + 1][vocab]`), for a sampler
    /// that is not greedy (the drafts are a function of the context, so the acceptance rule
    /// sees a one-hot draft distribution). On a backend that chains greedy steps the drafts
    /// and the verification run as that one step (no host round trip between the drafts) and
    /// then the rows' logits are read; [`Session::mtp_accept`] keeps a prefix.
    pub fn mtp_argmax_step(&mut self, next: u32, n: usize) -> Result<(Vec<u32>, Vec<f32>)> {
        if !self.backend.keeps_greedy_tokens() {
            let drafts = self.mtp_draft_greedy(next, n)?;
            let mut batch = Vec::with_capacity(n + 1);
            batch.push(next);
            batch.extend_from_slice(&drafts);
            let logits = self.mtp_verify(&batch)?;
            return Ok((drafts, logits));
        }
        let GreedyStep { drafts, .. } = self.mtp_greedy_step(next, n)?;
        let start = Instant::now();
        let mut logits = Vec::new();
        let read = self.backend.last_head_logits(n + 1, &mut logits);
        self.timings.verify_seconds += start.elapsed().as_secs_f64();
        read?;
        Ok((drafts, logits))
    }

    /// Tells the backend every forward call of the chained step about to run (the block's
    /// catch-up over the pending rows, its chained drafts, the verification), so that it may
    /// run the step as one recorded unit (`Backend::begin_step`).
    fn begin_chained_step(&mut self, next: u32, n: usize) -> Result<()> {
        let Some(mtp) = self.mtp.as_ref() else {
            return Ok(());
        };
        if mtp.pending_rows == 0 || n == 0 || n > MAX_DRAFT {
            // The draft reports it.
            return Ok(());
        }
        let mut catch_up = mtp.pending_next.clone();
        catch_up.push(next);
        let mut pos = mtp.state.pos();
        let mut forwards = Vec::with_capacity(n + 1);
        forwards.push(StepForward { pos, ids: catch_up });
        pos += forwards[0].ids.len();
        for _ in 1..n {
            // Each later draft embeds the one before it, kept on the device.
            forwards.push(StepForward { ids: vec![0], pos });
            pos += 1;
        }
        let mut verified = vec![0; n + 1];
        verified[0] = next;
        forwards.push(StepForward {
            ids: verified,
            pos: self.state.pos(),
        });
        let (w, m) = (&self.work, &mtp.work);
        self.backend.begin_step(
            StepPlan { forwards },
            [&self.state, &mtp.state],
            [&w.x, &w.h, &w.mix, &m.x, &m.h, &m.mix],
        )
    }

    fn mtp_chained_step(&mut self, next: u32, n: usize) -> Result<GreedyStep> {
        let start = Instant::now();
        let drafted = self.mtp_draft_inner(next, n, DraftPick::Kept);
        self.timings.draft_seconds += start.elapsed().as_secs_f64();
        drafted?;
        let start = Instant::now();
        // Stand-ins after `next`: the drafts are in slots 0..n on the device.
        let mut batch = vec![0; n + 1];
        batch[0] = next;
        let mut ids = Vec::with_capacity(2 * n + 1);
        let verified = self
            .backend
            .embed_kept(1, 0..n)
            .and_then(|()| self.mtp_verify_inner(&batch, Verify::Kept))
            .and_then(|_| self.backend.end_step())
            .and_then(|()| self.backend.take_kept_tokens(&mut ids));
        self.timings.verify_seconds += start.elapsed().as_secs_f64();
        self.timings.steps += 1;
        verified?;
        if ids.len() != 2 * n + 1 {
            return Err(EngineError::BadConfig(format!(
                "a chained step of {n} drafts kept {} picks, not {}",
                ids.len(),
                2 * n + 1
            )));
        }
        let picks = ids.split_off(n);
        if let Some(mtp) = self.mtp.as_mut() {
            mtp.verified[1..].copy_from_slice(&ids);
        }
        Ok(GreedyStep { drafts: ids, picks })
    }

    fn mtp_verify_inner(&mut self, tokens: &[u32], verify: Verify) -> Result<Output> {
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
        match verify {
            Verify::Logits => {
                forward_into(backend, state, work, tokens, Logits::All, false, &mut out)?
            }
            Verify::Greedy => {
                forward_greedy_into(backend, state, work, tokens, Logits::All, &mut out)?
            }
            Verify::Kept => forward_kept(backend, state, work, tokens, Logits::All)?,
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
}

/// How a draft is chosen from the MTP block's output row: by the caller from its logits,
/// or greedily (the largest logit) by the backend where it can.
enum DraftPick<'p> {
    Logits(&'p mut dyn FnMut(&[f32]) -> Result<u32>),
    Greedy,
    /// Greedily, kept in the backend's next pick slot (a chained step); the draft returned
    /// is a stand-in (0).
    Kept,
}

/// What a verification gives for its rows.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Verify {
    Logits,
    Greedy,
    /// Greedy picks kept on the device.
    Kept,
}

/// One greedy speculative step's picks ([`Session::mtp_greedy_step`]).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct GreedyStep {
    /// The drafts, in order.
    pub drafts: Vec<u32>,
    /// The trunk's greedy token after each row of the verification `[next, drafts...]`.
    pub picks: Vec<u32>,
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
            DraftPick::Kept => {
                backend.keep_greedy_tokens(LmHead::Mtp, &[row], &work.h)?;
                Ok(0)
            }
        }
    }
}
