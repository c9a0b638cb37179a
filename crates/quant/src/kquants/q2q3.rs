//! Q2_K and Q3_K: 16 sub-blocks of 16 values with 4-bit (Q2_K) or 6-bit (Q3_K) scales.
//!
//! Both lay their 256 codes out as two halves of 128: in half H, value 128H + 32p + l
//! (p = 0..4, l = 0..32) takes bits 2p..2p+2 of byte 32H + l of `qs`.

use super::{lane_sums, BlockQ8K, Lanes, QK_K};
use crate::block::{Block, Dot, Reader};
use half::f16;
use redlite_gguf::GgmlType;
use std::mem::size_of;

/// `d·(scales[s] & 15)·q − dmin·(scales[s] >> 4)` for sub-block s, q 2 bits.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct BlockQ2K {
    pub scales: [u8; QK_K / 16],
    pub qs: [u8; QK_K / 4],
    pub d: f16,
    pub dmin: f16,
}
const _: () = assert!(size_of::<BlockQ2K>() == 84);

/// `d·(sc − 32)·(q − 4·!h)`: 2 low bits from `qs`, the high bit h from `hmask`, 6-bit
/// scales packed in 12 bytes.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct BlockQ3K {
    pub hmask: [u8; QK_K / 8],
    pub qs: [u8; QK_K / 4],
    pub scales: [u8; 12],
    pub d: f16,
}
const _: () = assert!(size_of::<BlockQ3K>() == 110);

/// The 2-bit codes of the shared two-halves layout, in value order.
fn two_bit_codes(qs: &[u8; QK_K / 4]) -> [u8; QK_K] {
    let mut codes = [0u8; QK_K];
    for half in 0..2 {
        for p in 0..4 {
            for l in 0..32 {
                codes[128 * half + 32 * p + l] = (qs[32 * half + l] >> (2 * p)) & 3;
            }
        }
    }
    codes
}

impl Block for BlockQ2K {
    const TYPE: GgmlType = GgmlType::Q2K;
    const VALUES: usize = QK_K;
    const BYTES: usize = 84;

    fn read(bytes: &[u8]) -> Self {
        let mut r = Reader::new(bytes);
        BlockQ2K {
            scales: r.bytes(),
            qs: r.bytes(),
            d: r.f16(),
            dmin: r.f16(),
        }
    }

    fn dequantize(&self, out: &mut [f32]) {
        let (d, dmin) = (self.d.to_f32(), self.dmin.to_f32());
        let codes = two_bit_codes(&self.qs);
        for (s, (ys, qs)) in out
            .chunks_exact_mut(16)
            .zip(codes.chunks_exact(16))
            .enumerate()
        {
            let dl = d * f32::from(self.scales[s] & 0x0f);
            let ml = dmin * f32::from(self.scales[s] >> 4);
            for (y, &q) in ys.iter_mut().zip(qs) {
                *y = dl * f32::from(q) - ml;
            }
        }
    }
}

impl Dot for BlockQ2K {
    type Activation = BlockQ8K;

    fn dot(weights: &[Self], activation: &[BlockQ8K]) -> f32 {
        let mut sumf = 0.0f32;
        for (x, y) in weights.iter().zip(activation) {
            let summs: i32 = y
                .bsums
                .iter()
                .zip(&x.scales)
                .map(|(&bsum, &sc)| i32::from(bsum) * i32::from(sc >> 4))
                .sum();
            let codes = two_bit_codes(&x.qs);
            let mut isum = 0i32;
            for (s, (qs, q8)) in codes
                .chunks_exact(16)
                .zip(y.qs.chunks_exact(16))
                .enumerate()
            {
                let sub: i32 = qs
                    .iter()
                    .zip(q8)
                    .map(|(&q, &a)| i32::from(a) * i32::from(q))
                    .sum();
                isum += i32::from(x.scales[s] & 0x0f) * sub;
            }
            let dall = y.d * x.d.to_f32();
            let dmin = y.d * x.dmin.to_f32();
            sumf += dall * isum as f32 - dmin * summs as f32;
        }
        sumf
    }
}

impl BlockQ3K {
    /// The 16 signed 6-bit sub-block scales.
    fn signed_scales(&self) -> [i32; 16] {
        let s = &self.scales;
        let mut out = [0i32; 16];
        for (j, scale) in out.iter_mut().enumerate() {
            let low = if j < 8 { s[j] & 0x0f } else { s[j - 8] >> 4 };
            let high = (s[8 + j % 4] >> (2 * (j / 4))) & 3;
            *scale = i32::from(low | (high << 4)) - 32;
        }
        out
    }

    /// The signed 3-bit codes (−4..=3) in value order.
    fn codes(&self) -> [i8; QK_K] {
        let low = two_bit_codes(&self.qs);
        let mut codes = [0i8; QK_K];
        for half in 0..2 {
            for p in 0..4 {
                for l in 0..32 {
                    let n = 128 * half + 32 * p + l;
                    let high = (self.hmask[l] >> (4 * half + p)) & 1;
                    codes[n] = low[n] as i8 - if high == 0 { 4 } else { 0 };
                }
            }
        }
        codes
    }
}

impl Block for BlockQ3K {
    const TYPE: GgmlType = GgmlType::Q3K;
    const VALUES: usize = QK_K;
    const BYTES: usize = 110;

    fn read(bytes: &[u8]) -> Self {
        let mut r = Reader::new(bytes);
        BlockQ3K {
            hmask: r.bytes(),
            qs: r.bytes(),
            scales: r.bytes(),
            d: r.f16(),
        }
    }

    fn dequantize(&self, out: &mut [f32]) {
        let d = self.d.to_f32();
        let scales = self.signed_scales();
        let codes = self.codes();
        for (s, (ys, qs)) in out
            .chunks_exact_mut(16)
            .zip(codes.chunks_exact(16))
            .enumerate()
        {
            let dl = d * scales[s] as f32;
            for (y, &q) in ys.iter_mut().zip(qs) {
                *y = dl * f32::from(q);
            }
        }
    }
}

impl Dot for BlockQ3K {
    type Activation = BlockQ8K;

    fn dot(weights: &[Self], activation: &[BlockQ8K]) -> f32 {
        let mut lanes = Lanes::default();
        for (x, y) in weights.iter().zip(activation) {
            let sums = lane_sums(&x.codes(), &y.qs, &x.signed_scales());
            lanes.add(x.d.to_f32() * y.d, &sums);
        }
        lanes.total(0.0)
    }
}
