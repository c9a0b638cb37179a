//! One weight row against N activations at once (prompt processing). Each weight vector
//! is loaded and unpacked once and used N times, and the per-block scale work is shared.
//! For every activation the integer vectors, their order and the float operations are those
//! of the one-activation kernel, so each result is bit-identical to it.

use super::decoded::{load_i16, load_i32, load_i8};
use super::{f16_at, hsum_f32x4, hsum_f32x8, load_256};
use crate::fast::decoded::DecodedRow;
use crate::fast::scalar::{f32_at, scales_mins_k4, Q8K_BSUMS, Q8K_BYTES, Q8K_QS};
use std::arch::x86_64::*;

/// N Q8_K activations, each as long as the row.
pub(crate) type Acts<'a, const N: usize> = [&'a [u8]; N];

/// Block `blk` of each activation.
#[inline(always)]
pub(crate) fn block_of<const N: usize>(ys: Acts<'_, N>, blk: usize) -> Acts<'_, N> {
    let base = blk * Q8K_BYTES;
    // A plain loop, not `map`: a closure would not inherit the caller's target features
    // and is called out of line (an AVX-SSE transition per block).
    let mut blocks: Acts<'_, N> = [&[]; N];
    for t in 0..N {
        blocks[t] = &ys[t][base..base + Q8K_BYTES];
    }
    blocks
}

/// Block `blk` of each activation: its scale and its 256 quants as a fixed-size array, so
/// that the sub-block offsets into it need no bounds checks (`None`: an activation is too
/// short, which the callers' length checks rule out).
#[inline(always)]
pub(crate) fn block_quants<const N: usize>(
    ys: Acts<'_, N>,
    blk: usize,
) -> Option<([f32; N], [&[u8; 256]; N])> {
    let base = blk * Q8K_BYTES;
    let mut scales = [0f32; N];
    let mut quants: [&[u8; 256]; N] = [&[0; 256]; N];
    // A plain loop, not `map` (see `block_of`).
    for t in 0..N {
        let block = ys[t].get(base..base + Q8K_BYTES)?;
        scales[t] = f32_at(block, 0);
        quants[t] = block[Q8K_QS..].first_chunk::<256>()?;
    }
    Some((scales, quants))
}

/// The dot of a decoded row (`fast::decoded`) with N activations: the same i32 block sums
/// and float order as the row kernels of IQ2_XXS, IQ2_XS and IQ1_M (through the biased
/// activation); each decoded weight vector and its scales are loaded once per sub-block
/// and used N times. Width 1 is the one-activation dot.
#[target_feature(enable = "avx2,fma,f16c")]
pub(crate) fn dot_decoded_xn<const N: usize>(row: &DecodedRow, ys: Acts<'_, N>) -> [f32; N] {
    let bias = _mm256_set1_epi8(i8::MIN);
    let mut acc = [_mm256_setzero_ps(); N];
    let blocks = row
        .d
        .iter()
        .zip(row.w.chunks_exact(256))
        .zip(row.scales.chunks_exact(128))
        .zip(row.offsets.chunks_exact(8));
    for (blk, (((&d, w), scales), offsets)) in blocks.enumerate() {
        let (Some(w), Some(scales), Some((dy, quants))) = (
            w.first_chunk::<256>(),
            scales.first_chunk::<128>(),
            block_quants(ys, blk),
        ) else {
            break;
        };
        let mut sumi = [load_i32(offsets); N];
        for ib in 0..8 {
            let w = load_i8(&w[32 * ib..32 * ib + 32]);
            let scales = load_i16(&scales[16 * ib..16 * ib + 16]);
            for t in 0..N {
                let q8 = _mm256_xor_si256(load_256(&quants[t][32 * ib..]), bias);
                let pairs = _mm256_maddubs_epi16(q8, w);
                sumi[t] = _mm256_add_epi32(sumi[t], _mm256_madd_epi16(pairs, scales));
            }
        }
        for t in 0..N {
            let d = _mm256_set1_ps(d * dy[t]);
            acc[t] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(sumi[t]), d, acc[t]);
        }
    }
    let mut out = [0f32; N];
    for t in 0..N {
        out[t] = 0.125 * hsum_f32x8(acc[t]);
    }
    out
}

