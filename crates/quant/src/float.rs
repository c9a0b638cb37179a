//! The plain float types F32, F16 and BF16 as one-value "blocks", and ggml's scalar dots
//! for them (products in f32, accumulated in f64, as `ggml_vec_dot_f32/f16/bf16` do
//! without SIMD).

use half::f16;

/// ggml's `ggml_compute_fp32_to_bf16`: round to nearest even, NaN forced quiet.
pub(crate) fn f32_to_bf16(value: f32) -> u16 {
    let bits = value.to_bits();
    if bits & 0x7fff_ffff > 0x7f80_0000 {
        return ((bits >> 16) | 64) as u16;
    }
    (bits.wrapping_add(0x7fff + ((bits >> 16) & 1)) >> 16) as u16
}

pub(crate) fn bf16_to_f32(bits: u16) -> f32 {
    f32::from_bits(u32::from(bits) << 16)
}

fn halves(bytes: &[u8]) -> impl Iterator<Item = u16> + '_ {
    bytes
        .chunks_exact(2)
        .map(|pair| u16::from_le_bytes([pair[0], pair[1]]))
}

pub(crate) fn dequantize_f32(bytes: &[u8], out: &mut [f32]) {
    for (y, word) in out.iter_mut().zip(bytes.chunks_exact(4)) {
        *y = f32::from_le_bytes([word[0], word[1], word[2], word[3]]);
    }
}

pub(crate) fn dequantize_f16(bytes: &[u8], out: &mut [f32]) {
    for (y, bits) in out.iter_mut().zip(halves(bytes)) {
        *y = f16::from_bits(bits).to_f32();
    }
}

pub(crate) fn dequantize_bf16(bytes: &[u8], out: &mut [f32]) {
    for (y, bits) in out.iter_mut().zip(halves(bytes)) {
        *y = bf16_to_f32(bits);
    }
}

pub(crate) fn quantize_f32(values: &[f32], out: &mut [u8]) {
    for (word, v) in out.chunks_exact_mut(4).zip(values) {
        word.copy_from_slice(&v.to_le_bytes());
    }
}

pub(crate) fn quantize_f16(values: &[f32], out: &mut [u8]) {
    for (pair, &v) in out.chunks_exact_mut(2).zip(values) {
        pair.copy_from_slice(&f16::from_f32(v).to_bits().to_le_bytes());
    }
}

pub(crate) fn quantize_bf16(values: &[f32], out: &mut [u8]) {
    for (pair, &v) in out.chunks_exact_mut(2).zip(values) {
        pair.copy_from_slice(&f32_to_bf16(v).to_le_bytes());
    }
}

fn dot_products(weights: impl Iterator<Item = f32>, activation: impl Iterator<Item = f32>) -> f32 {
    let mut sum = 0.0f64;
    for (w, a) in weights.zip(activation) {
        sum += f64::from(w * a);
    }
    sum as f32
}

pub(crate) fn dot_f32(weights: &[u8], activation: &[f32]) -> f32 {
    let weights = weights
        .chunks_exact(4)
        .map(|w| f32::from_le_bytes([w[0], w[1], w[2], w[3]]));
    dot_products(weights, activation.iter().copied())
}

/// The activation is rounded to f16 first (ggml's `vec_dot_type` for F16 is F16).
pub(crate) fn dot_f16(weights: &[u8], activation: &[f32]) -> f32 {
    let weights = halves(weights).map(|bits| f16::from_bits(bits).to_f32());
    let activation = activation.iter().map(|&a| f16::from_f32(a).to_f32());
    dot_products(weights, activation)
}

/// The activation is rounded to bf16 first (ggml's `vec_dot_type` for BF16 is BF16).
pub(crate) fn dot_bf16(weights: &[u8], activation: &[f32]) -> f32 {
    let weights = halves(weights).map(bf16_to_f32);
    let activation = activation.iter().map(|&a| bf16_to_f32(f32_to_bf16(a)));
    dot_products(weights, activation)
}
