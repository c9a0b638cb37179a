//! Greedy picks kept for chained greedy steps (`Backend::keep_greedy_tokens`) on the CPU.
//! Nothing is saved here (the picks are host values anyway); the CPU takes the chained
//! path so that the session's side of it (stand-in ids, slots, the step's one read) runs
//! under every CPU test of speculative decoding, with the same tokens as separate calls.

use std::ops::Range;
use std::sync::MutexGuard;

use super::CpuBackend;
use crate::backend::kept::NextEmbedding;
use crate::backend::LmHead;
use crate::error::{EngineError, Result};
use crate::sampling::greedy_argmax;

/// The picks of the step in progress.
#[derive(Default)]
pub struct KeptPicks {
    picks: Vec<u32>,
    next: NextEmbedding,
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
        Ok(())
    }

    pub(super) fn kept(&self) -> Result<MutexGuard<'_, KeptPicks>> {
        self.kept
            .lock()
            .map_err(|_| EngineError::BadConfig("kept-picks lock poisoned by a panic".into()))
    }
}
