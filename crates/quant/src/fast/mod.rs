//! Fast matrix-vector kernels: rows of quantized weights against an activation that was
//! quantized once ([`QuantizedActivation`]).
//!
//! Types: Q8_0, Q2_K, Q4_K, Q5_K, Q6_K, IQ2_XXS, IQ2_XS, IQ1_M, F32 and F16. Each has a
//! scalar kernel (ggml's reference integer math in the reference order, bit-identical to
//! [`crate::dot_row`]) and an AVX2 kernel (AVX2 + FMA + F16C); the AVX-512 level (F, BW,
//! VL, VNNI) has its own batched kernels, bit-identical to AVX2's. The level is picked once
//! per process from the CPU's features, capped by [`SIMD_CAP_VAR`] ([`simd_level`]); the
//! `_at` functions force a level, for tests and benchmarks.
//!
//! The SIMD kernels do the same integer sums per block as the reference (exact), then
//! accumulate the scaled block sums in another float order: results differ from the
//! reference by float rounding only (a few ulps of the sum of the magnitudes of the
//! per-block terms).

mod decoded;
pub use tile::{disable_tiles, dot_decoded_tile, tiles_available, ActTile, TILES_VAR, TILE_TOKENS};
mod dispatch;
mod scalar;
mod tile;

#[cfg(target_arch = "x86_64")]
mod avx2;
#[cfg(target_arch = "x86_64")]
mod avx512;

#[cfg(test)]
mod batched_tests;
#[cfg(test)]
mod tests;

use crate::{check_bytes, quantize_row, row_bytes, vec_dot_type, QuantError, QuantOp};
use dispatch::{best, table, RowDot, RowDots};
use redlite_gguf::GgmlType;

pub use decoded::{decodable, decode_row, tileable, DecodedRow};
pub use dispatch::{available_levels, SimdLevel, SIMD_CAP_VAR};

/// An f32 activation row quantized once to the format ggml dots a weight type with
/// ([`vec_dot_type`]): Q8_K for the k-quants and IQ types, Q8_0 for Q8_0, F16 for F16,
/// F32 for F32. The bytes are exactly those [`crate::dot_row`] quantizes internally, so
/// many rows can be dotted against one activation.
#[derive(Clone, Debug, PartialEq)]
pub struct QuantizedActivation {
    /// The activation's own format (the vec_dot type, not the weight type).
    ty: GgmlType,
    /// Number of activation values (a whole number of `ty` blocks).
    values: usize,
    /// `values` values in `ty`'s block layout.
    bytes: Vec<u8>,
}

impl QuantizedActivation {
    /// Quantizes `activation` for dots with rows of `weight_ty`.
    pub fn new(weight_ty: GgmlType, activation: &[f32]) -> Result<Self, QuantError> {
        let mut quantized = QuantizedActivation {
            ty: weight_ty,
            values: 0,
            bytes: Vec::new(),
        };
        quantized.requantize(weight_ty, activation)?;
        Ok(quantized)
    }

    /// Quantizes a new activation into this one's buffer (no allocation once the buffer
    /// has grown to the largest activation).
    pub fn requantize(
        &mut self,
        weight_ty: GgmlType,
        activation: &[f32],
    ) -> Result<(), QuantError> {
        let ty = vec_dot_type(weight_ty);
        let bytes = row_bytes(QuantOp::Quantize, ty, activation.len())?;
        self.bytes.resize(bytes, 0);
        quantize_row(ty, activation, &mut self.bytes)?;
        self.ty = ty;
        self.values = activation.len();
        Ok(())
    }

    /// The activation's format.
    pub fn ty(&self) -> GgmlType {
        self.ty
    }

    /// The number of values.
    pub fn values(&self) -> usize {
        self.values
    }

    /// The quantized blocks.
    pub fn bytes(&self) -> &[u8] {
        &self.bytes
    }
}

/// The row kernel of `ty` in `kernels` (`None`: a level this CPU lacks), after checking that `act` is in `ty`'s activation
/// format.
fn kernel(
    kernels: Option<&RowDots>,
    ty: GgmlType,
    act: &QuantizedActivation,
) -> Result<RowDot, QuantError> {
    let op = QuantOp::Dot;
    let dot = kernels
        .and_then(|kernels| kernels.get(ty))
        .ok_or(QuantError::Unsupported { op, ty })?;
    let expected = vec_dot_type(ty);
    if act.ty != expected {
        return Err(QuantError::ActivationType {
            op,
            ty,
            expected,
            found: act.ty,
        });
    }
    Ok(dot)
}