/// [`super::kquants`]' Q4_K / Q5_K kernel for N activations.
#[target_feature(enable = "avx2,fma,f16c")]
pub(crate) fn affine_k_xn<const N: usize, const FIVE_BIT: bool>(
    row: &[u8],
    ys: Acts<'_, N>,
) -> [f32; N] {
    let five_bit = FIVE_BIT;
    let block_bytes = if five_bit { 176 } else { 144 };
    let mut acc = [_mm256_setzero_ps(); N];
    let mut acc_min = [_mm_setzero_ps(); N];
    for (blk, x) in row.chunks_exact(block_bytes).enumerate() {
        let yb = block_of(ys, blk);
        let (scales, mins) = scales_mins_k4(&x[4..16]);
        for t in 0..N {
            let dmin = _mm_set1_ps(f32_at(yb[t], 0) * f16_at(x, 2));
            let min_sums = super::kquants::k4_min_sums(yb[t], mins);
            acc_min[t] = _mm_fmadd_ps(_mm_cvtepi32_ps(min_sums), dmin, acc_min[t]);
        }
        let mut high_bits = if five_bit {
            load_256(&x[16..])
        } else {
            _mm256_setzero_si256()
        };
        let mut sumi = [_mm256_setzero_si256(); N];
        for c in 0..4 {
            let (low, high) = super::kquants::k4_codes(x, five_bit.then_some(&mut high_bits), c);
            let scale_low = _mm256_set1_epi16(i16::from(scales[2 * c]));
            let scale_high = _mm256_set1_epi16(i16::from(scales[2 * c + 1]));
            for t in 0..N {
                let a = &yb[t][Q8K_QS + 64 * c..];
                let l = _mm256_maddubs_epi16(low, load_256(a));
                let h = _mm256_maddubs_epi16(high, load_256(&a[32..]));
                let l = _mm256_madd_epi16(l, scale_low);
                let h = _mm256_madd_epi16(h, scale_high);
                sumi[t] = _mm256_add_epi32(sumi[t], _mm256_add_epi32(l, h));
            }
        }
        for t in 0..N {
            let d = _mm256_set1_ps(f32_at(yb[t], 0) * f16_at(x, 0));
            acc[t] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(sumi[t]), d, acc[t]);
        }
    }
    let mut out = [0f32; N];
    for t in 0..N {
        out[t] = hsum_f32x8(acc[t]) - hsum_f32x4(acc_min[t]);
    }
    out
}

/// A Q2_K block's min terms for N activations (`packed`: its 16 scale/min bytes), added to
/// `acc_min` (the AVX-512 kernel shares it, for the same f32 steps).
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
pub(crate) fn q2_k_add_mins<const N: usize>(
    x: &[u8],
    packed: __m128i,
    yb: Acts<'_, N>,
    acc_min: &mut [__m256; N],
) {
    let mins = _mm256_cvtepu8_epi16(_mm_and_si128(
        _mm_srli_epi16::<4>(packed),
        _mm_set1_epi8(0x0f),
    ));
    for t in 0..N {
        let yd = f32_at(yb[t], 0);
        let min_sums = _mm256_madd_epi16(mins, load_256(&yb[t][Q8K_BSUMS..]));
        let dmin = _mm256_set1_ps(yd * f16_at(x, 82));
        acc_min[t] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(min_sums), dmin, acc_min[t]);
    }
}

/// [`super::kquants`]' Q2_K kernel for N activations: the 2-bit codes, the scales and the
/// mins are unpacked once per block and used N times.
#[target_feature(enable = "avx2,fma,f16c")]
pub(crate) fn q2_k_xn<const N: usize>(row: &[u8], ys: Acts<'_, N>) -> [f32; N] {
    let mut acc = [_mm256_setzero_ps(); N];
    let mut acc_min = [_mm256_setzero_ps(); N];
    let two_bits = _mm256_set1_epi8(3);
    for (blk, x) in row.chunks_exact(84).enumerate() {
        let yb = block_of(ys, blk);
        let packed = super::load_128(x);
        q2_k_add_mins(x, packed, yb, &mut acc_min);
        let mut sumi = [_mm256_setzero_si256(); N];
        for half in 0..2 {
            let mut bits = load_256(&x[16 + 32 * half..]);
            for p in 0..4 {
                let codes = _mm256_and_si256(bits, two_bits);
                bits = _mm256_srli_epi16::<2>(bits);
                let n = 128 * half + 32 * p;
                let s = n / 16;
                let scales =
                    super::split_scales(i16::from(x[s] & 0x0f), i16::from(x[s + 1] & 0x0f));
                for t in 0..N {
                    let pairs = _mm256_maddubs_epi16(codes, load_256(&yb[t][Q8K_QS + n..]));
                    sumi[t] = _mm256_add_epi32(sumi[t], _mm256_madd_epi16(pairs, scales));
                }
            }
        }
        for t in 0..N {
            let dall = _mm256_set1_ps(f32_at(yb[t], 0) * f16_at(x, 80));
            acc[t] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(sumi[t]), dall, acc[t]);
        }
    }
    let mut out = [0f32; N];
    for t in 0..N {
        out[t] = hsum_f32x8(acc[t]) - hsum_f32x8(acc_min[t]);
    }
    out
}
