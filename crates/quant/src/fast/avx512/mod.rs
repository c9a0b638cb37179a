//! AVX-512 (F, BW, VL, VNNI) kernels, and the only way to reach them: [`kernels`], which
//! hands out the table after checking the CPU's features.
//!
//! Only the batched (prompt-processing) kernels of decoded grid rows (four activations or
//! more) and of Q2_K have AVX-512 bodies; everything else at this level (one-row dots,
//! Q4_K / Q5_K batches) runs the AVX2 kernels. Each kernel forms the same i32 lane sums as its AVX2
//! twin (exact integer math in another grouping: two 32-byte sub-blocks per 512-bit
//! vector, `vpdpwssd` fusing the scale `madd` with the add, the upper half added onto the
//! lower before any float work) and then does the same f32 operations in the same lane
//! order, so every result is bit-identical to the AVX2 level.

mod many;
pub(crate) mod tile;

use super::avx2;
use super::decoded::DecodedRow;
use super::dispatch::RowDots;
use redlite_gguf::GgmlType;
use std::arch::x86_64::*;

/// N Q8_K activations, each as long as the row.
type Acts<'a, const N: usize> = [&'a [u8]; N];

/// The row kernels of this level: AVX2's (no one-row AVX-512 kernel pays yet).
static KERNELS: RowDots = avx2::KERNELS;

/// Whether the CPU has everything the AVX-512 kernels are compiled for (AVX2, FMA and
/// F16C too, for the helpers they share with the AVX2 level).
fn detected() -> bool {
    avx2::kernels().is_some()
        && is_x86_feature_detected!("avx512f")
        && is_x86_feature_detected!("avx512bw")
        && is_x86_feature_detected!("avx512vl")
        && is_x86_feature_detected!("avx512vnni")
}

/// The AVX-512 kernels, or `None` where the CPU lacks one of the features.
pub(super) fn kernels() -> Option<&'static RowDots> {
    detected().then_some(&KERNELS)
}

/// Below this many activations the decoded-row kernel's per-row setup (the `−128·Σw`
/// lanes, the paired scales) does not pay: AVX2's kernel runs (same bits).
const DECODED_MIN_WIDTH: usize = 4;

/// One decoded grid row against N activations (`None` without AVX-512).
pub(super) fn dot_decoded_xn<const N: usize>(
    row: &DecodedRow,
    acts: Acts<'_, N>,
) -> Option<[f32; N]> {
    if !detected() {
        return None;
    }
    if N < DECODED_MIN_WIDTH {
        return avx2::dot_decoded_xn(row, acts);
    }
    // SAFETY: `detected` checked every feature the kernel is compiled for.
    Some(unsafe { many::dot_decoded_xn(row, acts) })
}

/// One Q2_K, Q4_K or Q5_K row against N Q8_K activations (`None` for other types or
/// without AVX-512): Q2_K here, Q4_K and Q5_K with AVX2's kernel.
pub(super) fn vec_dot_xn<const N: usize>(
    ty: GgmlType,
    row: &[u8],
    acts: Acts<'_, N>,
) -> Option<[f32; N]> {
    if !detected() {
        return None;
    }
    match ty {
        // SAFETY: `detected` checked every feature the kernel is compiled for.
        GgmlType::Q2K => Some(unsafe { many::q2_k_xn::<N>(row, acts) }),
        _ => avx2::vec_dot_xn(ty, row, acts),
    }
}

/// 64 bytes from the start of `bytes` (at least 64 long).
#[inline]
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
fn load_512(bytes: &[u8]) -> __m512i {
    let bytes = &bytes[..64];
    // SAFETY: `bytes` has 64 readable bytes; loadu has no alignment requirement.
    unsafe { _mm512_loadu_si512(bytes.as_ptr().cast()) }
}

/// 32 i16 from the start of `v` (at least 32 long).
#[inline]
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
fn load_i16x32(v: &[i16]) -> __m512i {
    let v = &v[..32];
    // SAFETY: `v` has 32 readable i16 (64 bytes); loadu has no alignment requirement.
    unsafe { _mm512_loadu_si512(v.as_ptr().cast()) }
}

/// The eight i32 lanes of the AVX2 kernels from a 512-bit sum whose halves hold the
/// sums of alternate 32-byte pieces: the upper half added onto the lower (exact in i32).
#[inline]
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
fn fold_halves(v: __m512i) -> __m256i {
    _mm256_add_epi32(_mm512_castsi512_si256(v), _mm512_extracti64x4_epi64::<1>(v))
}
