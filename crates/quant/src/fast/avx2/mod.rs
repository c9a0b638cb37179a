//! AVX2 (+ FMA, F16C) row kernels, their shared helpers, and the only way to reach them:
//! [`kernels`], which hands out the table after checking the CPU's features.
//!
//! The integer core is `maddubs` (u8 × i8 → pairs of i16) then `madd` by the sub-block
//! scale (→ i32), exact for every format here; the scaled block sums are accumulated in
//! eight f32 lanes and summed once at the end.

pub(super) mod decoded;
mod iquants;
mod kquants;
pub(super) mod many;

use super::dispatch::RowDots;
use super::scalar::{f16_to_f32, f32_at, u16_at, Q8_0_BYTES};
use std::arch::x86_64::*;

/// The AVX2 table (also the one-row kernels of the AVX-512 level).
pub(super) const KERNELS: RowDots = RowDots {
    q8_0,
    q2_k,
    q4_k,
    q5_k,
    q6_k,
    iq2_xxs,
    iq2_xs,
    iq1_m,
    f32: f32_row,
    f16: f16_row,
};

/// The AVX2 kernels, or `None` where the CPU lacks AVX2, FMA or F16C.
pub(super) fn kernels() -> Option<&'static RowDots> {
    let detected = is_x86_feature_detected!("avx2")
        && is_x86_feature_detected!("fma")
        && is_x86_feature_detected!("f16c");
    detected.then_some(&KERNELS)
}

/// Safe entry points for the table: each calls a `#[target_feature]` kernel.
macro_rules! entry {
    ($($name:ident => $kernel:path),* $(,)?) => {
        $(
            fn $name(row: &[u8], act: &[u8]) -> f32 {
                // SAFETY: only reachable through the AVX2 and AVX-512 tables, which are
                // handed out after detecting (at least) avx2, fma and f16c.
                unsafe { $kernel(row, act) }
            }
        )*
    };
}

entry! {
    q8_0 => q8_0_avx2,
    q2_k => kquants::q2_k,
    q4_k => kquants::q4_k,
    q5_k => kquants::q5_k,
    q6_k => kquants::q6_k,
    iq2_xxs => iquants::iq2_xxs,
    iq2_xs => iquants::iq2_xs,
    iq1_m => iquants::iq1_m,
    f32_row => f32_avx2,
    f16_row => f16_avx2,
}

/// 32 bytes from the start of `bytes` (at least 32 long).
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
pub(super) fn load_256(bytes: &[u8]) -> __m256i {
    let bytes = &bytes[..32];
    // SAFETY: `bytes` has 32 readable bytes; loadu has no alignment requirement.
    unsafe { _mm256_loadu_si256(bytes.as_ptr().cast()) }
}

/// 16 bytes from the start of `bytes` (at least 16 long).
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
pub(super) fn load_128(bytes: &[u8]) -> __m128i {
    let bytes = &bytes[..16];
    // SAFETY: `bytes` has 16 readable bytes; loadu has no alignment requirement.
    unsafe { _mm_loadu_si128(bytes.as_ptr().cast()) }
}

/// Eight f32 from the start of `bytes` (at least 32 long).
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
fn load_f32x8(bytes: &[u8]) -> __m256 {
    let bytes = &bytes[..32];
    // SAFETY: `bytes` has 32 readable bytes; loadu has no alignment requirement.
    unsafe { _mm256_loadu_ps(bytes.as_ptr().cast()) }
}

/// The little-endian u64 at the start of `bytes` (0 where it is shorter than 8, which
/// callers rule out by taking 8-byte chunks): one load where bytewise reads take eight.
#[inline]
fn u64_le(bytes: &[u8]) -> u64 {
    bytes
        .first_chunk::<8>()
        .map_or(0, |b| u64::from_le_bytes(*b))
}

/// The f16 at `offset`, widened in general-purpose registers ([`f16_to_f32`]).
#[inline]
pub(super) fn f16_at(bytes: &[u8], offset: usize) -> f32 {
    f16_to_f32(u16_at(bytes, offset))
}

#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
fn hsum_f32x4(v: __m128) -> f32 {
    let v = _mm_add_ps(v, _mm_movehl_ps(v, v));
    _mm_cvtss_f32(_mm_add_ss(v, _mm_movehdup_ps(v)))
}

#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
pub(super) fn hsum_f32x8(v: __m256) -> f32 {
    hsum_f32x4(_mm_add_ps(
        _mm256_castps256_ps128(v),
        _mm256_extractf128_ps::<1>(v),
    ))
}

/// An i16 vector with `low` in its lower 128-bit half and `high` in its upper half: the
/// scales of two 16-value sub-blocks against a `maddubs` result of 32 values.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
fn split_scales(low: i16, high: i16) -> __m256i {
    _mm256_set_m128i(_mm_set1_epi16(high), _mm_set1_epi16(low))
}

/// Σ w·a over 32 int8 pairs as eight i32 lanes. |w| may be 128 (abs(−128) is 128 as u8)
/// and |a| ≤ 127, so no i16 pair saturates.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
fn dot_i8(w: __m256i, a: __m256i) -> __m256i {
    let pairs = _mm256_maddubs_epi16(_mm256_sign_epi8(w, w), _mm256_sign_epi8(a, w));
    _mm256_madd_epi16(pairs, _mm256_set1_epi16(1))
}

