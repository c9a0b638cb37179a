//! Errors of the quant operations. Every variant names the op and the type, and the
//! expected and found sizes where a size is wrong.

use redlite_gguf::GgmlType;

/// Which public operation failed.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum QuantOp {
    Dequantize,
    Quantize,
    Dot,
}

impl std::fmt::Display for QuantOp {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            QuantOp::Dequantize => "dequantize",
            QuantOp::Quantize => "quantize",
            QuantOp::Dot => "dot",
        })
    }
}

#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum QuantError {
    /// The op has no implementation for this type.
    #[error("{op}: type {ty} is not supported")]
    Unsupported { op: QuantOp, ty: GgmlType },

    /// A byte buffer is not a whole number of blocks, or does not match the value count.
    #[error("{op} {ty}: expected {expected} bytes, found {found}")]
    ByteLength {
        op: QuantOp,
        ty: GgmlType,
        expected: usize,
        found: usize,
    },

    /// A value buffer does not hold the number of values the blocks hold.
    #[error("{op} {ty}: expected {expected} values, found {found}")]
    ValueLength {
        op: QuantOp,
        ty: GgmlType,
        expected: usize,
        found: usize,
    },

    /// An activation quantized to one format was handed to a dot that needs another
    /// (`expected` is [`crate::vec_dot_type`] of the weight type `ty`).
    #[error("{op} {ty}: activation is {found}, expected {expected}")]
    ActivationType {
        op: QuantOp,
        ty: GgmlType,
        expected: GgmlType,
        found: GgmlType,
    },

    /// A value count is not a multiple of the type's block size.
    #[error("{op} {ty}: {found} values is not a multiple of the block size {block_values}")]
    PartialBlock {
        op: QuantOp,
        ty: GgmlType,
        block_values: usize,
        found: usize,
    },
}
