//! Register-tiled products of decoded rows (the grid types IQ2_XXS, IQ2_XS, IQ1_M, and Q4_K)
//! with many Q8_K activations, for prompt processing on CPUs with AVX-512 VNNI.
//!
//! The batched row kernels (`dot_decoded_many`) reload every activation for every weight
//! row and spend most of their instructions outside the multiplies (sign handling, scale
//! `madd`s, lane folding). Here the activations of up to [`TILE_TOKENS`] tokens are
//! interleaved once per product ([`ActTile`]: 4 codes of each token side by side, so one
//! 64-byte vector holds the next 4 codes of 16 tokens), and each weight row contributes a
//! broadcast of its next 4 codes: one `vpdpbusd` then advances 16 (row, token) sums by 4
//! products. Several rows share each activation load.
//!
//! The sums are exact integers per block (scales applied per 16- or 32-value unit with an
//! i32 multiply), converted once per block and scaled by `d·dy` in f32: the same terms as
//! [`super::dot_decoded`], in another order (one f32 sum per block instead of eight lane
//! sums), so results differ from it by rounding only (tested within a bound).

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::OnceLock;

use redlite_gguf::GgmlType;

use super::decoded::DecodedRow;
use super::scalar::{f32_at, u16_at, Q8K_BSUMS, Q8K_BYTES, Q8K_QS};
use super::QuantizedActivation;
use crate::{QuantError, QuantOp};

/// Tokens per activation tile: the i32 lanes of one 512-bit vector.
pub const TILE_TOKENS: usize = 16;

/// Up to [`TILE_TOKENS`] Q8_K activations interleaved for the tile kernels.
#[derive(Clone, Debug, Default)]
pub struct ActTile {
    tokens: usize,
    blocks: usize,
    /// `[values / 4][16][4]`: token t's codes 4k..4k+4 at `(k · 16 + t) · 4`, biased to
    /// `q8 + 128` (unsigned); absent tokens hold 128 (the code 0).
    q: Vec<u8>,
    /// `[blocks][16]`: each token's Q8_K scale per block (0 for absent tokens).
    d: Vec<f32>,
    /// `[blocks · 8][16]`: each token's sum of codes per 32 values (Q4_K's min terms).
    sums: Vec<i32>,
}

impl ActTile {
    /// Interleaves `acts` (1 to [`TILE_TOKENS`] Q8_K activations of one length).
    pub fn new(acts: &[QuantizedActivation]) -> Result<ActTile, QuantError> {
        let op = QuantOp::Dot;
        let Some(first) = acts.first() else {
            return Ok(ActTile::default());
        };
        if acts.len() > TILE_TOKENS || first.ty != GgmlType::Q8K {
            return Err(QuantError::Unsupported { op, ty: first.ty });
        }
        if let Some(a) = acts
            .iter()
            .find(|a| a.ty != first.ty || a.values != first.values)
        {
            return Err(QuantError::ValueLength {
                op,
                ty: GgmlType::Q8K,
                expected: first.values,
                found: a.values,
            });
        }
        let blocks = first.values / 256;
        let mut q = vec![128u8; first.values * TILE_TOKENS];
        let mut d = vec![0f32; blocks * TILE_TOKENS];
        let mut sums = vec![0i32; blocks * 8 * TILE_TOKENS];
        for (t, act) in acts.iter().enumerate() {
            for (b, block) in act.bytes.chunks_exact(Q8K_BYTES).enumerate() {
                d[b * TILE_TOKENS + t] = f32_at(block, 0);
                for s in 0..8 {
                    let half =
                        |h: usize| i32::from(u16_at(block, Q8K_BSUMS + 2 * (2 * s + h)) as i16);
                    sums[(b * 8 + s) * TILE_TOKENS + t] = half(0) + half(1);
                }
                let codes = &block[Q8K_QS..Q8K_QS + 256];
                for (k, four) in codes.chunks_exact(4).enumerate() {
                    let at = ((b * 64 + k) * TILE_TOKENS + t) * 4;
                    for (o, &c) in q[at..at + 4].iter_mut().zip(four) {
                        *o = c ^ 0x80;
                    }
                }
            }
        }
        Ok(ActTile {
            tokens: acts.len(),
            blocks,
            q,
            d,
            sums,
        })
    }

