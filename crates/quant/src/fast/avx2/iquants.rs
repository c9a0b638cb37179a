//! AVX2 codebook kernels against Q8_K: IQ2_XXS, IQ2_XS, IQ1_M. Each group of 8 values is
//! one u64 grid entry; four groups (a 32-value sub-block) fill one vector.

use super::decoded::{grid_pair, sign_bytes, IQ2XXS_SIGN_BIT, IQ2XXS_SIGN_BYTE};
use super::{f16_at, hsum_f32x8, load_256, split_scales, u64_le};
use crate::fast::scalar::{f16_to_f32, f32_at, iq1m_d, u16_at, Q8K_BYTES, Q8K_QS};
use crate::tables::{IQ1S_GRID, IQ2XS_GRID, IQ2XXS_GRID};
use std::arch::x86_64::*;

/// For a 7-bit sign index (IQ2_XXS, IQ2_XS): eight bytes, 0xff (−1) where the value is
/// negative and 0x01 where positive; the eighth sign makes the popcount even, as
/// `KSIGNS_IQ2XS` says. Used with `sign_epi8`, which needs a nonzero byte everywhere.
pub(crate) static SIGN_MASKS: [u64; 128] = sign_masks();

const fn sign_masks() -> [u64; 128] {
    let mut masks = [0u64; 128];
    let mut index = 0usize;
    while index < 128 {
        let signs = index | ((index.count_ones() as usize & 1) << 7);
        let mut mask = 0u64;
        let mut j = 0;
        while j < 8 {
            let byte: u64 = if signs & (1 << j) != 0 { 0xff } else { 0x01 };
            mask |= byte << (8 * j);
            j += 1;
        }
        masks[index] = mask;
        index += 1;
    }
    masks
}

/// Four u64 entries as one vector, entry 0 lowest.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
fn entries(e: [u64; 4]) -> __m256i {
    _mm256_set_epi64x(e[3] as i64, e[2] as i64, e[1] as i64, e[0] as i64)
}

/// One sub-block of IQ2_XXS / IQ2_XS: Σ grid·sign·q8 as i16 pairs (≤ 2·43·127).
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
fn grid_pairs(grid: [u64; 4], signs: [u64; 4], q8: &[u8]) -> __m256i {
    let q8 = _mm256_sign_epi8(load_256(q8), entries(signs));
    _mm256_maddubs_epi16(entries(grid), q8)
}

/// The f16 at `offset` of `bytes`, widened with F16C (exact, as [`f16_at`]).
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
pub(super) fn f16c_at(bytes: &[u8], offset: usize) -> f32 {
    let bits = i32::from(u16_at(bytes, offset));
    _mm_cvtss_f32(_mm_cvtph_ps(_mm_cvtsi32_si128(bits)))
}

/// One IQ2_XXS sub-block (`word`: four grid indices, then 4 × 7 sign bits and the scale in
/// the top four bits) against 32 Q8_K values: eight i32 lanes. The signs are built in
/// vector registers from the broadcast sign word (`decoded::sign_bytes`: the same ±1 bytes
/// as a `SIGN_MASKS` lookup, without the four loads and inserts).
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
fn iq2_xxs_sub(word: u64, q8: &[u8], sign_byte: __m256i, sign_bit: __m256i) -> __m256i {
    let index = |l: u64| ((word >> (8 * l)) & 0xff) as usize;
    let magnitudes = _mm256_set_m128i(
        grid_pair(&IQ2XXS_GRID, index(2), index(3)),
        grid_pair(&IQ2XXS_GRID, index(0), index(1)),
    );
    let bits = _mm256_set1_epi32((word >> 32) as i32);
    let q8 = _mm256_sign_epi8(load_256(q8), sign_bytes(bits, sign_byte, sign_bit));
    let pairs = _mm256_maddubs_epi16(magnitudes, q8);
    _mm256_madd_epi16(pairs, _mm256_set1_epi16(2 * (word >> 60) as i16 + 1))
}

/// IQ2_XXS: d @0; per sub-block ib one u64 @2 + 8ib: four grid indices, then 4 × 7 sign
/// bits and the scale in bits 60..64. Two sub-blocks per step into two integer sums (exact,
/// so the block sum is the same vector as one sub-block at a time).
#[target_feature(enable = "avx2,fma,f16c")]
pub(super) fn iq2_xxs(row: &[u8], act: &[u8]) -> f32 {
    let sign_byte = load_256(&IQ2XXS_SIGN_BYTE);
    let sign_bit = load_256(&IQ2XXS_SIGN_BIT);
    let mut acc = _mm256_setzero_ps();
    for (x, y) in row.chunks_exact(66).zip(act.chunks_exact(Q8K_BYTES)) {
        let q8 = &y[Q8K_QS..Q8K_QS + 256];
        let (mut even, mut odd) = (_mm256_setzero_si256(), _mm256_setzero_si256());
        for (w, q) in x[2..].chunks_exact(16).zip(q8.chunks_exact(64)) {
            even = _mm256_add_epi32(even, iq2_xxs_sub(u64_le(w), q, sign_byte, sign_bit));
            odd = _mm256_add_epi32(
                odd,
                iq2_xxs_sub(u64_le(&w[8..]), &q[32..], sign_byte, sign_bit),
            );
        }
        let sumi = _mm256_add_epi32(even, odd);
        let d = _mm256_set1_ps(f16c_at(x, 0) * f32_at(y, 0));
        acc = _mm256_fmadd_ps(_mm256_cvtepi32_ps(sumi), d, acc);
    }
    0.125 * hsum_f32x8(acc)
}

