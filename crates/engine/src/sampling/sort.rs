//! The whole row's candidates sorted as `by_logit_desc` sorts them (sampling without top-k
//! keeps every token, as OpenAI clients ask by default): a stable radix sort on the logit's
//! `total_cmp` key instead of a comparison sort of 151,936 pairs. Candidates in ascending id
//! order (as `Sampler::prepare` builds them) keep it among equal logits, so the order is the
//! comparison sort's exactly (its order is strict: the logit, then the id).

use super::by_logit_desc;

/// Fewer candidates than this take the comparison sort.
const RADIX_FROM: usize = 4096;
/// Bits of the key a pass sorts by (three passes cover 32).
const DIGIT_BITS: u32 = 11;

/// Sorts `candidates` (ids ascending) by descending logit, ties by ascending id; `spare` is
/// the passes' second buffer (kept by the caller, so a row's sort allocates nothing).
pub(super) fn sort_by_logit_desc(candidates: &mut Vec<(u32, f32)>, spare: &mut Vec<(u32, f32)>) {
    if candidates.len() < RADIX_FROM {
        candidates.sort_unstable_by(by_logit_desc);
        return;
    }
    spare.clear();
    spare.resize(candidates.len(), (0, 0.0));
    let mask = (1u32 << DIGIT_BITS) - 1;
    for shift in (0..32).step_by(DIGIT_BITS as usize) {
        let digit = |c: &(u32, f32)| ((descending_key(c.1) >> shift) & mask) as usize;
        let mut starts = [0usize; 1 << DIGIT_BITS];
        for c in candidates.iter() {
            starts[digit(c)] += 1;
        }
        let mut at = 0;
        for start in starts.iter_mut() {
            let count = *start;
            *start = at;
            at += count;
        }
        for c in candidates.iter() {
            let d = digit(c);
            spare[starts[d]] = *c;
            starts[d] += 1;
        }
        std::mem::swap(candidates, spare);
    }
}

/// A key whose ascending order is the logits' descending `total_cmp` order.
fn descending_key(logit: f32) -> u32 {
    let bits = logit.to_bits();
    // `total_cmp`'s key: negative values' bits inverted, positive ones' sign bit set.
    let ascending = bits ^ (((bits as i32) >> 31) as u32 | 0x8000_0000);
    !ascending
}
