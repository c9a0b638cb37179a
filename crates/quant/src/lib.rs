//! GGML block formats: dequantize, quantize and reference dot products, by type id.
//!
//! Every quantized type has a `#[repr(C)]` block struct with its size asserted at compile
//! time (`legacy`, `kquants`, `iquants2`, `iq3`, `iquants1`, `iq4`), decoded from bytes
//! without `unsafe`. The public entry points work on whole rows of blocks:
//!
//! * [`dequantize_row`] for F32, F16, BF16, Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, Q8_1, Q2_K..Q8_K
//!   and every IQ type; bit-exact with gguf-py's `gguf.quants.dequantize` (tested against
//!   fixtures in `tests/fixtures/`).
//! * [`quantize_row`] for F32, F16, BF16, Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, Q8_1, Q8_K, Q4_K
//!   and Q6_K with ggml's reference (`quantize_row_*_ref`, no importance matrix)
//!   algorithms.
//! * [`dot_row`], the reference dot product as ggml's scalar CPU code computes it: the
//!   activation is first quantized to [`vec_dot_type`] of the weight type, then integer
//!   sums per block are scaled in ggml's order. SIMD kernels are tested against it.
//! * [`vec_dot`] and [`matvec`] (module `fast`), the fast kernels for Q8_0, Q2_K, Q4_K,
//!   Q5_K, Q6_K, IQ2_XXS, IQ2_XS, IQ1_M, F16 and F32 rows against an activation quantized
//!   once ([`QuantizedActivation`]); AVX2 or scalar, picked once at run time.
//!
//! Scale fields, for writers that fill blocks with random bytes and then need finite
//! scales ([`scale_fields`]; offsets in bytes from the block start):
//!
//! | type | fields |
//! |---|---|
//! | Q4_0, Q5_0, Q8_0, IQ4_NL, IQ4_XS, IQ2_XXS, IQ2_XS, IQ2_S, IQ3_XXS, IQ3_S, IQ1_S | `d` f16 @0 |
//! | Q4_1, Q5_1 | `d` f16 @0, `m` (added min) f16 @2 |
//! | Q8_1 | `d` f16 @0, `s` (d·Σq) f16 @2 |
//! | Q4_K, Q5_K | `d` f16 @0, `dmin` f16 @2 |
//! | Q2_K | `d` f16 @80, `dmin` f16 @82 |
//! | Q3_K | `d` f16 @108 |
//! | Q6_K | `d` f16 @208 |
//! | Q8_K | `d` **f32** @0 |
//! | IQ1_M | none: the f16 scale is spread over the top nibbles of the four u16 scale words at @48; use [`set_iq1m_scale`] |
//! | F32, F16, BF16 | none (every element is a value) |

mod block;
mod error;
mod fast;
mod float;
mod iq3;
mod iq4;
mod iquants1;
mod iquants2;
mod kquants;
mod legacy;
mod row;
pub mod tables;

pub use block::{Block, Dot, Quantize};
pub use error::{QuantError, QuantOp};
pub use fast::{
    available_levels, decodable, decode_row, decoded_dots_available, disable_tiles, dot_decoded,
    dot_decoded_at, dot_decoded_many, dot_decoded_many_at, dot_decoded_tile, matvec, matvec_at,
    prefetch, simd_level, tileable, tiles_available, vec_dot, vec_dot_at, vec_dot_many,
    vec_dot_many_at, ActTile, DecodedRow, QuantizedActivation, SimdLevel, SIMD_CAP_VAR, TILES_VAR,
    TILE_TOKENS,
};
pub use iq3::{BlockIQ3S, BlockIQ3XXS};
pub use iq4::{BlockIQ4NL, BlockIQ4XS};
pub use iquants1::{BlockIQ1M, BlockIQ1S};
pub use iquants2::{BlockIQ2S, BlockIQ2XS, BlockIQ2XXS};
pub use kquants::{BlockQ2K, BlockQ3K, BlockQ4K, BlockQ5K, BlockQ6K, BlockQ8K, QK_K};
pub use legacy::{BlockQ4_0, BlockQ4_1, BlockQ5_0, BlockQ5_1, BlockQ8_0, BlockQ8_1};

use half::f16;
use redlite_gguf::GgmlType;
use row::{kernels, Kernels};

fn kernels_for(op: QuantOp, ty: GgmlType) -> Result<Kernels, QuantError> {
    kernels(ty).ok_or(QuantError::Unsupported { op, ty })
}

/// The byte length of `values` values of `ty`, refusing a partial block.
fn row_bytes(op: QuantOp, ty: GgmlType, values: usize) -> Result<usize, QuantError> {
    let block_values = ty.block_values();
    if !values.is_multiple_of(block_values) {
        return Err(QuantError::PartialBlock {
            op,
            ty,
            block_values,
            found: values,
        });
    }
    Ok(values / block_values * ty.block_bytes())
}

fn check_bytes(op: QuantOp, ty: GgmlType, values: usize, found: usize) -> Result<(), QuantError> {
    let expected = row_bytes(op, ty, values)?;
    if found != expected {
        return Err(QuantError::ByteLength {
            op,
            ty,
            expected,
            found,
        });
    }
    Ok(())
}

/// Dequantizes whole blocks of `ty` from `bytes` into `out`; `out.len()` must be the
/// number of values those bytes hold.
pub fn dequantize_row(ty: GgmlType, bytes: &[u8], out: &mut [f32]) -> Result<(), QuantError> {
    let op = QuantOp::Dequantize;
    let kernels = kernels_for(op, ty)?;
    check_bytes(op, ty, out.len(), bytes.len())?;
    (kernels.dequantize)(bytes, out);
    Ok(())
}