#[target_feature(enable = "avx2,fma,f16c")]
fn q8_0_avx2(row: &[u8], act: &[u8]) -> f32 {
    let mut acc = _mm256_setzero_ps();
    for (x, y) in row
        .chunks_exact(Q8_0_BYTES)
        .zip(act.chunks_exact(Q8_0_BYTES))
    {
        let sums = dot_i8(load_256(&x[2..]), load_256(&y[2..]));
        let d = _mm256_set1_ps(f16_at(x, 0) * f16_at(y, 0));
        acc = _mm256_fmadd_ps(_mm256_cvtepi32_ps(sums), d, acc);
    }
    hsum_f32x8(acc)
}

/// Four accumulators of eight lanes over 32 values per step; the tail in scalar.
#[target_feature(enable = "avx2,fma,f16c")]
fn f32_avx2(row: &[u8], act: &[u8]) -> f32 {
    let mut acc = [_mm256_setzero_ps(); 4];
    let (row_main, act_main) = (row.chunks_exact(128), act.chunks_exact(128));
    let (row_tail, act_tail) = (row_main.remainder(), act_main.remainder());
    for (w, a) in row_main.zip(act_main) {
        for (k, acc) in acc.iter_mut().enumerate() {
            let (w, a) = (load_f32x8(&w[32 * k..]), load_f32x8(&a[32 * k..]));
            *acc = _mm256_fmadd_ps(w, a, *acc);
        }
    }
    let sum = _mm256_add_ps(_mm256_add_ps(acc[0], acc[1]), _mm256_add_ps(acc[2], acc[3]));
    let mut tail = 0.0f32;
    for (w, a) in row_tail.chunks_exact(4).zip(act_tail.chunks_exact(4)) {
        tail += f32_at(w, 0) * f32_at(a, 0);
    }
    hsum_f32x8(sum) + tail
}

/// F16 weights against the F16 activation, widened with F16C; as [`f32_avx2`].
#[target_feature(enable = "avx2,fma,f16c")]
fn f16_avx2(row: &[u8], act: &[u8]) -> f32 {
    let mut acc = [_mm256_setzero_ps(); 4];
    let (row_main, act_main) = (row.chunks_exact(64), act.chunks_exact(64));
    let (row_tail, act_tail) = (row_main.remainder(), act_main.remainder());
    for (w, a) in row_main.zip(act_main) {
        for (k, acc) in acc.iter_mut().enumerate() {
            let w = _mm256_cvtph_ps(load_128(&w[16 * k..]));
            let a = _mm256_cvtph_ps(load_128(&a[16 * k..]));
            *acc = _mm256_fmadd_ps(w, a, *acc);
        }
    }
    let sum = _mm256_add_ps(_mm256_add_ps(acc[0], acc[1]), _mm256_add_ps(acc[2], acc[3]));
    let mut tail = 0.0f32;
    for (w, a) in row_tail.chunks_exact(2).zip(act_tail.chunks_exact(2)) {
        tail += f16_at(w, 0) * f16_at(a, 0);
    }
    hsum_f32x8(sum) + tail
}

/// One decoded grid row against N activations (`None` without AVX2).
pub(super) fn dot_decoded_xn<const N: usize>(
    row: &super::decoded::DecodedRow,
    acts: many::Acts<'_, N>,
) -> Option<[f32; N]> {
    // SAFETY: `kernels` returns `Some` only after detecting avx2, fma and f16c.
    kernels().map(|_| unsafe { many::dot_decoded_xn(row, acts) })
}

/// One Q2_K, Q4_K or Q5_K row against N Q8_K activations (`None` for other types or
/// without AVX2).
pub(super) fn vec_dot_xn<const N: usize>(
    ty: redlite_gguf::GgmlType,
    row: &[u8],
    acts: many::Acts<'_, N>,
) -> Option<[f32; N]> {
    kernels()?;
    // SAFETY: `kernels` returned `Some`, so avx2, fma and f16c were detected.
    match ty {
        redlite_gguf::GgmlType::Q4K => Some(unsafe { many::affine_k_xn::<N, false>(row, acts) }),
        redlite_gguf::GgmlType::Q5K => Some(unsafe { many::affine_k_xn::<N, true>(row, acts) }),
        redlite_gguf::GgmlType::Q2K => Some(unsafe { many::q2_k_xn::<N>(row, acts) }),
        _ => None,
    }
}

/// Decodes a grid row (buffers already sized) with AVX2: IQ2_XXS and IQ2_XS whole, IQ1_M's
/// values portably and its offsets here; `false` for other types or without AVX2.
pub(super) fn decode_grid_row(
    ty: redlite_gguf::GgmlType,
    row: &[u8],
    out: &mut super::decoded::DecodedRow,
) -> bool {
    use redlite_gguf::GgmlType;
    if kernels().is_none() || !matches!(ty, GgmlType::IQ2XXS | GgmlType::IQ2XS | GgmlType::IQ1M) {
        return false;
    }
    // SAFETY: `kernels` returned `Some`, so avx2, fma and f16c were detected.
    unsafe {
        match ty {
            GgmlType::IQ2XXS => decoded::decode_iq2xxs(row, out),
            GgmlType::IQ2XS => decoded::decode_iq2xs(row, out),
            _ => {
                super::decoded::decode_values(ty, row, out);
                decoded::fill_offsets(out);
            }
        }
    }
    true
}
