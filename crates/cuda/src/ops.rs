//! Op entries: validate shapes, types and alignment, then hand over to the launchers.

use crate::device::Device;
use crate::error::{CudaError, CudaOp};
use crate::launch;
use crate::source::{weight_kind, WeightKind};
use cudarc::driver::{CudaView, CudaViewMut};
use redlite_gguf::GgmlType;

/// A weight matrix on the device: `rows` rows of `cols` values, each row whole blocks of
/// `ty`, rows back to back (GGUF order: a tensor of shape [rows, cols], cols innermost).
pub struct WeightMatrix<'a> {
    pub ty: GgmlType,
    pub rows: usize,
    pub cols: usize,
    pub bytes: CudaView<'a, u8>,
    /// The activation format of this matrix's layer products (`matmul`, the MoE ops).
    pub dots: Dots,
}

/// The activation format of a matrix product.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Dots {
    /// f32 activations: the exact math of the dequantized weights (the CPU backend's
    /// `Precision::Exact`).
    #[default]
    F32,
    /// Activations quantized to Q8_K and integer block dots for the types of
    /// [`crate::Q8_DOT_TYPES`] (the CPU backend's `Precision::Ggml`); f32 for the others.
    Q8K,
}

impl Dots {
    /// Whether a product with weights of `ty` runs on Q8_K activations.
    pub fn quantizes(self, ty: GgmlType) -> bool {
        self == Dots::Q8K && crate::source::Q8_DOT_TYPES.contains(&ty)
    }
}

/// The largest grid x dimension of a launch.
pub(crate) const MAX_GRID: u64 = i32::MAX as u64;

/// Widest load the kernels issue (a 16-byte vector in Q4_K / Q5_K), so every matrix must
/// start at that alignment; every supported block size keeps rows 2-byte aligned.
const WEIGHT_ALIGNMENT: u64 = 16;

pub(crate) fn shape(
    op: CudaOp,
    what: &'static str,
    expected: usize,
    found: usize,
) -> Result<(), CudaError> {
    if expected == found {
        Ok(())
    } else {
        Err(CudaError::Shape {
            op,
            what,
            expected,
            found,
        })
    }
}

pub(crate) fn fits(
    op: CudaOp,
    what: &'static str,
    found: u64,
    limit: u64,
) -> Result<(), CudaError> {
    if found <= limit {
        Ok(())
    } else {
        Err(CudaError::TooLarge {
            op,
            what,
            limit: usize::try_from(limit).unwrap_or(usize::MAX),
            found: usize::try_from(found).unwrap_or(usize::MAX),
        })
    }
}

/// Checks the matrix against its type and returns the kernel kind and the thread items
/// of the whole matrix.
pub(crate) fn check_matrix(
    device: &Device,
    op: CudaOp,
    matrix: &WeightMatrix<'_>,
) -> Result<(WeightKind, u64), CudaError> {
    let ty = matrix.ty;
    let kind = weight_kind(ty).ok_or(CudaError::UnsupportedType { op, ty })?;
    let block_values = ty.block_values();
    if !matrix.cols.is_multiple_of(block_values) {
        return Err(CudaError::PartialBlock {
            op,
            what: "cols",
            ty,
            multiple: block_values,
            found: matrix.cols,
        });
    }
    fits(op, "rows", matrix.rows as u64, i32::MAX as u64)?;
    fits(op, "cols", matrix.cols as u64, i32::MAX as u64)?;
    let blocks = matrix.rows as u64 * (matrix.cols / block_values) as u64;
    let expected_bytes = blocks * ty.block_bytes() as u64;
    shape(
        op,
        "weight bytes (rows x cols)",
        usize::try_from(expected_bytes).unwrap_or(usize::MAX),
        matrix.bytes.len(),
    )?;
    let address = device.address(&matrix.bytes);
    if !address.is_multiple_of(WEIGHT_ALIGNMENT) {
        return Err(CudaError::Misaligned {
            op,
            what: "weights",
            address,
            alignment: WEIGHT_ALIGNMENT,
        });
    }
    Ok((kind, blocks * kind.items_per_block as u64))
}

/// `out[r][c] = W[r][c]` in f32, `out` rows x cols.
pub fn dequantize(
    device: &Device,
    matrix: &WeightMatrix<'_>,
    out: &mut CudaViewMut<'_, f32>,
) -> Result<(), CudaError> {
    let op = CudaOp::Dequantize;
    let (kind, total_items) = check_matrix(device, op, matrix)?;
    shape(
        op,
        "out length (rows x cols)",
        matrix.rows * matrix.cols,
        out.len(),
    )?;
    if total_items == 0 {
        return Ok(());
    }
    fits(
        op,
        "thread items / 256",
        total_items.div_ceil(256),
        MAX_GRID,
    )?;
    launch::dequantize(device, kind, &matrix.bytes, out, total_items)
}

/// `y = W x` with f32 activation `x` (length cols) and output `y` (length rows).
pub fn matvec(
    device: &Device,
    matrix: &WeightMatrix<'_>,
    x: &CudaView<'_, f32>,
    y: &mut CudaViewMut<'_, f32>,
) -> Result<(), CudaError> {
    let op = CudaOp::Matvec;
    let (kind, _) = check_matrix(device, op, matrix)?;
    shape(op, "x length (cols)", matrix.cols, x.len())?;
    shape(op, "y length (rows)", matrix.rows, y.len())?;
    if matrix.rows == 0 {
        return Ok(());
    }
    launch::matvec(
        device,
        kind,
        &matrix.bytes,
        x,
        y,
        (matrix.rows, matrix.cols),
    )
}