/// The name of the SIMD level [`vec_dot`] and [`matvec`] use on this CPU: "avx512",
/// "avx2" or "scalar".
pub fn simd_level() -> &'static str {
    best().0.name()
}

/// The dot product of one row of `ty` weights with `act`, with the fastest kernel this
/// CPU has.
pub fn vec_dot(ty: GgmlType, row: &[u8], act: &QuantizedActivation) -> Result<f32, QuantError> {
    let dot = kernel(Some(best().1), ty, act)?;
    check_bytes(QuantOp::Dot, ty, act.values, row.len())?;
    Ok(dot(row, &act.bytes))
}

/// [`vec_dot`] with the kernels of `level`; refuses a level this CPU lacks.
pub fn vec_dot_at(
    level: SimdLevel,
    ty: GgmlType,
    row: &[u8],
    act: &QuantizedActivation,
) -> Result<f32, QuantError> {
    let dot = kernel(table(level), ty, act)?;
    check_bytes(QuantOp::Dot, ty, act.values, row.len())?;
    Ok(dot(row, &act.bytes))
}

/// `out[r]` = the dot of row r of `weights` (`rows` rows of `ty`, each as long as `act`)
/// with `act`, with the fastest kernel this CPU has. Single-threaded; callers split rows
/// across threads.
pub fn matvec(
    ty: GgmlType,
    weights: &[u8],
    rows: usize,
    act: &QuantizedActivation,
    out: &mut [f32],
) -> Result<(), QuantError> {
    let dot = kernel(Some(best().1), ty, act)?;
    matvec_rows(dot, ty, weights, rows, act, out)
}

/// [`matvec`] with the kernels of `level`; refuses a level this CPU lacks.
pub fn matvec_at(
    level: SimdLevel,
    ty: GgmlType,
    weights: &[u8],
    rows: usize,
    act: &QuantizedActivation,
    out: &mut [f32],
) -> Result<(), QuantError> {
    let dot = kernel(table(level), ty, act)?;
    matvec_rows(dot, ty, weights, rows, act, out)
}

fn matvec_rows(
    dot: RowDot,
    ty: GgmlType,
    weights: &[u8],
    rows: usize,
    act: &QuantizedActivation,
    out: &mut [f32],
) -> Result<(), QuantError> {
    let op = QuantOp::Dot;
    let row_len = row_bytes(op, ty, act.values)?;
    if out.len() != rows {
        return Err(QuantError::ValueLength {
            op,
            ty,
            expected: rows,
            found: out.len(),
        });
    }
    let expected = rows * row_len;
    if weights.len() != expected {
        return Err(QuantError::ByteLength {
            op,
            ty,
            expected,
            found: weights.len(),
        });
    }
    if row_len == 0 {
        out.fill(0.0);
        return Ok(());
    }
    for (y, row) in out.iter_mut().zip(weights.chunks_exact(row_len)) {
        *y = dot(row, &act.bytes);
    }
    Ok(())
}

/// Whether [`dot_decoded`] runs on this CPU (it needs AVX2).
pub fn decoded_dots_available() -> bool {
    #[cfg(target_arch = "x86_64")]
    {
        avx2::kernels().is_some()
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        false
    }
}

/// The dot of a row decoded by [`decode_row`] with `act`: bit-identical to [`vec_dot`] on
/// the original row. Refused where [`decoded_dots_available`] is false.
pub fn dot_decoded(row: &DecodedRow, act: &QuantizedActivation) -> Result<f32, QuantError> {
    dot_decoded_at(best().0, row, act)
}

/// [`dot_decoded`] with the kernel of `level`; refuses the scalar level and a level this
/// CPU lacks.
pub fn dot_decoded_at(
    level: SimdLevel,
    row: &DecodedRow,
    act: &QuantizedActivation,
) -> Result<f32, QuantError> {
    let ty = check_decoded(row, act)?;
    #[cfg(target_arch = "x86_64")]
    if let Some([v]) = row.dots(level, [&act.bytes[..]]) {
        return Ok(v);
    }
    Err(QuantError::Unsupported {
        op: QuantOp::Dot,
        ty,
    })
}

