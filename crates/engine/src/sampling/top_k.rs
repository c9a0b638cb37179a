//! The top-k candidates of a row of logits in one pass over it, without the row's copy into
//! (id, logit) pairs and the selection over all of them (`Sampler::prepare` with top-k on).
//! The candidates are ranked by one strict total order (`by_logit_desc`: the logit by
//! `total_cmp`, descending, then the id), so the k best and their order are unique: the same
//! vector as filtering, penalizing and selecting over the whole row, in a fraction of the
//! time (a 151,936-token vocabulary is scanned with one comparison for most logits).

use std::cmp::Ordering;
use std::collections::HashMap;
use std::sync::OnceLock;

use super::{apply_penalty, by_logit_desc, SamplingParams, SCAN_CHUNK as CHUNK};

/// `REDLITE_SAMPLER_WHOLE_ROW=1` (an A/B of this file's speed): the selection over the whole
/// row's candidates instead; the same candidates either way.
pub(super) fn whole_row_selection() -> bool {
    static ON: OnceLock<bool> = OnceLock::new();
    *ON.get_or_init(|| std::env::var("REDLITE_SAMPLER_WHOLE_ROW").as_deref() == Ok("1"))
}

/// The `k` best finite candidates of `logits` (0 < `k`), sorted best first; the tokens of
/// `counts` penalized as `apply_penalties` does when `penalized`. Written into `out`;
/// `skipped` is the penalized ids' buffer (kept by the caller: no allocation a token).
pub(super) fn top_k_of_row(
    logits: &[f32],
    (k, params): (usize, &SamplingParams),
    (counts, penalized): (&HashMap<u32, u32>, bool),
    skipped: &mut Vec<u32>,
    out: &mut Vec<(u32, f32)>,
) {
    let mut best = Best::new(k, logits.len(), out);
    // The penalized tokens (at most the penalty window) are offered apart, after the scan
    // skips them, so the scan itself looks nothing up.
    skipped.clear();
    if penalized {
        skipped.extend(counts.keys().copied());
    }
    skipped.sort_unstable();
    let mut next_skip = skipped.iter().copied().peekable();
    for (c, chunk) in logits.chunks(CHUNK).enumerate() {
        let first = (c * CHUNK) as u32;
        // A chunk with no logit at or above the bar's has no candidate (NaN compares false,
        // -0 and +0 equal, so those go through `offer`): one vectorized test a chunk.
        if let Some(bar) = best.bar {
            if !chunk.iter().fold(false, |any, &l| any | (l >= bar.1)) {
                while next_skip
                    .next_if(|&id| id < first + chunk.len() as u32)
                    .is_some()
                {}
                continue;
            }
        }
        for (i, &logit) in chunk.iter().enumerate() {
            let id = first + i as u32;
            if next_skip.next_if_eq(&id).is_some() {
                continue;
            }
            best.offer(id, logit);
        }
    }
    for &id in skipped.iter() {
        if let (Some(&logit), Some(&count)) = (logits.get(id as usize), counts.get(&id)) {
            if !logit.is_nan() {
                best.offer(id, apply_penalty(logit, count, params));
            }
        }
    }
    best.finish();
}

/// A buffer of at least the `k` best offers so far: once it holds `4k` it keeps the best `k`
/// and their worst becomes the bar that later offers must pass.
struct Best<'a> {
    k: usize,
    /// Offers held before a trim (`4k`).
    room: usize,
    kept: &'a mut Vec<(u32, f32)>,
    /// The worst of the `k` kept at the last trim.
    bar: Option<(u32, f32)>,
}

impl<'a> Best<'a> {
    /// For `k` of a row of `len` logits (`k` as large as the caller likes).
    fn new(k: usize, len: usize, kept: &'a mut Vec<(u32, f32)>) -> Best<'a> {
        let room = k.saturating_mul(4);
        kept.clear();
        kept.reserve(room.min(len));
        Best {
            k,
            room,
            kept,
            bar: None,
        }
    }

    fn offer(&mut self, id: u32, logit: f32) {
        if !logit.is_finite() {
            return;
        }
        if let Some(bar) = self.bar {
            // Most logits fail the plain comparison; equal ones (ties, ±0) take the order.
            if logit < bar.1 || by_logit_desc(&(id, logit), &bar) != Ordering::Less {
                return;
            }
        }
        self.kept.push((id, logit));
        if self.kept.len() == self.room {
            self.trim();
        }
    }

    /// Keeps the best `k` and makes their worst the bar.
    fn trim(&mut self) {
        self.kept.select_nth_unstable_by(self.k - 1, by_logit_desc);
        self.kept.truncate(self.k);
        self.bar = self.kept.iter().copied().max_by(by_logit_desc);
    }

    /// The best `k` (all, when fewer), sorted best first.
    fn finish(mut self) {
        if self.kept.len() > self.k {
            self.trim();
        }
        self.kept.sort_unstable_by(by_logit_desc);
    }
}
