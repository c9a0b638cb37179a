//! Greedy picks kept for chained greedy steps (`Backend::keep_greedy_tokens`) on the CPU.
//! Nothing is saved here (the picks are host values anyway); the CPU takes the chained
//! path so that the session's side of it (stand-in ids, slots, the step's one read) runs
//! under every CPU test of speculative decoding, with the same tokens as separate calls.
//! A chained step's plan (`Backend::begin_step`, from which the CUDA backend records the
//! step as one graph) is checked here too: each embedding against the plan's next call, and
//! the step's end against the number of calls, so every such CPU test checks the plan.

use std::ops::Range;
use std::sync::MutexGuard;

use super::CpuBackend;
use crate::backend::kept::NextEmbedding;
use crate::backend::{LmHead, StepPlan};
use crate::error::{EngineError, Result};
use crate::sampling::greedy_argmax;

/// The picks of the step in progress.
#[derive(Default)]
pub struct KeptPicks {
    picks: Vec<u32>,
    next: NextEmbedding,
    /// The plan of the chained step in progress and the calls embedded so far.
    plan: Option<(StepPlan, usize)>,
    /// The logits of the last picks' rows (`Backend::last_head_logits`).
    last_logits: Vec<f32>,
}

impl KeptPicks {
    pub fn embed_next(&mut self, at: usize, picks: Range<usize>) -> Result<()> {
        self.next.ask(at, picks, self.picks.len())
    }

    /// `tokens` with the kept picks the next embedding takes written over their stand-ins
    /// (in `buf`), or `tokens` itself when it takes none.
    pub fn substitute<'a>(
        &mut self,
        tokens: &'a [u32],
        buf: &'a mut Vec<u32>,
    ) -> Result<&'a [u32]> {
        let Some((at, picks)) = self.next.take(tokens.len())? else {
            return Ok(tokens);
        };
        buf.clear();
        buf.extend_from_slice(tokens);
        buf[at].copy_from_slice(&self.picks[picks]);
        Ok(buf)
    }

    /// A chained step of `plan` begins.
    pub fn begin_plan(&mut self, plan: StepPlan) {
        self.plan = Some((plan, 0));
    }

    /// An embedding of the host ids `tokens` (stand-ins included) during a planned step: it
    /// must be the plan's next call.
    pub fn check_planned(&mut self, tokens: &[u32]) -> Result<()> {
        let Some((plan, call)) = &mut self.plan else {
            return Ok(());
        };
        let planned = plan.forwards.get(*call).map(|f| f.ids.as_slice());
        if planned != Some(tokens) {
            let msg = format!("step plan: call {call} embeds {tokens:?}, planned {planned:?}");
            self.plan = None;
            return Err(EngineError::BadConfig(msg));
        }
        *call += 1;
        Ok(())
    }

    /// The planned step ended: every call of the plan must have run.
    pub fn end_plan(&mut self) -> Result<()> {
        match self.plan.take() {
            Some((plan, calls)) if calls != plan.forwards.len() => {
                Err(EngineError::BadConfig(format!(
                    "step plan: {calls} of the {} planned calls ran",
                    plan.forwards.len()
                )))
            }
            _ => Ok(()),
        }
    }

    /// The planned step failed half-way.
    pub fn drop_plan(&mut self) {
        self.plan = None;
    }

    /// Every kept pick, appended to `out`; none is kept afterwards.
    pub fn take(&mut self, out: &mut Vec<u32>) {
        out.append(&mut self.picks);
        self.next.clear();
    }
}

impl CpuBackend {
    /// `Backend::keep_greedy_tokens`: the rows' logits, each row's largest kept.
    pub(super) fn keep_picks(&self, head: LmHead, rows: &[usize], x: &[f32]) -> Result<()> {
        let head = match head {
            LmHead::Trunk => &self.weights.model.output,
            LmHead::Mtp => self.weights.model.mtp_head()?,
        };
        let mut logits = Vec::new();
        self.head_logits(head, rows, x, &mut logits)?;
        let mut kept = self.kept()?;
        for row in logits.chunks(head.rows.max(1)) {
            kept.picks.push(greedy_argmax(row)?);
        }
        kept.last_logits = logits;
        Ok(())
    }

    /// `Backend::last_head_logits`: the first `rows` rows of the last picks' logits.
    pub(super) fn last_head_logits(&self, rows: usize, out: &mut Vec<f32>) -> Result<()> {
        let kept = self.kept()?;
        let values = rows * self.weights.model.output.rows;
        let Some(logits) = kept.last_logits.get(..values) else {
            return Err(EngineError::BadConfig(format!(
                "the last picks kept {} logits, asked for {rows} rows",
                kept.last_logits.len()
            )));
        };
        out.extend_from_slice(logits);
        Ok(())
    }

    pub(super) fn kept(&self) -> Result<MutexGuard<'_, KeptPicks>> {
        self.kept
            .lock()
            .map_err(|_| EngineError::BadConfig("kept-picks lock poisoned by a panic".into()))
    }
}

#[cfg(test)]
mod tests {
    use super::KeptPicks;
    use crate::backend::{StepForward, StepPlan};

    #[test]
    fn a_planned_step_embeds_its_calls_in_order_and_all_of_them() {
        let plan = StepPlan {
            forwards: vec![
                StepForward {
                    ids: vec![5, 7],
                    pos: 3,
                },
                StepForward {
                    ids: vec![7, 0],
                    pos: 9,
                },
            ],
        };
        let mut kept = KeptPicks::default();
        kept.check_planned(&[1, 2, 3]).unwrap();
        kept.begin_plan(plan.clone());
        kept.check_planned(&[5, 7]).unwrap();
        kept.check_planned(&[7, 0]).unwrap();
        kept.end_plan().unwrap();
        kept.begin_plan(plan.clone());
        kept.check_planned(&[5, 7]).unwrap();
        assert!(kept.end_plan().is_err(), "a call missing");
        kept.begin_plan(plan.clone());
        assert!(kept.check_planned(&[5, 8]).is_err(), "other ids");
        kept.check_planned(&[1]).unwrap();
        kept.begin_plan(plan.clone());
        kept.check_planned(&[5, 7]).unwrap();
        kept.check_planned(&[7, 0]).unwrap();
        assert!(kept.check_planned(&[7]).is_err(), "a call past the plan");
    }
}