/// The checks of [`dot_decoded`] (row decoded, Q8_K activation of the row's length, the
/// CPU's support); the row's type.
fn check_decoded(row: &DecodedRow, act: &QuantizedActivation) -> Result<GgmlType, QuantError> {
    let op = QuantOp::Dot;
    let Some(ty) = row.ty else {
        return Err(QuantError::Unsupported {
            op,
            ty: GgmlType::IQ2XXS,
        });
    };
    if !decodable(ty) {
        // A decoded Q4_K row is for the tile kernels only.
        return Err(QuantError::Unsupported { op, ty });
    }
    if act.ty != GgmlType::Q8K {
        return Err(QuantError::ActivationType {
            op,
            ty,
            expected: GgmlType::Q8K,
            found: act.ty,
        });
    }
    if row.w.len() != act.values
        || row.d.len() * 256 != act.values
        || row.scales.len() * 2 != act.values
        || row.offsets.len() * 32 != act.values
    {
        return Err(QuantError::ValueLength {
            op,
            ty,
            expected: act.values,
            found: row.w.len(),
        });
    }
    if !decoded_dots_available() {
        return Err(QuantError::Unsupported { op, ty });
    }
    Ok(ty)
}

/// [`vec_dot`] of one row with each of `acts` (all of the same type and length), checks and
/// kernel lookup done once: the form batched products use.
pub fn vec_dot_many(
    ty: GgmlType,
    row: &[u8],
    acts: &[QuantizedActivation],
    out: &mut [f32],
) -> Result<(), QuantError> {
    let (level, kernels) = best();
    vec_dot_many_with(level, Some(kernels), ty, row, acts, out)
}

/// [`vec_dot_many`] with the kernels of `level`; refuses a level this CPU lacks.
pub fn vec_dot_many_at(
    level: SimdLevel,
    ty: GgmlType,
    row: &[u8],
    acts: &[QuantizedActivation],
    out: &mut [f32],
) -> Result<(), QuantError> {
    vec_dot_many_with(level, table(level), ty, row, acts, out)
}

fn vec_dot_many_with(
    level: SimdLevel,
    kernels: Option<&RowDots>,
    ty: GgmlType,
    row: &[u8],
    acts: &[QuantizedActivation],
    out: &mut [f32],
) -> Result<(), QuantError> {
    let Some(first) = acts.first() else {
        return Ok(());
    };
    let dot = kernel(kernels, ty, first)?;
    check_bytes(QuantOp::Dot, ty, first.values, row.len())?;
    if let Some(act) = acts
        .iter()
        .find(|a| a.ty != first.ty || a.values != first.values)
    {
        return Err(QuantError::ValueLength {
            op: QuantOp::Dot,
            ty,
            expected: first.values,
            found: act.values,
        });
    }
    // Several activations per pass where a batched kernel exists (bit-identical to `dot`).
    #[cfg(target_arch = "x86_64")]
    let done = grouped(level, &KQuantRow { ty, row }, acts, out);
    #[cfg(not(target_arch = "x86_64"))]
    let done = 0;
    for (o, act) in out.iter_mut().zip(acts).skip(done) {
        *o = dot(row, &act.bytes);
    }
    Ok(())
}

/// A kernel of one weight row against N activations at once, for any N, at a SIMD level
/// (`None`: no such kernel for this row, level or CPU). The one place the batched kernels
/// are chosen by level.
#[cfg(target_arch = "x86_64")]
trait RowAgainstMany {
    /// Whether 8 activations at once pay (enough registers for 8 accumulators).
    const EIGHT: bool;
    fn dots<const N: usize>(&self, level: SimdLevel, acts: [&[u8]; N]) -> Option<[f32; N]>;
}

#[cfg(target_arch = "x86_64")]
struct KQuantRow<'r> {
    ty: GgmlType,
    row: &'r [u8],
}

#[cfg(target_arch = "x86_64")]
impl RowAgainstMany for KQuantRow<'_> {
    // Eight would need 24 vector accumulators (sums, scaled sums, min sums): they spill.
    const EIGHT: bool = false;
    fn dots<const N: usize>(&self, level: SimdLevel, acts: [&[u8]; N]) -> Option<[f32; N]> {
        match level {
            SimdLevel::Scalar => None,
            SimdLevel::Avx2 => avx2::vec_dot_xn(self.ty, self.row, acts),
            SimdLevel::Avx512 => avx512::vec_dot_xn(self.ty, self.row, acts),
        }
    }
}

