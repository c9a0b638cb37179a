//! AVX2 k-quant kernels against Q8_K: Q2_K, Q4_K, Q5_K, Q6_K. Per block, the integer
//! sums of the reference go into eight i32 lanes (exact), then one FMA by `d · d8`.

use super::{f16_at, hsum_f32x4, hsum_f32x8, load_128, load_256, split_scales};
use crate::fast::scalar::{f32_at, scales_mins_k4, Q8K_BSUMS, Q8K_BYTES, Q8K_QS};
use std::arch::x86_64::*;

/// Q2_K: scales[16] @0 (low nibble scale, high nibble min), qs[64] @16, d @80, dmin @82.
#[target_feature(enable = "avx2,fma,f16c")]
pub(super) fn q2_k(row: &[u8], act: &[u8]) -> f32 {
    let (mut acc, mut acc_min) = (_mm256_setzero_ps(), _mm256_setzero_ps());
    let two_bits = _mm256_set1_epi8(3);
    for (x, y) in row.chunks_exact(84).zip(act.chunks_exact(Q8K_BYTES)) {
        let yd = f32_at(y, 0);
        let packed = load_128(x);
        let mins = _mm_and_si128(_mm_srli_epi16::<4>(packed), _mm_set1_epi8(0x0f));
        let min_sums = _mm256_madd_epi16(_mm256_cvtepu8_epi16(mins), load_256(&y[Q8K_BSUMS..]));
        let dmin = _mm256_set1_ps(yd * f16_at(x, 82));
        acc_min = _mm256_fmadd_ps(_mm256_cvtepi32_ps(min_sums), dmin, acc_min);

        let mut sumi = _mm256_setzero_si256();
        for half in 0..2 {
            let mut bits = load_256(&x[16 + 32 * half..]);
            for p in 0..4 {
                let codes = _mm256_and_si256(bits, two_bits);
                bits = _mm256_srli_epi16::<2>(bits);
                let n = 128 * half + 32 * p;
                let pairs = _mm256_maddubs_epi16(codes, load_256(&y[Q8K_QS + n..]));
                let s = n / 16;
                let scales = split_scales(i16::from(x[s] & 0x0f), i16::from(x[s + 1] & 0x0f));
                sumi = _mm256_add_epi32(sumi, _mm256_madd_epi16(pairs, scales));
            }
        }
        let dall = _mm256_set1_ps(yd * f16_at(x, 80));
        acc = _mm256_fmadd_ps(_mm256_cvtepi32_ps(sumi), dall, acc);
    }
    hsum_f32x8(acc) - hsum_f32x8(acc_min)
}

/// The min term of Q4_K / Q5_K: Σ_j bsums[j]·min[j/2] as four i32 lanes.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
pub(super) fn k4_min_sums(y: &[u8], mins: [u8; 8]) -> __m128i {
    let bsums = load_256(&y[Q8K_BSUMS..]);
    let pair_sums = _mm_hadd_epi16(
        _mm256_castsi256_si128(bsums),
        _mm256_extracti128_si256::<1>(bsums),
    );
    let mins = _mm_cvtepu8_epi16(_mm_cvtsi64_si128(i64::from_le_bytes(mins)));
    _mm_madd_epi16(mins, pair_sums)
}

/// The unsigned codes of chunk c (values 64c..64c+32, 64c+32..64c+64) of a Q4_K block
/// (qs @16) or, with `high_bits` (qh, shifted right by 2 per chunk), of a Q5_K block (qs
/// @48; bit s of qh[l] is bit 4 of value 32s + l).
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
pub(super) fn k4_codes(x: &[u8], high_bits: Option<&mut __m256i>, c: usize) -> (__m256i, __m256i) {
    let low4 = _mm256_set1_epi8(0x0f);
    let Some(high_bits) = high_bits else {
        let q = load_256(&x[16 + 32 * c..]);
        return (
            _mm256_and_si256(q, low4),
            _mm256_and_si256(_mm256_srli_epi16::<4>(q), low4),
        );
    };
    let q = load_256(&x[48 + 32 * c..]);
    let bit0 = _mm256_and_si256(*high_bits, _mm256_set1_epi8(1));
    let bit1 = _mm256_and_si256(*high_bits, _mm256_set1_epi8(2));
    *high_bits = _mm256_srli_epi16::<2>(*high_bits);
    (
        _mm256_or_si256(_mm256_and_si256(q, low4), _mm256_slli_epi16::<4>(bit0)),
        _mm256_or_si256(
            _mm256_and_si256(_mm256_srli_epi16::<4>(q), low4),
            _mm256_slli_epi16::<3>(bit1),
        ),
    )
}

