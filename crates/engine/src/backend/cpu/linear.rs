//! Matrix products on the CPU: `y[t][o] = Σ_i W[o][i] · x[t][i]` for a batch of tokens,
//! decoding each weight row once per batch (weights stay in the memory map).
// Index loops mirror the formulas (several arrays share one index).
#![allow(clippy::needless_range_loop)]

use rayon::prelude::*;
use redlite_gguf::{GgmlType, GgufModel};
use redlite_quant::{dequantize_row, vec_dot, QuantizedActivation};

use crate::backend::cpu::weights::Matrix;
use crate::error::Result;

/// How the CPU multiplies by a quantized weight.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Precision {
    /// Weight rows decoded to f32, f32 activations: the exact math of the dequantized model
    /// (what transformers computes on the same weights). The reference.
    Exact,
    /// Activations quantized once per token to the weight type's dot type (Q8_K, Q8_0, F16)
    /// and integer block dots in SIMD, as llama.cpp's CPU backend does. Fast.
    Ggml,
}

impl Precision {
    /// `REDLITE_CPU_EXACT=1` selects the exact path.
    pub fn from_env() -> Precision {
        match std::env::var("REDLITE_CPU_EXACT").as_deref() {
            Ok("1") | Ok("true") => Precision::Exact,
            _ => Precision::Ggml,
        }
    }
}

/// What a matrix product needs besides its operands.
#[derive(Clone, Copy)]
pub struct MatmulCtx<'a> {
    pub gguf: &'a GgufModel,
    pub precision: Precision,
}

/// Rows handed to one parallel task.
const ROWS_PER_TASK: usize = 16;

/// f32 dot product with eight partial sums (vectorizes; a fixed order, so repeatable).
pub fn dot(a: &[f32], b: &[f32]) -> f32 {
    let mut acc = [0f32; 8];
    let chunks = a.len() / 8;
    for c in 0..chunks {
        for l in 0..8 {
            acc[l] += a[8 * c + l] * b[8 * c + l];
        }
    }
    let mut sum = (acc[0] + acc[4]) + (acc[1] + acc[5]) + ((acc[2] + acc[6]) + (acc[3] + acc[7]));
    for i in 8 * chunks..a.len() {
        sum += a[i] * b[i];
    }
    sum
}

/// `out[t * n_rows + r] = W[first_row + r] · x[t]` for `t < tokens`, where `x` holds `tokens`
/// rows of `w.cols` values. `first_row`/`n_rows` select a slab (one expert of a stack).
pub fn matmul_rows(
    mm: &MatmulCtx,
    w: &Matrix,
    first_row: usize,
    n_rows: usize,
    x: &[f32],
    tokens: usize,
    out: &mut [f32],
) -> Result<()> {
    let bytes = mm.gguf.data(w.loc);
    let cols = w.cols;
    debug_assert_eq!(x.len(), tokens * cols);
    debug_assert_eq!(out.len(), tokens * n_rows);
    if mm.precision == Precision::Ggml && w.ty != GgmlType::F32 {
        return matmul_rows_quantized(bytes, w, first_row, n_rows, x, tokens, out);
    }
    // Row-major by weight row, then scattered to token-major order.
    let mut by_row = vec![0f32; n_rows * tokens];
    by_row
        .par_chunks_mut(ROWS_PER_TASK * tokens)
        .enumerate()
        .try_for_each(|(task, chunk)| -> Result<()> {
            let mut decoded = vec![0f32; cols];
            for (k, row_out) in chunk.chunks_mut(tokens).enumerate() {
                let r = first_row + task * ROWS_PER_TASK + k;
                let row_bytes = &bytes[r * w.row_bytes..(r + 1) * w.row_bytes];
                let row: &[f32] = if w.ty == GgmlType::F32 {
                    decoded
                        .iter_mut()
                        .zip(row_bytes.chunks_exact(4))
                        .for_each(|(d, b)| *d = f32::from_le_bytes([b[0], b[1], b[2], b[3]]));
                    &decoded
                } else {
                    dequantize_row(w.ty, row_bytes, &mut decoded)?;
                    &decoded
                };
                for (t, o) in row_out.iter_mut().enumerate() {
                    *o = dot(row, &x[t * cols..(t + 1) * cols]);
                }
            }
            Ok(())
        })?;
    for r in 0..n_rows {
        for t in 0..tokens {
            out[t * n_rows + r] = by_row[r * tokens + t];
        }
    }
    Ok(())
}

/// The whole matrix.
/// The ggml-style product: each token's activation quantized once, rows dotted in SIMD.
fn matmul_rows_quantized(
    bytes: &[u8],
    w: &Matrix,
    first_row: usize,
    n_rows: usize,
    x: &[f32],
    tokens: usize,
    out: &mut [f32],
) -> Result<()> {
    let acts: Vec<QuantizedActivation> = x
        .chunks(w.cols)
        .map(|xt| QuantizedActivation::new(w.ty, xt))
        .collect::<std::result::Result<_, _>>()?;
    let mut by_row = vec![0f32; n_rows * tokens];
    by_row
        .par_chunks_mut(ROWS_PER_TASK * tokens)
        .enumerate()
        .try_for_each(|(task, chunk)| -> Result<()> {
            for (k, row_out) in chunk.chunks_mut(tokens).enumerate() {
                let r = first_row + task * ROWS_PER_TASK + k;
                let row = &bytes[r * w.row_bytes..(r + 1) * w.row_bytes];
                for (o, act) in row_out.iter_mut().zip(&acts) {
                    *o = vec_dot(w.ty, row, act)?;
                }
            }
            Ok(())
        })?;
    for r in 0..n_rows {
        for t in 0..tokens {
            out[t * n_rows + r] = by_row[r * tokens + t];
        }
    }
    Ok(())
}

/// The whole matrix.
pub fn matmul(mm: &MatmulCtx, w: &Matrix, x: &[f32], tokens: usize, out: &mut [f32]) -> Result<()> {
    matmul_rows(mm, w, 0, w.rows, x, tokens, out)
}
