//! One entry of the tensor table.

use std::path::Path;

use crate::error::{GgufError, Result};
use crate::types::GgmlType;

/// A tensor as the header describes it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TensorInfo {
    pub name: String,
    pub ty: GgmlType,
    /// Dimensions, outermost first: a weight `[out, in]` has `shape == [out, in]` and rows of
    /// `in` values (GGUF writes them as `{in, out}`; converted once, here).
    pub shape: Vec<u64>,
    /// Offset of the first byte, relative to the file's data section.
    pub offset: u64,
    /// Bytes of data.
    pub bytes: u64,
}

impl TensorInfo {
    /// Builds an entry, checking that rows hold whole blocks and that the size fits in u64.
    pub fn new(
        name: String,
        ty: GgmlType,
        shape: Vec<u64>,
        offset: u64,
        path: &Path,
    ) -> Result<TensorInfo> {
        let bytes = tensor_bytes(ty, &shape).map_err(|problem| match problem {
            SizeProblem::Overflow => GgufError::ShapeOverflow {
                path: path.to_path_buf(),
                tensor: name.clone(),
                shape: shape.clone(),
            },
            SizeProblem::PartialBlock { row } => GgufError::RowNotBlockAligned {
                path: path.to_path_buf(),
                tensor: name.clone(),
                ty: ty.name().to_string(),
                row,
                block: ty.block_values(),
            },
        })?;
        Ok(TensorInfo {
            name,
            ty,
            shape,
            offset,
            bytes,
        })
    }

    /// Values per row (the innermost dimension).
    pub fn row_len(&self) -> u64 {
        self.shape.last().copied().unwrap_or(1)
    }

    /// Number of rows (the product of every dimension but the innermost).
    pub fn rows(&self) -> u64 {
        let n = self.shape.len();
        self.shape[..n.saturating_sub(1)].iter().product()
    }

    /// Number of values.
    pub fn elements(&self) -> u64 {
        self.shape.iter().product()
    }

    /// Shape as GGUF tools print it (`{ne0, ne1, ...}`, fastest first).
    pub fn ggml_shape(&self) -> Vec<u64> {
        self.shape.iter().rev().copied().collect()
    }
}

pub(crate) enum SizeProblem {
    Overflow,
    PartialBlock { row: u64 },
}

/// Bytes a tensor of `ty` and `shape` (outermost first) occupies.
pub(crate) fn tensor_bytes(ty: GgmlType, shape: &[u64]) -> std::result::Result<u64, SizeProblem> {
    let row = shape.last().copied().unwrap_or(1);
    let row_bytes = ty
        .row_bytes(row)
        .ok_or(if row % ty.block_values() as u64 != 0 {
            SizeProblem::PartialBlock { row }
        } else {
            SizeProblem::Overflow
        })?;
    shape[..shape.len().saturating_sub(1)]
        .iter()
        .try_fold(row_bytes, |acc, &d| acc.checked_mul(d))
        .ok_or(SizeProblem::Overflow)
}