/// IQ2_XS: d @0, one u16 per group @2 (9-bit grid index, 7-bit sign index), scales[8] @66
/// (low nibble for groups 0-1, high nibble for groups 2-3).
#[target_feature(enable = "avx2,fma,f16c")]
pub(super) fn iq2_xs(row: &[u8], act: &[u8]) -> f32 {
    let mut acc = _mm256_setzero_ps();
    for (x, y) in row.chunks_exact(74).zip(act.chunks_exact(Q8K_BYTES)) {
        let mut sumi = _mm256_setzero_si256();
        for ib in 0..8 {
            let words = [0, 1, 2, 3].map(|l| u16_at(x, 2 + 8 * ib + 2 * l));
            let grid = words.map(|w| IQ2XS_GRID[usize::from(w & 511)]);
            let signs = words.map(|w| SIGN_MASKS[usize::from(w >> 9)]);
            let pairs = grid_pairs(grid, signs, &y[Q8K_QS + 32 * ib..]);
            let packed = i16::from(x[66 + ib]);
            let scales = split_scales(2 * (packed & 0x0f) + 1, 2 * (packed >> 4) + 1);
            sumi = _mm256_add_epi32(sumi, _mm256_madd_epi16(pairs, scales));
        }
        let d = _mm256_set1_ps(f16_at(x, 0) * f32_at(y, 0));
        acc = _mm256_fmadd_ps(_mm256_cvtepi32_ps(sumi), d, acc);
    }
    0.125 * hsum_f32x8(acc)
}

/// IQ1_M: qs[32] @0, qh[16] @32, scale words @48. Each value is `8·grid + δ` with grid in
/// {−1, 0, 1} and δ = ±1 per group (never 0, as `sign_epi8` needs), so one `maddubs`
/// gives 8·Σ grid·q8 + δ·Σ q8, the reference's `8·sumi + sumi_delta`; the final 1/8
/// turns it back.
#[target_feature(enable = "avx2,fma,f16c")]
pub(super) fn iq1_m(row: &[u8], act: &[u8]) -> f32 {
    const DELTA: [u64; 2] = [0x0101_0101_0101_0101, u64::MAX];
    let mut acc = _mm256_setzero_ps();
    let times8_mask = _mm256_set1_epi8(0xf8u8 as i8);
    for (x, y) in row.chunks_exact(56).zip(act.chunks_exact(Q8K_BYTES)) {
        let words = [0, 1, 2, 3].map(|k| u16_at(x, 48 + 2 * k));
        let mut sumi = _mm256_setzero_si256();
        for ib in 0..8 {
            // Group l's 4 bits of qh: 3 high grid-index bits, then the sign of δ.
            let qh = [0, 1, 2, 3].map(|l| usize::from(x[32 + 2 * ib + l / 2] >> (4 * (l % 2))));
            let grid =
                [0, 1, 2, 3].map(|l| IQ1S_GRID[usize::from(x[4 * ib + l]) | ((qh[l] & 7) << 8)]);
            let delta = qh.map(|h| DELTA[(h >> 3) & 1]);
            // Per byte g << 3: the bits a 16-bit shift carries across bytes are masked off.
            let grid8 = _mm256_and_si256(_mm256_slli_epi16::<3>(entries(grid)), times8_mask);
            let w = _mm256_add_epi8(grid8, entries(delta));
            let q8 = load_256(&y[Q8K_QS + 32 * ib..]);
            let pairs = _mm256_maddubs_epi16(_mm256_sign_epi8(w, w), _mm256_sign_epi8(q8, w));
            let word = words[ib / 2] >> (6 * (ib % 2));
            let scales = split_scales(2 * (word & 7) as i16 + 1, 2 * ((word >> 3) & 7) as i16 + 1);
            sumi = _mm256_add_epi32(sumi, _mm256_madd_epi16(pairs, scales));
        }
        let d = f16_to_f32(iq1m_d(words)) * f32_at(y, 0);
        acc = _mm256_fmadd_ps(_mm256_cvtepi32_ps(sumi), _mm256_set1_ps(d), acc);
    }
    0.125 * hsum_f32x8(acc)
}

#[cfg(test)]
mod tests {
    use super::SIGN_MASKS;
    use crate::tables::KSIGNS_IQ2XS;

    #[test]
    fn sign_masks_follow_ksigns() {
        for (mask, &signs) in SIGN_MASKS.iter().zip(KSIGNS_IQ2XS.iter()) {
            for j in 0..8 {
                let byte = (mask >> (8 * j)) as u8;
                let expected = if signs & (1 << j) != 0 { 0xff } else { 0x01 };
                assert_eq!(byte, expected);
            }
        }
    }
}
