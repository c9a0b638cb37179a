//! One weight row against N activations at once, AVX-512: the AVX2 batched kernels of
//! decoded grid rows and Q2_K (`avx2::many`) with two 32-byte pieces per vector and
//! `vpdpwssd` for the scale `madd` and the add. Q4_K / Q5_K stay on AVX2: the same
//! structure measured 5–15 % slower on Zen 4 (no instruction saved per activation; the
//! per-row unpacking costs more in 512 bits).

use super::{fold_halves, load_512, load_i16x32, Acts};
use crate::fast::avx2::many::{block_of, block_quants};
use crate::fast::avx2::{f16_at, hsum_f32x8, load_256};
use crate::fast::decoded::DecodedRow;
use crate::fast::scalar::{f32_at, Q8K_QS};
use std::arch::x86_64::*;

/// The upper 16 of 32 i16 lanes: the second 32-byte piece of a vector.
const UPPER_WORDS: __mmask32 = 0xffff_0000;

/// The high i16 of every i32 lane.
const HIGH_WORDS: __mmask32 = 0xaaaa_aaaa;

/// [`crate::fast::avx2::many::dot_decoded_xn`] four sub-blocks per step, with one
/// multiply per sub-block and token where AVX2 has two. Vector A holds sub-blocks
/// 4g, 4g + 1, vector B 4g + 2, 4g + 3. Per lane, `vpdpbusd` sums four products of the
/// biased activation and the weights onto `−128·Σw` (computed once per row): the exact
/// unbiased sum, |Σ q8·w| ≤ 4·127·43, which fits an i16. A's sums go to the low words, B's
/// to the high words, and one `vpdpwssd` multiplies both by their sub-blocks' scales and
/// adds them: lane j of the lower half sums sub-blocks 4g and 4g + 2, the upper half
/// 4g + 1 and 4g + 3, each times the scale the AVX2 kernel's `madd` applies to that
/// lane. This relies on the decoders' layout: both i16 scales of a lane are equal (one
/// scale per 8 lanes). Folded, the lanes are exactly AVX2's block sums (offsets included),
/// and the float step is the same.
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
pub(super) fn dot_decoded_xn<const N: usize>(row: &DecodedRow, ys: Acts<'_, N>) -> [f32; N] {
    let bias = _mm512_set1_epi8(i8::MIN);
    let zero = _mm512_setzero_si512();
    let mut acc = [_mm256_setzero_ps(); N];
    let blocks = row
        .d
        .iter()
        .zip(row.w.chunks_exact(256))
        .zip(row.scales.chunks_exact(128));
    for (blk, ((&d, w), scales)) in blocks.enumerate() {
        let (Some(w), Some(scales), Some((dy, quants))) = (
            w.first_chunk::<256>(),
            scales.first_chunk::<128>(),
            block_quants(ys, blk),
        ) else {
            break;
        };
        let mut sumi = [zero; N];
        for g in 0..2 {
            let (w_a, w_b) = (load_512(&w[128 * g..]), load_512(&w[128 * g + 64..]));
            // −128·Σw per lane: what the bias adds to each lane of `vpdpbusd`.
            let unbias_a = _mm512_sub_epi32(zero, _mm512_dpbusd_epi32(zero, bias, w_a));
            let unbias_b = _mm512_sub_epi32(zero, _mm512_dpbusd_epi32(zero, bias, w_b));
            let scales = _mm512_mask_blend_epi16(
                HIGH_WORDS,
                load_i16x32(&scales[64 * g..]),
                load_i16x32(&scales[64 * g + 32..]),
            );
            for t in 0..N {
                let q8_a = _mm512_xor_si512(load_512(&quants[t][128 * g..]), bias);
                let q8_b = _mm512_xor_si512(load_512(&quants[t][128 * g + 64..]), bias);
                let sums_a = _mm512_dpbusd_epi32(unbias_a, q8_a, w_a);
                let sums_b = _mm512_dpbusd_epi32(unbias_b, q8_b, w_b);
                let packed =
                    _mm512_mask_blend_epi16(HIGH_WORDS, sums_a, _mm512_slli_epi32::<16>(sums_b));
                sumi[t] = _mm512_dpwssd_epi32(sumi[t], packed, scales);
            }
        }
        for t in 0..N {
            let d = _mm256_set1_ps(d * dy[t]);
            acc[t] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(fold_halves(sumi[t])), d, acc[t]);
        }
    }
    let mut out = [0f32; N];
    for t in 0..N {
        out[t] = 0.125 * hsum_f32x8(acc[t]);
    }
    out
}

/// `vpermw` indices: word i of spread g takes Q2_K scale 4g + i/8 (8 lanes of i16 pairs
/// per 16-value group).
static SCALE_SPREAD: [[i16; 32]; 4] = scale_spread();

const fn scale_spread() -> [[i16; 32]; 4] {
    let mut out = [[0i16; 32]; 4];
    let mut g = 0;
    while g < 4 {
        let mut i = 0;
        while i < 32 {
            out[g][i] = (4 * g + i / 8) as i16;
            i += 1;
        }
        g += 1;
    }
    out
}

/// [`crate::fast::avx2::many::q2_k_xn`] two 32-value groups per vector: the 2-bit codes
/// of shifts 2p and 2p + 2 of the same 32 packed bytes, against 64 contiguous activation
/// bytes, with the four 16-value scales spread over the vector's quarters.
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
pub(super) fn q2_k_xn<const N: usize>(row: &[u8], ys: Acts<'_, N>) -> [f32; N] {
    let mut acc = [_mm256_setzero_ps(); N];
    let mut acc_min = [_mm256_setzero_ps(); N];
    let two_bits = _mm512_set1_epi8(3);
    for (blk, x) in row.chunks_exact(84).enumerate() {
        let yb = block_of(ys, blk);
        let packed = crate::fast::avx2::load_128(x);
        crate::fast::avx2::many::q2_k_add_mins(x, packed, yb, &mut acc_min);
        let all_scales = _mm512_castsi256_si512(_mm256_cvtepu8_epi16(_mm_and_si128(
            packed,
            _mm_set1_epi8(0x0f),
        )));
        let mut sumi = [_mm512_setzero_si512(); N];
        for half in 0..2 {
            let bits = _mm512_broadcast_i64x4(load_256(&x[16 + 32 * half..]));
            // Lower half: shift 0, upper: shift 2; then 4 for the next pair.
            let mut bits = _mm512_mask_srli_epi16::<2>(bits, UPPER_WORDS, bits);
            for pp in 0..2 {
                let codes = _mm512_and_si512(bits, two_bits);
                bits = _mm512_srli_epi16::<4>(bits);
                let spread = load_i16x32(&SCALE_SPREAD[2 * half + pp]);
                let scales = _mm512_permutexvar_epi16(spread, all_scales);
                let n = 128 * half + 64 * pp;
                for t in 0..N {
                    let pairs = _mm512_maddubs_epi16(codes, load_512(&yb[t][Q8K_QS + n..]));
                    sumi[t] = _mm512_dpwssd_epi32(sumi[t], pairs, scales);
                }
            }
        }
        for t in 0..N {
            let dall = _mm256_set1_ps(f32_at(yb[t], 0) * f16_at(x, 80));
            acc[t] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(fold_halves(sumi[t])), dall, acc[t]);
        }
    }
    let mut out = [0f32; N];
    for t in 0..N {
        out[t] = hsum_f32x8(acc[t]) - hsum_f32x8(acc_min[t]);
    }
    out
}
