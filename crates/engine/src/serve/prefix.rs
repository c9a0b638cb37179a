//! Prompt reuse for one slot. A hybrid model's DeltaNet state folds every past token into a
//! fixed-size matrix and cannot be rolled back, so the slot keeps whole-state snapshots at
//! reusable points (the end of a prompt, the end of a completion) next to the tokens its KV
//! cache holds. A new prompt resumes from the longest snapshot that is a prefix of it (or from
//! the live state when that is one); attention KV entries past the resume point are simply
//! overwritten by the new tokens.

/// Where a prompt can resume in a slot.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Resume {
    /// Nothing reusable: start from an empty state.
    Empty,
    /// The live state already holds the first `pos` prompt tokens.
    Live { pos: usize },
    /// Restore snapshot `index`, which holds the first `pos` prompt tokens.
    Snapshot { index: usize, pos: usize },
}

impl Resume {
    /// Prompt tokens that need not be ingested.
    pub fn reused(&self) -> usize {
        match *self {
            Resume::Empty => 0,
            Resume::Live { pos } | Resume::Snapshot { pos, .. } => pos,
        }
    }
}

struct Entry<T> {
    pos: usize,
    snapshot: T,
    /// The logits after the snapshot's last token, kept at the end of a prompt so the same
    /// prompt again (a regenerated answer) needs no forward call at all.
    logits: Option<Vec<f32>>,
    last_use: u64,
}

/// The tokens a slot's state holds and its snapshots. Invariant: every snapshot's `pos` is at
/// most `history.len()`, and the snapshot is the state after `history[..pos]`.
pub struct PrefixCache<T> {
    history: Vec<u32>,
    entries: Vec<Entry<T>>,
    limit: usize,
}

impl<T> PrefixCache<T> {
    /// Keeps at most `limit` snapshots (least recently used go first).
    pub fn new(limit: usize) -> PrefixCache<T> {
        PrefixCache {
            history: Vec::new(),
            entries: Vec::new(),
            limit,
        }
    }

    /// The best resume point for `prompt`. At least one prompt token is left to ingest (its
    /// logits start the completion), unless a snapshot kept the logits of the whole prompt.
    pub fn best(&self, prompt: &[u32]) -> Resume {
        let common = self
            .history
            .iter()
            .zip(prompt)
            .take_while(|(a, b)| a == b)
            .count();
        let usable = |pos: usize| pos > 0 && pos <= common && pos < prompt.len();
        let mut best = Resume::Empty;
        if usable(self.history.len()) {
            best = Resume::Live {
                pos: self.history.len(),
            };
        }
        for (index, e) in self.entries.iter().enumerate() {
            let whole_prompt = e.logits.is_some() && e.pos == prompt.len() && e.pos == common;
            if (usable(e.pos) || whole_prompt) && e.pos > best.reused() {
                best = Resume::Snapshot { index, pos: e.pos };
            }
        }
        best
    }

    /// The snapshot to restore for `Resume::Snapshot { index, .. }`, marked as used.
    /// With the logits it kept, if any.
    pub fn take_for_restore(&mut self, index: usize, tick: u64) -> Option<(&T, Option<&[f32]>)> {
        let e = self.entries.get_mut(index)?;
        e.last_use = tick;
        Some((&e.snapshot, e.logits.as_deref()))
    }

    /// The live state now holds `history[..pos]` (after a restore or a reset): later
    /// snapshots no longer match what the KV cache will hold, so they go.
    pub fn truncate(&mut self, pos: usize) {
        self.history.truncate(pos);
        self.entries.retain(|e| e.pos <= pos);
    }

    /// The live state ingested `tokens`.
    pub fn extend(&mut self, tokens: &[u32]) {
        self.history.extend_from_slice(tokens);
    }

