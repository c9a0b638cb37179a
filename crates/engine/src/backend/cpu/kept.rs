//! Greedy picks kept for chained greedy steps (`Backend::keep_greedy_tokens`) on the CPU.
//! Nothing is saved here (the picks are host values anyway); the CPU takes the chained
//! path so that the session's side of it (stand-in ids, slots, the step's one read) runs
//! under every CPU test of speculative decoding, with the same tokens as separate calls.

use std::ops::Range;
use std::sync::MutexGuard;

use super::CpuBackend;
use crate::backend::LmHead;
use crate::error::{EngineError, Result};
use crate::sampling::greedy_argmax;

/// The picks of the step in progress.
#[derive(Default)]
pub struct KeptPicks {
    picks: Vec<u32>,
    /// The next embedding's tokens `.0..` come from the picks `.1`.
    next_embedding: Option<(usize, Range<usize>)>,
}

impl KeptPicks {
    pub fn embed_next(&mut self, at: usize, picks: Range<usize>) -> Result<()> {
        if picks.is_empty() || picks.end > self.picks.len() {
            return Err(EngineError::BadConfig(format!(
                "an embedding of kept picks {picks:?}: {} picks are kept",
                self.picks.len()
            )));
        }
        self.next_embedding = Some((at, picks));
        Ok(())
    }

    /// `tokens` with the kept picks the next embedding takes written over their stand-ins
    /// (in `buf`), or `tokens` itself when it takes none.
    pub fn substitute<'a>(
        &mut self,
        tokens: &'a [u32],
        buf: &'a mut Vec<u32>,
    ) -> Result<&'a [u32]> {
        let Some((at, picks)) = self.next_embedding.take() else {
            return Ok(tokens);
        };
        let end = at + picks.len();
        if end > tokens.len() {
            return Err(EngineError::BadConfig(format!(
                "kept picks for tokens {at}..{end} of an embedding of {} tokens",
                tokens.len()
            )));
        }
        buf.clear();
        buf.extend_from_slice(tokens);
        buf[at..end].copy_from_slice(&self.picks[picks]);
        Ok(buf)
    }

    pub fn take(&mut self, out: &mut Vec<u32>) {
        out.clear();
        out.append(&mut self.picks);
        self.next_embedding = None;
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

#[cfg(test)]
mod tests {
    use super::KeptPicks;

    #[test]
    fn an_embedding_takes_the_picks_asked_for_once() {
        let mut kept = KeptPicks {
            picks: vec![7, 8, 9],
            next_embedding: None,
        };
        assert!(kept.embed_next(0, 2..4).is_err(), "past the picks");
        assert!(kept.embed_next(0, 1..1).is_err(), "no picks");
        kept.embed_next(1, 1..3).unwrap();
        let mut buf = Vec::new();
        assert_eq!(kept.substitute(&[5, 0, 0], &mut buf).unwrap(), &[5, 8, 9]);
        let mut again = Vec::new();
        assert_eq!(kept.substitute(&[5, 0, 0], &mut again).unwrap(), &[5, 0, 0]);
        kept.embed_next(2, 0..2).unwrap();
        assert!(
            kept.substitute(&[5, 0], &mut buf).is_err(),
            "past the tokens"
        );
        let mut out = vec![1];
        kept.take(&mut out);
        assert_eq!(out, [7, 8, 9]);
        assert!(kept.embed_next(0, 0..1).is_err(), "taken");
    }
}
