//! Q8_K: the activation format of the k-quant and IQ dots.

use super::QK_K;
use crate::block::{nearest_int, Block, Dot, Quantize, Reader, Writer};
use redlite_gguf::GgmlType;
use std::mem::size_of;

/// `d · q` with an f32 scale; `bsums[j]` is the sum of the codes 16j..16j+15, which the
/// dots with a min term use.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct BlockQ8K {
    pub d: f32,
    pub qs: [i8; QK_K],
    pub bsums: [i16; QK_K / 16],
}
const _: () = assert!(size_of::<BlockQ8K>() == 292);

impl Block for BlockQ8K {
    const TYPE: GgmlType = GgmlType::Q8K;
    const VALUES: usize = QK_K;
    const BYTES: usize = 292;

    fn read(bytes: &[u8]) -> Self {
        let mut r = Reader::new(bytes);
        BlockQ8K {
            d: r.f32(),
            qs: r.i8s(),
            bsums: r.i16s(),
        }
    }

    fn dequantize(&self, out: &mut [f32]) {
        for (y, &q) in out.iter_mut().zip(&self.qs) {
            *y = self.d * f32::from(q);
        }
    }
}

impl Quantize for BlockQ8K {
    /// ggml's `quantize_row_q8_K_ref`: the scale maps the signed largest value to −127.
    fn quantize(values: &[f32]) -> Self {
        let (mut max, mut amax) = (0.0f32, 0.0f32);
        for &v in values {
            if v.abs() > amax {
                amax = v.abs();
                max = v;
            }
        }
        let mut block = BlockQ8K {
            d: 0.0,
            qs: [0; QK_K],
            bsums: [0; QK_K / 16],
        };
        if amax == 0.0 {
            return block;
        }
        let iscale = -127.0 / max;
        for (q, &v) in block.qs.iter_mut().zip(values) {
            *q = nearest_int(iscale * v).min(127) as i8;
        }
        for (sum, group) in block.bsums.iter_mut().zip(block.qs.chunks_exact(16)) {
            *sum = group.iter().map(|&q| i16::from(q)).sum();
        }
        block.d = 1.0 / iscale;
        block
    }

    fn write(&self, out: &mut [u8]) {
        let mut w = Writer::new(out);
        w.f32(self.d);
        w.i8s(&self.qs);
        w.i16s(&self.bsums);
    }
}

/// ggml has no Q8_K weight dot; this pairs Q8_K with itself like Q8_0 × Q8_0.
impl Dot for BlockQ8K {
    type Activation = BlockQ8K;

    fn dot(weights: &[Self], activation: &[BlockQ8K]) -> f32 {
        let mut sumf = 0.0f32;
        for (x, y) in weights.iter().zip(activation) {
            let sumi: i32 =
                x.qs.iter()
                    .zip(&y.qs)
                    .map(|(&a, &b)| i32::from(a) * i32::from(b))
                    .sum();
            sumf += sumi as f32 * (x.d * y.d);
        }
        sumf
    }
}
