//! The AVX2 dot of a decoded grid row with a Q8_K activation (see `fast::decoded`).

use super::iquants::SIGN_MASKS;
use super::{hsum_f32x8, load_256, split_scales, u64_le};
use crate::fast::decoded::DecodedRow;
use crate::fast::scalar::{f16_to_f32, f32_at, u16_at, Q8K_BYTES, Q8K_QS};
use crate::tables::{IQ2XS_GRID, IQ2XXS_GRID};
use std::arch::x86_64::*;

/// Same integer vectors and float order as the row kernels of IQ2_XXS, IQ2_XS and IQ1_M.
#[target_feature(enable = "avx2,fma,f16c")]
pub(crate) fn dot_decoded(row: &DecodedRow, act: &[u8]) -> f32 {
    let mut acc = _mm256_setzero_ps();
    for (blk, y) in act.chunks_exact(Q8K_BYTES).enumerate() {
        let mut sumi = _mm256_setzero_si256();
        for ib in 0..8 {
            let sub = blk * 8 + ib;
            let w = load_i8(&row.w[sub * 32..sub * 32 + 32]);
            let q8 = load_256(&y[Q8K_QS + 32 * ib..]);
            let pairs = _mm256_maddubs_epi16(_mm256_sign_epi8(w, w), _mm256_sign_epi8(q8, w));
            let scales = load_i16(&row.scales[sub * 16..sub * 16 + 16]);
            sumi = _mm256_add_epi32(sumi, _mm256_madd_epi16(pairs, scales));
        }
        let d = _mm256_set1_ps(row.d[blk] * f32_at(y, 0));
        acc = _mm256_fmadd_ps(_mm256_cvtepi32_ps(sumi), d, acc);
    }
    0.125 * hsum_f32x8(acc)
}

#[inline]
pub(super) fn load_i8(v: &[u8]) -> __m256i {
    debug_assert!(v.len() >= 32);
    // SAFETY: callers pass 32-element slices (`dot_decoded` checked the row and activation lengths); loadu has no alignment requirement.
    unsafe { _mm256_loadu_si256(v.as_ptr().cast()) }
}

#[inline]
pub(super) fn load_i16(v: &[i16]) -> __m256i {
    debug_assert!(v.len() >= 16);
    // SAFETY: callers pass 16-element slices (`dot_decoded` checked the row and activation lengths); loadu has no alignment requirement.
    unsafe { _mm256_loadu_si256(v.as_ptr().cast()) }
}

/// Four grid entries with their sign masks applied, stored as 32 weight bytes, and the
/// sub-block's 16 scale lanes.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
fn store_sub(out: &mut DecodedRow, sub: usize, grid: [u64; 4], signs: [u64; 4], scales: __m256i) {
    let g = grid.map(|v| v as i64);
    let m = signs.map(|v| v as i64);
    let w = _mm256_sign_epi8(
        _mm256_set_epi64x(g[3], g[2], g[1], g[0]),
        _mm256_set_epi64x(m[3], m[2], m[1], m[0]),
    );
    let dst = &mut out.w[sub * 32..sub * 32 + 32];
    // SAFETY: `dst` holds 32 bytes; storeu has no alignment requirement.
    unsafe { _mm256_storeu_si256(dst.as_mut_ptr().cast(), w) };
    let dst = &mut out.scales[sub * 16..sub * 16 + 16];
    // SAFETY: `dst` holds 16 i16 (32 bytes); storeu has no alignment requirement.
    unsafe { _mm256_storeu_si256(dst.as_mut_ptr().cast(), scales) };
}

/// IQ2_XS blocks (d @0, one u16 per group: 9-bit grid index, 7-bit sign index; scales @66),
/// decoded like [`decode_iq2xxs`].
#[target_feature(enable = "avx2,fma,f16c")]
pub(crate) fn decode_iq2xs(row: &[u8], out: &mut DecodedRow) {
    for (b, x) in row.chunks_exact(74).enumerate() {
        out.d[b] = f16_to_f32(u16_at(x, 0));
        for ib in 0..8 {
            let words = [0, 1, 2, 3].map(|l| u16_at(x, 2 + 8 * ib + 2 * l));
            let grid = words.map(|w| IQ2XS_GRID[usize::from(w & 511)]);
            let signs = words.map(|w| SIGN_MASKS[usize::from(w >> 9)]);
            let packed = i16::from(x[66 + ib]);
            let scales = split_scales(2 * (packed & 0x0f) + 1, 2 * (packed >> 4) + 1);
            store_sub(out, b * 8 + ib, grid, signs, scales);
        }
    }
}

/// IQ2_XXS blocks decoded with vector sign application: for each 32-value sub-block the four
/// grid entries take their signs in one `sign_epi8` (the masks hold −1 or +1 per byte), which
/// gives the same bytes as the portable decoder's two's-complement negation.
#[target_feature(enable = "avx2,fma,f16c")]
pub(crate) fn decode_iq2xxs(row: &[u8], out: &mut DecodedRow) {
    for (b, x) in row.chunks_exact(66).enumerate() {
        out.d[b] = f16_to_f32(u16::from_le_bytes([x[0], x[1]]));
        for (ib, word) in x[2..].chunks_exact(8).enumerate() {
            // Four grid indices, then 4 × 7 sign bits and the scale in the top four bits.
            let word = u64_le(word);
            let grid = [0, 1, 2, 3].map(|l| IQ2XXS_GRID[((word >> (8 * l)) & 0xff) as usize]);
            let signs = [0, 1, 2, 3].map(|l| SIGN_MASKS[((word >> (32 + 7 * l)) & 127) as usize]);
            let scales = _mm256_set1_epi16(2 * (word >> 60) as i16 + 1);
            store_sub(out, b * 8 + ib, grid, signs, scales);
        }
    }
}