    pub fn tokens(&self) -> usize {
        self.tokens
    }
}

/// Set by [`disable_tiles`].
static TILES_OFF: AtomicBool = AtomicBool::new(false);

/// `REDLITE_CPU_TILES=0` turns the tile kernels off for a whole run.
pub const TILES_VAR: &str = "REDLITE_CPU_TILES";

/// Turns the tile kernels off for the rest of the process. Their sums run in another order
/// than the one-token kernels', so with them a token's result depends on whether its batch
/// reaches [`TILE_TOKENS`]-wide tiles; without them every token takes the same kernels
/// whatever it is batched with. The server does this: a request's text must not depend on
/// the requests it shares a batch with.
pub fn disable_tiles() {
    TILES_OFF.store(true, Ordering::Relaxed);
}

/// Whether [`dot_decoded_tile`] runs here (AVX-512 VNNI, not capped by `REDLITE_SIMD`, not
/// turned off by [`disable_tiles`] or `REDLITE_CPU_TILES=0`).
pub fn tiles_available() -> bool {
    static OFF_BY_ENV: OnceLock<bool> = OnceLock::new();
    if TILES_OFF.load(Ordering::Relaxed)
        || *OFF_BY_ENV.get_or_init(|| std::env::var(TILES_VAR).as_deref() == Ok("0"))
    {
        return false;
    }
    #[cfg(target_arch = "x86_64")]
    {
        super::dispatch::best().0 == super::SimdLevel::Avx512
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        false
    }
}

/// `out[m · stride + t] = rows[m] · token t of tile` for every row and the tile's tokens.
/// Refused where [`tiles_available`] is false, for rows of mixed types or lengths, and for
/// rows whose length is not the tile's.
pub fn dot_decoded_tile(
    rows: &[DecodedRow],
    tile: &ActTile,
    out: &mut [f32],
    stride: usize,
) -> Result<(), QuantError> {
    let op = QuantOp::Dot;
    let Some(first) = rows.first() else {
        return Ok(());
    };
    let ty = first.ty.unwrap_or(GgmlType::F32);
    if !tiles_available() {
        return Err(QuantError::Unsupported { op, ty });
    }
    let blocks = tile.blocks;
    let whole = |r: &DecodedRow| {
        r.d.len() == blocks
            && r.w.len() == 256 * blocks
            && r.scales.len() == 128 * blocks
            && r.offsets.len() == 8 * blocks
            && (ty != GgmlType::Q4K || (r.dmin.len() == blocks && r.mins.len() == 8 * blocks))
    };
    if let Some(bad) = rows.iter().find(|r| r.ty != first.ty || !whole(r)) {
        return Err(QuantError::ValueLength {
            op,
            ty,
            expected: tile.blocks * 256,
            found: bad.d.len() * 256,
        });
    }
    let needed = (rows.len() - 1) * stride + tile.tokens;
    if tile.tokens > stride || out.len() < needed {
        return Err(QuantError::ValueLength {
            op,
            ty,
            expected: needed,
            found: out.len(),
        });
    }
    #[cfg(target_arch = "x86_64")]
    super::avx512::tile::dot_rows(ty, rows, tile, out, stride);
    Ok(())
}