    /// Keeps a snapshot of the live state (at `history.len()`), replacing one at the same
    /// position and evicting the least recently used beyond the limit.
    pub fn insert(&mut self, snapshot: T, logits: Option<Vec<f32>>, tick: u64) {
        if self.limit == 0 {
            return;
        }
        let pos = self.history.len();
        self.entries.retain(|e| e.pos != pos);
        if self.entries.len() >= self.limit {
            if let Some(oldest) = (0..self.entries.len()).min_by_key(|&i| self.entries[i].last_use)
            {
                self.entries.swap_remove(oldest);
            }
        }
        self.entries.push(Entry {
            pos,
            snapshot,
            logits,
            last_use: tick,
        });
    }

    /// Forgets everything (the state was lost, e.g. after a backend error).
    pub fn clear(&mut self) {
        self.history.clear();
        self.entries.clear();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cache_with(history: &[u32], snapshots_at: &[usize]) -> PrefixCache<usize> {
        let mut c = PrefixCache::new(8);
        let mut fed = 0;
        for (tick, &pos) in snapshots_at.iter().enumerate() {
            c.extend(&history[fed..pos]);
            fed = pos;
            c.insert(pos, None, tick as u64);
        }
        c.extend(&history[fed..]);
        c
    }

    #[test]
    fn the_live_state_is_reused_when_it_is_a_prefix() {
        let c = cache_with(&[1, 2, 3, 4], &[2]);
        assert_eq!(c.best(&[1, 2, 3, 4, 5, 6]), Resume::Live { pos: 4 });
    }

    #[test]
    fn the_longest_matching_snapshot_wins_when_the_live_state_diverged() {
        let c = cache_with(&[1, 2, 3, 4, 5], &[2, 3]);
        assert_eq!(
            c.best(&[1, 2, 3, 9, 9]),
            Resume::Snapshot { index: 1, pos: 3 }
        );
        assert_eq!(c.best(&[1, 2, 7]), Resume::Snapshot { index: 0, pos: 2 });
        assert_eq!(c.best(&[5, 2, 3]), Resume::Empty);
    }

    #[test]
    fn at_least_one_prompt_token_is_left_to_ingest() {
        let c = cache_with(&[1, 2, 3], &[3]);
        assert_eq!(c.best(&[1, 2, 3]), Resume::Empty);
        let c = cache_with(&[1, 2, 3], &[2, 3]);
        assert_eq!(c.best(&[1, 2, 3]), Resume::Snapshot { index: 0, pos: 2 });
    }

    #[test]
    fn a_snapshot_with_logits_serves_the_same_prompt_again() {
        let mut c: PrefixCache<usize> = PrefixCache::new(4);
        c.extend(&[1, 2, 3]);
        c.insert(3, Some(vec![0.5]), 0);
        c.extend(&[4, 5]);
        assert_eq!(c.best(&[1, 2, 3]), Resume::Snapshot { index: 0, pos: 3 });
        assert_eq!(
            c.take_for_restore(0, 1).map(|(_, l)| l.is_some()),
            Some(true)
        );
    }

    #[test]
    fn truncating_drops_snapshots_past_the_new_end() {
        let mut c = cache_with(&[1, 2, 3, 4, 5], &[2, 4]);
        c.truncate(3);
        assert_eq!(c.entries.len(), 1);
        assert_eq!(c.history, &[1, 2, 3]);
        c.extend(&[8, 8]);
        assert_eq!(
            c.best(&[1, 2, 3, 4, 5, 6]),
            Resume::Snapshot { index: 0, pos: 2 }
        );
    }

    #[test]
    fn the_least_recently_used_snapshot_is_evicted() {
        let mut c: PrefixCache<usize> = PrefixCache::new(2);
        c.extend(&[1]);
        c.insert(1, None, 0);
        c.extend(&[2]);
        c.insert(2, None, 1);
        assert!(c.take_for_restore(0, 5).is_some());
        c.extend(&[3]);
        c.insert(3, None, 6);
        let kept: Vec<usize> = c.entries.iter().map(|e| e.pos).collect();
        assert_eq!(kept.len(), 2);
        assert!(kept.contains(&1) && kept.contains(&3));
    }
}
