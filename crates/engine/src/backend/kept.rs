//! What the backends that keep greedy picks (chained greedy steps, `Backend::embed_kept`)
//! share: which kept picks the next embedding takes, asked once and checked against the
//! picks kept and the embedding's tokens.

use std::ops::Range;

use crate::error::{EngineError, Result};

/// The next embedding's tokens from `.0` on come from the kept picks `.1`.
#[derive(Default)]
pub(crate) struct NextEmbedding(Option<(usize, Range<usize>)>);

impl NextEmbedding {
    /// The next embedding takes its tokens `at..at + picks.len()` from `picks`, of the
    /// `kept` picks.
    pub fn ask(&mut self, at: usize, picks: Range<usize>, kept: usize) -> Result<()> {
        if picks.is_empty() || picks.end > kept {
            return Err(EngineError::BadConfig(format!(
                "an embedding of kept picks {picks:?}: {kept} picks are kept"
            )));
        }
        self.0 = Some((at, picks));
        Ok(())
    }

    /// For an embedding of `tokens` tokens: the tokens it takes from kept picks and those
    /// picks, once (`None`: it takes none).
    pub fn take(&mut self, tokens: usize) -> Result<Option<(Range<usize>, Range<usize>)>> {
        let Some((at, picks)) = self.0.take() else {
            return Ok(None);
        };
        let end = at + picks.len();
        if end > tokens {
            return Err(EngineError::BadConfig(format!(
                "kept picks for tokens {at}..{end} of an embedding of {tokens} tokens"
            )));
        }
        Ok(Some((at..end, picks)))
    }

    pub fn clear(&mut self) {
        self.0 = None;
    }
}

#[cfg(test)]
mod tests {
    use super::NextEmbedding;

    #[test]
    fn an_embedding_takes_the_picks_asked_for_once() {
        let mut next = NextEmbedding::default();
        assert!(next.ask(0, 2..4, 3).is_err(), "past the picks");
        assert!(next.ask(0, 1..1, 3).is_err(), "no picks");
        next.ask(1, 1..3, 3).unwrap();
        assert_eq!(next.take(3).unwrap(), Some((1..3, 1..3)));
        assert_eq!(next.take(3).unwrap(), None, "taken once");
        next.ask(2, 0..2, 3).unwrap();
        assert!(next.take(2).is_err(), "past the tokens");
        next.ask(0, 0..1, 3).unwrap();
        next.clear();
        assert_eq!(next.take(1).unwrap(), None, "cleared");
    }
}