/// Quantizes `values` (a whole number of blocks) into `out` with ggml's reference
/// algorithm for `ty`.
pub fn quantize_row(ty: GgmlType, values: &[f32], out: &mut [u8]) -> Result<(), QuantError> {
    let op = QuantOp::Quantize;
    let quantize = kernels_for(op, ty)?
        .quantize
        .ok_or(QuantError::Unsupported { op, ty })?;
    check_bytes(op, ty, values.len(), out.len())?;
    quantize(values, out);
    Ok(())
}

/// The reference dot product of a row of `ty` weights with an f32 activation row, as
/// ggml's scalar CPU code computes it: the activation is quantized to
/// [`vec_dot_type`]`(ty)` first.
pub fn dot_row(ty: GgmlType, weights: &[u8], activation: &[f32]) -> Result<f32, QuantError> {
    let op = QuantOp::Dot;
    let kernels = kernels_for(op, ty)?;
    check_bytes(op, ty, activation.len(), weights.len())?;
    Ok((kernels.dot)(weights, activation))
}

/// The format ggml quantizes the activation to for a dot with `ty` weights: Q8_K for the
/// k-quants and the IQ types (except IQ4_NL), Q8_0 for Q4_0, Q5_0, Q8_0 and IQ4_NL, Q8_1
/// for Q4_1 and Q5_1, and the weight type itself for F32, F16 and BF16. ggml has no
/// weight dot for Q8_1 and Q8_K; this crate pairs each with itself. Types without a dot
/// here report F32 (ggml's default) and [`dot_row`] refuses them.
pub fn vec_dot_type(ty: GgmlType) -> GgmlType {
    kernels(ty).map_or(GgmlType::F32, |k| k.vec_dot_type)
}

/// What a scale field of a block holds.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ScaleKind {
    /// The (super-)block scale `d`, f16.
    D,
    /// The scale of the mins (`dmin` of Q2_K, Q4_K, Q5_K) or the added min `m` of Q4_1 /
    /// Q5_1, f16.
    Dmin,
    /// `s = d·Σq` of Q8_1, f16.
    Sum,
    /// The scale `d` of Q8_K, stored as f32.
    DF32,
}

/// One scale field of a block: its byte offset from the block start and what it holds.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ScaleField {
    pub offset: usize,
    pub kind: ScaleKind,
}

impl ScaleField {
    /// Writes `value` into this field of `block` (f16 rounded to nearest, or f32 for
    /// [`ScaleKind::DF32`]).
    pub fn write(&self, block: &mut [u8], value: f32) {
        match self.kind {
            ScaleKind::DF32 => {
                block[self.offset..self.offset + 4].copy_from_slice(&value.to_le_bytes())
            }
            _ => block[self.offset..self.offset + 2]
                .copy_from_slice(&f16::from_f32(value).to_bits().to_le_bytes()),
        }
    }
}

const fn field(offset: usize, kind: ScaleKind) -> ScaleField {
    ScaleField { offset, kind }
}

/// The scale fields of a block of `ty` (see the table in the crate docs). Empty for the
/// float types, for IQ1_M (use [`set_iq1m_scale`]) and for types this crate does not
/// decode.
pub fn scale_fields(ty: GgmlType) -> &'static [ScaleField] {
    use GgmlType as T;
    use ScaleKind::{Dmin, Sum, D, DF32};
    const D_AT_0: &[ScaleField] = &[field(0, D)];
    const D_DMIN_AT_0: &[ScaleField] = &[field(0, D), field(2, Dmin)];
    const Q8_1: &[ScaleField] = &[field(0, D), field(2, Sum)];
    const Q2_K: &[ScaleField] = &[field(80, D), field(82, Dmin)];
    const Q3_K: &[ScaleField] = &[field(108, D)];
    const Q6_K: &[ScaleField] = &[field(208, D)];
    const Q8_K: &[ScaleField] = &[field(0, DF32)];
    match ty {
        T::Q4_0 | T::Q5_0 | T::Q8_0 | T::IQ4NL | T::IQ4XS => D_AT_0,
        T::IQ2XXS | T::IQ2XS | T::IQ2S | T::IQ3XXS | T::IQ3S | T::IQ1S => D_AT_0,
        T::Q4_1 | T::Q5_1 | T::Q4K | T::Q5K => D_DMIN_AT_0,
        T::Q8_1 => Q8_1,
        T::Q2K => Q2_K,
        T::Q3K => Q3_K,
        T::Q6K => Q6_K,
        T::Q8K => Q8_K,
        _ => &[],
    }
}

/// Sets the f16 super-block scale of one IQ1_M block (56 bytes): its bits go to the top
/// nibbles of the four little-endian u16 scale words at byte 48 (word k takes bits
/// 4k..4k+4); the 12 low bits of each word (the group scales) are kept.
pub fn set_iq1m_scale(block: &mut [u8], d: f16) -> Result<(), QuantError> {
    let ty = GgmlType::IQ1M;
    if block.len() != ty.block_bytes() {
        return Err(QuantError::ByteLength {
            op: QuantOp::Quantize,
            ty,
            expected: ty.block_bytes(),
            found: block.len(),
        });
    }
    iquants1::set_iq1m_scale(&mut block[iquants1::IQ1M_SCALES_OFFSET..], d);
    Ok(())
}

#[cfg(test)]
mod tests;