#[cfg(target_arch = "x86_64")]
impl RowAgainstMany for DecodedRow {
    const EIGHT: bool = true;
    fn dots<const N: usize>(&self, level: SimdLevel, acts: [&[u8]; N]) -> Option<[f32; N]> {
        match level {
            SimdLevel::Scalar => None,
            SimdLevel::Avx2 => avx2::dot_decoded_xn(self, acts),
            SimdLevel::Avx512 => avx512::dot_decoded_xn(self, acts),
        }
    }
}

/// Runs `acts` through `kernel` in groups of 8 (where the kernel has them), then 4, 3 or 2,
/// into `out`; returns how many were done (the last one is left to the caller, and all
/// where the kernel declines). Every width does the same
/// operations per activation, so the grouping does not change any result.
#[cfg(target_arch = "x86_64")]
fn grouped<K: RowAgainstMany>(
    level: SimdLevel,
    kernel: &K,
    acts: &[QuantizedActivation],
    out: &mut [f32],
) -> usize {
    let n = acts.len().min(out.len());
    let mut done = 0;
    while done < n {
        let (acts, out) = (&acts[done..n], &mut out[done..n]);
        let step = match acts.len() {
            8.. if K::EIGHT => group::<K, 8>(level, kernel, acts, out),
            4.. => group::<K, 4>(level, kernel, acts, out),
            3 => group::<K, 3>(level, kernel, acts, out),
            2 => group::<K, 2>(level, kernel, acts, out),
            // One left: the caller's one-activation kernel is faster than a width-1 batch.
            _ => 0,
        };
        if step == 0 {
            break;
        }
        done += step;
    }
    done
}

/// The first N of `acts` through `kernel` into `out` (N or 0 done).
#[cfg(target_arch = "x86_64")]
fn group<K: RowAgainstMany, const N: usize>(
    level: SimdLevel,
    kernel: &K,
    acts: &[QuantizedActivation],
    out: &mut [f32],
) -> usize {
    let group: [&[u8]; N] = std::array::from_fn(|i| &acts[i].bytes[..]);
    match kernel.dots(level, group) {
        Some(dots) => {
            out[..N].copy_from_slice(&dots);
            N
        }
        None => 0,
    }
}

/// [`dot_decoded`] of one decoded row with each of `acts`, checks done once.
pub fn dot_decoded_many(
    row: &DecodedRow,
    acts: &[QuantizedActivation],
    out: &mut [f32],
) -> Result<(), QuantError> {
    dot_decoded_many_at(best().0, row, acts, out)
}

/// [`dot_decoded_many`] with the kernels of `level`; refuses the scalar level and a level
/// this CPU lacks.
pub fn dot_decoded_many_at(
    level: SimdLevel,
    row: &DecodedRow,
    acts: &[QuantizedActivation],
    out: &mut [f32],
) -> Result<(), QuantError> {
    let Some(first) = acts.first() else {
        return Ok(());
    };
    // Validates the row against the first activation (and the CPU's support).
    check_decoded(row, first)?;
    if let Some(act) = acts
        .iter()
        .find(|a| a.ty != first.ty || a.values != first.values)
    {
        return Err(QuantError::ValueLength {
            op: QuantOp::Dot,
            ty: GgmlType::Q8K,
            expected: first.values,
            found: act.values,
        });
    }
    // `dot_decoded` above proved AVX2 is present and the lengths agree; the batched widths
    // are bit-identical to one at a time.
    #[cfg(target_arch = "x86_64")]
    let done = grouped(level, row, acts, out);
    #[cfg(not(target_arch = "x86_64"))]
    let done = 0;
    for (o, act) in out.iter_mut().zip(acts).skip(done) {
        *o = dot_decoded_at(level, row, act)?;
    }
    Ok(())
}

/// Asks the CPU to bring `bytes` into its caches (a hint: no effect on results). Weight rows
/// are read from a file mapping in 4 KiB pages, where the hardware's stream prefetchers stop
/// at every page boundary; decoding the next rows while these arrive hides the memory's
/// latency.
#[inline]
pub fn prefetch(bytes: &[u8]) {
    #[cfg(target_arch = "x86_64")]
    {
        use std::arch::x86_64::{_mm_prefetch, _MM_HINT_T0};
        for line in bytes.chunks(64) {
            // SAFETY: a prefetch never faults and reads nothing into the program; the address
            // is that of a live slice.
            unsafe { _mm_prefetch::<_MM_HINT_T0>(line.as_ptr().cast()) };
        }
    }
    #[cfg(not(target_arch = "x86_64"))]
    let _ = bytes;
}