#[cfg(target_arch = "x86_64")]
impl ActTile {
    pub(crate) fn raw(&self) -> (usize, usize, &[u8], &[f32], &[i32]) {
        (self.tokens, self.blocks, &self.q, &self.d, &self.sums)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::fast::batched_tests::decoded_test_row;
    use crate::fast::tests::random_rows;
    use crate::{decode_row, vec_dot};

    /// Σ over values of |weight term · activation term| (`d·scale·q` and, for Q4_K,
    /// `dmin·min`, times `dy·q8`): the size of the terms, which bounds the rounding of any
    /// order of summing them.
    fn magnitude(ty: GgmlType, row: &DecodedRow, act: &QuantizedActivation) -> f64 {
        let unscale = if ty == GgmlType::Q4K { 1.0 } else { 0.125 };
        let mut total = 0f64;
        for (b, block) in act.bytes.chunks_exact(Q8K_BYTES).enumerate() {
            let dy = f64::from(f32_at(block, 0)).abs();
            for i in 0..256 {
                let w = f64::from(row.w[256 * b + i] as i8);
                let scale = f64::from(row.scales[(256 * b + i) / 32 * 16 + (i % 32) / 16 * 8]);
                let q = f64::from(block[Q8K_QS + i] as i8).abs();
                total += dy * q * (unscale * f64::from(row.d[b]) * scale * w).abs();
                if ty == GgmlType::Q4K {
                    let min = f64::from(row.mins[8 * b + i / 32]);
                    total += dy * q * (f64::from(row.dmin[b]) * min).abs();
                }
            }
        }
        total
    }

    /// Every (row, token) of a tile agrees with the row kernel (`vec_dot`) to within f32
    /// rounding of the terms' size: the same integer sums, another float order.
    #[test]
    fn tile_dots_match_the_row_kernel() {
        if !tiles_available() {
            eprintln!("skipped: tile kernels need AVX-512 VNNI");
            return;
        }
        let mut rng = crate::fast::tests::Rng(0x7115);
        for ty in [
            GgmlType::IQ2XXS,
            GgmlType::IQ2XS,
            GgmlType::IQ1M,
            GgmlType::Q4K,
        ] {
            for (blocks, n_rows, tokens) in [
                (1usize, 1usize, 1usize),
                (8, 11, 16),
                (2, 8, 5),
                (3, 17, 13),
            ] {
                let values = 256 * blocks;
                let raw: Vec<Vec<u8>> = (0..n_rows)
                    .map(|r| match ty {
                        GgmlType::Q4K => random_rows(&mut rng, ty, values, 1),
                        _ => decoded_test_row(ty, blocks, 100 + r as u64),
                    })
                    .collect();
                let decoded: Vec<DecodedRow> = raw
                    .iter()
                    .map(|row| {
                        let mut d = DecodedRow::default();
                        decode_row(ty, row, &mut d).unwrap();
                        d
                    })
                    .collect();
                let acts: Vec<QuantizedActivation> = (0..tokens)
                    .map(|t| {
                        let x: Vec<f32> = (0..values)
                            .map(|i| {
                                (((i * 31 + 7 * t) % 253) as f32 / 126.0 - 1.0) * (1.0 + t as f32)
                            })
                            .collect();
                        QuantizedActivation::new(ty, &x).unwrap()
                    })
                    .collect();
                let tile = ActTile::new(&acts).unwrap();
                let stride = tokens + 3;
                let mut out = vec![f32::NAN; n_rows * stride];
                dot_decoded_tile(&decoded, &tile, &mut out, stride).unwrap();
                for (r, row) in raw.iter().enumerate() {
                    for (t, act) in acts.iter().enumerate() {
                        let want = vec_dot(ty, row, act).unwrap();
                        let got = out[r * stride + t];
                        let bound = 1e-6 * magnitude(ty, &decoded[r], act) + 1e-30;
                        assert!(
                            (f64::from(got) - f64::from(want)).abs() <= bound,
                            "{ty}, {blocks} blocks: row {r}, token {t}: tile {got} vs row kernel {want} (bound {bound:.3e})"
                        );
                    }
                    // Columns past the tile's tokens are left alone.
                    assert!(
                        out[r * stride + tokens].is_nan(),
                        "{ty}: row {r} wrote past its tokens"
                    );
                }
            }
        }
    }
}
