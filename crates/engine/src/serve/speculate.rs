//! Speculative decoding in the scheduler (`serve --mtp`): a slot's MTP block takes the rows
//! of the step that fed it and drafts right away (the rows are still in the shared
//! workspace), the next batched forward verifies every slot's drafts while recording each
//! slot's DeltaNet state per row, and a slot whose drafts were rejected goes back to the
//! state after its last kept row.

use crate::backend::{Backend, SeqState};
use crate::error::{EngineError, Result};
use crate::model::mtp::{forward_mtp, Hidden};
use crate::serve::scheduler::Scheduler;
use crate::serve::slot::Outcome;

impl<B: Backend> Scheduler<'_, B> {
    /// Runs the slot's MTP block over its rows `row0..` of this step (trunk positions
    /// `pos0..`), each paired with its successor token; returns the last row's draft logits
    /// when `logits`.
    pub(super) fn mtp_catch_up(
        &mut self,
        index: usize,
        row0: usize,
        pos0: usize,
        successors: &[u32],
        logits: bool,
    ) -> Result<Vec<f32>> {
        let (Some(mtp_work), Some(mtp)) = (self.mtp_work.as_mut(), self.slots[index].mtp.as_mut())
        else {
            return Ok(Vec::new());
        };
        // Positions follow the trunk's (a resumed prompt may leave stale entries below:
        // they only lower the acceptance rate).
        mtp.set_pos(pos0);
        forward_mtp(
            self.backend,
            mtp,
            mtp_work,
            successors,
            Hidden::Trunk {
                act: &self.work.h,
                row0,
            },
            logits,
        )
    }

    /// After a step that fed `fed` (rows `row0..`, trunk positions `pos0..`) and sampled
    /// the slot's pending token: the MTP block takes those rows and drafts the next step's
    /// tokens.
    pub(super) fn draft(
        &mut self,
        index: usize,
        row0: usize,
        pos0: usize,
        fed: &[u32],
    ) -> Result<()> {
        if self.mtp_work.is_none() {
            return Ok(());
        }
        let Some(active) = self.slots[index].active.as_ref() else {
            return Ok(());
        };
        let Some(pending) = active.pending else {
            return Ok(());
        };
        // Drafts that fit the token budget and the context (one more row verifies them).
        let kept_pos = pos0 + fed.len();
        let room = self.config.context.saturating_sub(kept_pos + 1);
        let n = self
            .config
            .draft
            .min(active.budget().saturating_sub(1))
            .min(room);
        let mut successors = fed[1..].to_vec();
        successors.push(pending);
        let logits = self.mtp_catch_up(index, row0, pos0, &successors, n > 0)?;
        if n == 0 {
            return Ok(());
        }
        let slot = &mut self.slots[index];
        let (Some(active), Some(mtp), Some(mtp_work)) = (
            slot.active.as_mut(),
            slot.mtp.as_mut(),
            self.mtp_work.as_mut(),
        ) else {
            return Ok(());
        };
        let mut last = active.pick_draft(&logits).map_err(EngineError::BadConfig)?;
        let mut row = successors.len() - 1;
        for _ in 1..n {
            let logits = forward_mtp(
                self.backend,
                mtp,
                mtp_work,
                &[last],
                Hidden::Own { row },
                true,
            )?;
            last = active.pick_draft(&logits).map_err(EngineError::BadConfig)?;
            row = 0;
        }
        active.seal_drafts();
        Ok(())
    }

    /// A slot verified its drafts (`rows`: logits of its token and each draft, its rows at
    /// `row0`): emit what the acceptance rule keeps, let the MTP block take the kept rows
    /// and draft again, and roll the state back past rejected drafts.
    pub(super) fn advance_verified(
        &mut self,
        index: usize,
        rows: &[f32],
        row0: usize,
        tick: u64,
    ) -> usize {
        let n_vocab = self.backend.config().n_vocab;
        let slot = &mut self.slots[index];
        let Some(active) = slot.active.as_mut() else {
            return 0;
        };
        let batch = active.verify.clone();
        let pos0 = slot.state.pos() - batch.len();
        let generated_before = active.budget();
        let verified = match active.take_verified(rows, n_vocab, self.tokenizer) {
            Ok(v) => v,
            Err(e) => {
                self.fail_slot(index, &e);
                return 0;
            }
        };
        let generated = generated_before - active.budget();
        self.shared
            .metrics
            .speculated(verified.drafts.len(), verified.accepted);
        let fed = &batch[..1 + verified.fed];
        slot.cache.extend(fed);
        if let Outcome::Continue = verified.outcome {
            if let Err(e) = self.draft(index, row0, pos0, fed) {
                self.fail_slot(index, &e.to_string());
                return generated;
            }
        }
        if fed.len() < batch.len() {
            if let Err(e) = self.roll_back(index, fed) {
                self.fail_slot(index, &e.to_string());
                return generated;
            }
        }
        if let Outcome::Done(reason) = verified.outcome {
            self.end_turn(index, reason, tick);
        }
        generated
    }

    /// Back to the state the verification recorded after its last kept row.
    fn roll_back(&mut self, index: usize, fed: &[u32]) -> Result<()> {
        let slot = &mut self.slots[index];
        if !std::mem::take(&mut slot.checkpointed) {
            return Err(EngineError::BadConfig(
                "MTP rollback without a recorded verification".into(),
            ));
        }
        slot.state.rollback_to(fed.len())
    }
}
