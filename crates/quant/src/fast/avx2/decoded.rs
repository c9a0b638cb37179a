//! The AVX2 dot of a decoded grid row with a Q8_K activation (see `fast::decoded`).

use super::{hsum_f32x8, load_256};
use crate::fast::decoded::DecodedRow;
use crate::fast::scalar::{f32_at, Q8K_BYTES, Q8K_QS};
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