/// The Q4_K (`five_bit` false, 144-byte blocks) / Q5_K (176-byte blocks) dot: d @0,
/// dmin @2, scales[12] @4, then the codes.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
fn affine_k(row: &[u8], act: &[u8], five_bit: bool) -> f32 {
    let block_bytes = if five_bit { 176 } else { 144 };
    let mut acc = _mm256_setzero_ps();
    let mut acc_min = _mm_setzero_ps();
    for (x, y) in row
        .chunks_exact(block_bytes)
        .zip(act.chunks_exact(Q8K_BYTES))
    {
        let yd = f32_at(y, 0);
        let (scales, mins) = scales_mins_k4(&x[4..16]);
        let dmin = _mm_set1_ps(yd * f16_at(x, 2));
        acc_min = _mm_fmadd_ps(_mm_cvtepi32_ps(k4_min_sums(y, mins)), dmin, acc_min);

        let mut high_bits = if five_bit {
            load_256(&x[16..])
        } else {
            _mm256_setzero_si256()
        };
        let mut sumi = _mm256_setzero_si256();
        for c in 0..4 {
            let (low, high) = k4_codes(x, five_bit.then_some(&mut high_bits), c);
            let a = &y[Q8K_QS + 64 * c..];
            let low = _mm256_maddubs_epi16(low, load_256(a));
            let high = _mm256_maddubs_epi16(high, load_256(&a[32..]));
            let low = _mm256_madd_epi16(low, _mm256_set1_epi16(i16::from(scales[2 * c])));
            let high = _mm256_madd_epi16(high, _mm256_set1_epi16(i16::from(scales[2 * c + 1])));
            sumi = _mm256_add_epi32(sumi, _mm256_add_epi32(low, high));
        }
        let d = _mm256_set1_ps(yd * f16_at(x, 0));
        acc = _mm256_fmadd_ps(_mm256_cvtepi32_ps(sumi), d, acc);
    }
    hsum_f32x8(acc) - hsum_f32x4(acc_min)
}

#[target_feature(enable = "avx2,fma,f16c")]
pub(super) fn q4_k(row: &[u8], act: &[u8]) -> f32 {
    affine_k(row, act, false)
}

#[target_feature(enable = "avx2,fma,f16c")]
pub(super) fn q5_k(row: &[u8], act: &[u8]) -> f32 {
    affine_k(row, act, true)
}

/// Q6_K: ql[128] @0, qh[64] @128, int8 scales[16] @192, d @208. Codes are taken unsigned
/// (0..64) and the −32 offset applied once per block through the group sums.
#[target_feature(enable = "avx2,fma,f16c")]
pub(super) fn q6_k(row: &[u8], act: &[u8]) -> f32 {
    let mut acc = _mm256_setzero_ps();
    let low4 = _mm256_set1_epi8(0x0f);
    let bits45 = _mm256_set1_epi8(0x30);
    for (x, y) in row.chunks_exact(210).zip(act.chunks_exact(Q8K_BYTES)) {
        let scales16 = _mm256_cvtepi8_epi16(load_128(&x[192..]));
        let offset_sums = _mm256_madd_epi16(scales16, load_256(&y[Q8K_BSUMS..]));
        let mut sumi = _mm256_setzero_si256();
        for half in 0..2 {
            let ql_a = load_256(&x[64 * half..]);
            let ql_b = load_256(&x[64 * half + 32..]);
            let qh = load_256(&x[128 + 32 * half..]);
            let codes = [
                _mm256_or_si256(
                    _mm256_and_si256(ql_a, low4),
                    _mm256_and_si256(_mm256_slli_epi16::<4>(qh), bits45),
                ),
                _mm256_or_si256(
                    _mm256_and_si256(ql_b, low4),
                    _mm256_and_si256(_mm256_slli_epi16::<2>(qh), bits45),
                ),
                _mm256_or_si256(
                    _mm256_and_si256(_mm256_srli_epi16::<4>(ql_a), low4),
                    _mm256_and_si256(qh, bits45),
                ),
                _mm256_or_si256(
                    _mm256_and_si256(_mm256_srli_epi16::<4>(ql_b), low4),
                    _mm256_and_si256(_mm256_srli_epi16::<2>(qh), bits45),
                ),
            ];
            for (k, &codes) in codes.iter().enumerate() {
                let n = 128 * half + 32 * k;
                let pairs = _mm256_maddubs_epi16(codes, load_256(&y[Q8K_QS + n..]));
                let s = 192 + n / 16;
                let scales = split_scales(i16::from(x[s] as i8), i16::from(x[s + 1] as i8));
                sumi = _mm256_add_epi32(sumi, _mm256_madd_epi16(pairs, scales));
            }
        }
        let sumi = _mm256_sub_epi32(sumi, _mm256_slli_epi32::<5>(offset_sums));
        let d = _mm256_set1_ps(f32_at(y, 0) * f16_at(x, 208));
        acc = _mm256_fmadd_ps(_mm256_cvtepi32_ps(sumi), d, acc);
    }
    hsum_f32x8(acc)
}
