//! The one table from a type id to its row kernels, built from the generic block code.

use crate::block::{Block, Dot, Quantize};
use crate::float;
use crate::iq3::{BlockIQ3S, BlockIQ3XXS};
use crate::iq4::{BlockIQ4NL, BlockIQ4XS};
use crate::iquants1::{BlockIQ1M, BlockIQ1S};
use crate::iquants2::{BlockIQ2S, BlockIQ2XS, BlockIQ2XXS};
use crate::kquants::{BlockQ2K, BlockQ3K, BlockQ4K, BlockQ5K, BlockQ6K, BlockQ8K};
use crate::legacy::{BlockQ4_0, BlockQ4_1, BlockQ5_0, BlockQ5_1, BlockQ8_0, BlockQ8_1};
use redlite_gguf::GgmlType;

type DequantizeFn = fn(&[u8], &mut [f32]);
type QuantizeFn = fn(&[f32], &mut [u8]);
type DotFn = fn(&[u8], &[f32]) -> f32;

/// Row kernels of one type. Lengths are checked by the caller: `bytes` and `values`
/// always hold the same whole number of blocks.
pub(crate) struct Kernels {
    pub dequantize: DequantizeFn,
    pub quantize: Option<QuantizeFn>,
    pub dot: DotFn,
    pub vec_dot_type: GgmlType,
}

fn dequantize_blocks<B: Block>(bytes: &[u8], out: &mut [f32]) {
    for (chunk, ys) in bytes
        .chunks_exact(B::BYTES)
        .zip(out.chunks_exact_mut(B::VALUES))
    {
        B::read(chunk).dequantize(ys);
    }
}

fn quantize_blocks<B: Quantize>(values: &[f32], out: &mut [u8]) {
    for (xs, chunk) in values
        .chunks_exact(B::VALUES)
        .zip(out.chunks_exact_mut(B::BYTES))
    {
        B::quantize(xs).write(chunk);
    }
}

/// Quantizes the activation to the weight type's activation format, then runs the
/// block dot. Allocates: this is the reference, not the hot path.
fn dot_blocks<B: Dot>(weights: &[u8], activation: &[f32]) -> f32 {
    let weights: Vec<B> = weights.chunks_exact(B::BYTES).map(B::read).collect();
    let activation: Vec<B::Activation> = activation
        .chunks_exact(<B::Activation as Block>::VALUES)
        .map(<B::Activation as Quantize>::quantize)
        .collect();
    B::dot(&weights, &activation)
}

fn block<B: Dot>() -> Kernels {
    Kernels {
        dequantize: dequantize_blocks::<B>,
        quantize: None,
        dot: dot_blocks::<B>,
        vec_dot_type: <B::Activation as Block>::TYPE,
    }
}

fn quantizable<B: Dot + Quantize>() -> Kernels {
    Kernels {
        quantize: Some(quantize_blocks::<B>),
        ..block::<B>()
    }
}

fn float_kernels(
    dequantize: DequantizeFn,
    quantize: QuantizeFn,
    dot: DotFn,
    vec_dot_type: GgmlType,
) -> Kernels {
    Kernels {
        dequantize,
        quantize: Some(quantize),
        dot,
        vec_dot_type,
    }
}

/// The kernels of `ty`, or `None` for a type this crate does not decode.
pub(crate) fn kernels(ty: GgmlType) -> Option<Kernels> {
    use GgmlType as T;
    Some(match ty {
        T::F32 => float_kernels(
            float::dequantize_f32,
            float::quantize_f32,
            float::dot_f32,
            T::F32,
        ),
        T::F16 => float_kernels(
            float::dequantize_f16,
            float::quantize_f16,
            float::dot_f16,
            T::F16,
        ),
        T::BF16 => float_kernels(
            float::dequantize_bf16,
            float::quantize_bf16,
            float::dot_bf16,
            T::BF16,
        ),
        T::Q4_0 => quantizable::<BlockQ4_0>(),
        T::Q4_1 => quantizable::<BlockQ4_1>(),
        T::Q5_0 => quantizable::<BlockQ5_0>(),
        T::Q5_1 => quantizable::<BlockQ5_1>(),
        T::Q8_0 => quantizable::<BlockQ8_0>(),
        T::Q8_1 => quantizable::<BlockQ8_1>(),
        T::Q2K => block::<BlockQ2K>(),
        T::Q3K => block::<BlockQ3K>(),
        T::Q4K => quantizable::<BlockQ4K>(),
        T::Q5K => block::<BlockQ5K>(),
        T::Q6K => quantizable::<BlockQ6K>(),
        T::Q8K => quantizable::<BlockQ8K>(),
        T::IQ2XXS => block::<BlockIQ2XXS>(),
        T::IQ2XS => block::<BlockIQ2XS>(),
        T::IQ2S => block::<BlockIQ2S>(),
        T::IQ3XXS => block::<BlockIQ3XXS>(),
        T::IQ3S => block::<BlockIQ3S>(),
        T::IQ1S => block::<BlockIQ1S>(),
        T::IQ1M => block::<BlockIQ1M>(),
        T::IQ4NL => block::<BlockIQ4NL>(),
        T::IQ4XS => block::<BlockIQ4XS>(),
        T::I8 | T::I16 | T::I32 | T::I64 | T::F64 | T::TQ1_0 | T::TQ2_0 | T::MXFP4 => return None,
    })
}
