//! The AVX-512 VNNI body of [`crate::fast::tile`]: up to 8 decoded weight rows against a
//! tile of 16 tokens per pass, each row's 16 (row, token) sums in one vector.
// Index loops mirror the register tiles (several arrays of registers share one index).
#![allow(clippy::needless_range_loop)]

use std::arch::x86_64::*;

use redlite_gguf::GgmlType;

use crate::fast::decoded::DecodedRow;
use crate::fast::tile::ActTile;

/// Rows per pass: 3 vectors a row (unit sums, block sums, f32 sums) of the 32 registers.
const ROWS: usize = 8;

/// How a type's scales apply.
#[derive(Clone, Copy)]
enum Kind {
    /// One scale per 32 values.
    Wide,
    /// One scale per 16 values.
    Narrow,
    /// One scale and one min per 32 values (Q4_K).
    WithMins,
}

/// See [`crate::fast::tile::dot_decoded_tile`]; the caller checked the CPU, the types and
/// every length (each row holds `blocks` blocks of weights, scales and offsets, `out`
/// reaches `(rows − 1) · stride + tokens`).
pub(crate) fn dot_rows(
    ty: GgmlType,
    rows: &[DecodedRow],
    tile: &ActTile,
    out: &mut [f32],
    stride: usize,
) {
    // IQ2_XXS and Q4_K have one scale per 32 values (both halves of a sub-block), the others
    // one per 16; Q4_K alone has mins.
    let kind = match ty {
        GgmlType::IQ2XXS => Kind::Wide,
        GgmlType::Q4K => Kind::WithMins,
        _ => Kind::Narrow,
    };
    for (i, group) in rows.chunks(ROWS).enumerate() {
        let out = &mut out[i * ROWS * stride..];
        macro_rules! pass {
            ($($m:literal)*) => {
                match (group.len(), kind) {
                    // SAFETY: the caller checked the CPU's features and the lengths.
                    $(($m, Kind::Wide) => unsafe { pass::<$m, 32, false>(group, tile, out, stride) },
                    ($m, Kind::Narrow) => unsafe { pass::<$m, 16, false>(group, tile, out, stride) },
                    ($m, Kind::WithMins) => unsafe { pass::<$m, 32, true>(group, tile, out, stride) },)*
                    _ => {}
                }
            };
        }
        pass!(1 2 3 4 5 6 7 8);
    }
}

/// `M` rows against the tile, scales per `UNIT` values, with Q4_K's mins if `MINS`.
///
/// Per block: each row's sum starts at the sum of its [`DecodedRow::offsets`] (−128·Σ over
/// the block of weight · scale: what the biased activation codes add), each unit's
/// `vpdpbusd` chain (exact: at most 32 · 255 · 43 in magnitude) is multiplied by the unit's
/// scale and added, and the block's exact i32 sum is converted and scaled by `d · dy`.
/// With mins, `dmin · dy · Σ min · (the unit's code sum)` is subtracted (also an exact i32
/// sum first). The grid types' sums carry a factor 8 (their scales are `2s + 1`, the value
/// scale being `(2s + 1) / 8`), removed at the end.
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
unsafe fn pass<const M: usize, const UNIT: usize, const MINS: bool>(
    rows: &[DecodedRow],
    tile: &ActTile,
    out: &mut [f32],
    stride: usize,
) {
    let (tokens, blocks, q, dy, sums) = tile.raw();
    let rows: [&DecodedRow; M] = std::array::from_fn(|m| &rows[m]);
    let mut acc = [_mm512_setzero_ps(); M];
    for b in 0..blocks {
        let mut block: [__m512i; M] = std::array::from_fn(|m| {
            _mm512_set1_epi32(rows[m].offsets[8 * b..8 * b + 8].iter().sum())
        });
        for u in 0..256 / UNIT {
            let first = 256 * b + UNIT * u;
            let mut unit = [_mm512_setzero_si512(); M];
            for k in 0..UNIT / 4 {
                // SAFETY: the tile holds 64 bytes per 4 values of its length, which is the
                // rows' length; each row holds 256 weight bytes per block.
                let a = unsafe { _mm512_loadu_si512(q.as_ptr().add((first / 4 + k) * 64).cast()) };
                for m in 0..M {
                    let w = unsafe {
                        rows[m]
                            .w
                            .as_ptr()
                            .add(first + 4 * k)
                            .cast::<i32>()
                            .read_unaligned()
                    };
                    unit[m] = _mm512_dpbusd_epi32(unit[m], a, _mm512_set1_epi32(w));
                }
            }
            // The scale lanes of sub-block `first / 32`: 8 for its low half, 8 for its high.
            let scale_at = first / 32 * 16 + first % 32 / 16 * 8;
            for m in 0..M {
                let scale = _mm512_set1_epi32(i32::from(rows[m].scales[scale_at]));
                block[m] = _mm512_add_epi32(block[m], _mm512_mullo_epi32(unit[m], scale));
            }
        }
        // SAFETY: the tile holds 16 scales per block.
        let dy = unsafe { _mm512_loadu_ps(dy.as_ptr().add(16 * b)) };
        for m in 0..M {
            let d = _mm512_mul_ps(dy, _mm512_set1_ps(rows[m].d[b]));
            acc[m] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(block[m]), d, acc[m]);
        }
        if MINS {
            let mut min_sum = [_mm512_setzero_si512(); M];
            for s in 0..8 {
                // SAFETY: the tile holds 16 code sums per 32 values.
                let codes =
                    unsafe { _mm512_loadu_si512(sums.as_ptr().add((8 * b + s) * 16).cast()) };
                for m in 0..M {
                    let min = _mm512_set1_epi32(i32::from(rows[m].mins[8 * b + s]));
                    min_sum[m] = _mm512_add_epi32(min_sum[m], _mm512_mullo_epi32(codes, min));
                }
            }
            for m in 0..M {
                let dmin = _mm512_mul_ps(dy, _mm512_set1_ps(rows[m].dmin[b]));
                acc[m] = _mm512_fnmadd_ps(_mm512_cvtepi32_ps(min_sum[m]), dmin, acc[m]);
            }
        }
    }
    let unscale = _mm512_set1_ps(if MINS { 1.0 } else { 0.125 });
    let live: __mmask16 = if tokens >= 16 {
        0xffff
    } else {
        (1u16 << tokens) - 1
    };
    for m in 0..M {
        let v = _mm512_mul_ps(acc[m], unscale);
        // SAFETY: the caller checked that `out` reaches row M − 1's last live token.
        unsafe { _mm512_mask_storeu_ps(out.as_mut_ptr().add(m * stride), live, v) };
    }
}
