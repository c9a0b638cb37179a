//! The non-linear 4-bit formats IQ4_NL (32 values, like Q4_0) and IQ4_XS (256 values with
//! 6-bit sub-block scales): each nibble indexes `KVALUES_IQ4NL`.

use crate::block::{Block, Dot, Reader};
use crate::kquants::{BlockQ8K, QK_K};
use crate::legacy::BlockQ8_0;
use crate::tables::KVALUES_IQ4NL;
use half::f16;
use redlite_gguf::GgmlType;
use std::mem::size_of;

const QK4_NL: usize = 32;

/// `d · kvalues[nibble]`: values j and j + 16 share byte j (low, high nibble).
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct BlockIQ4NL {
    pub d: f16,
    pub qs: [u8; QK4_NL / 2],
}
const _: () = assert!(size_of::<BlockIQ4NL>() == 18);

/// 8 sub-blocks of 32 laid out like IQ4_NL blocks, each with scale
/// `d·(ls − 32)`, ls = 4 bits from `scales_l` and 2 from `scales_h`.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct BlockIQ4XS {
    pub d: f16,
    pub scales_h: u16,
    pub scales_l: [u8; QK_K / 64],
    pub qs: [u8; QK_K / 2],
}
const _: () = assert!(size_of::<BlockIQ4XS>() == 136);

/// The 32 non-linear values of one IQ4_NL-style group of 16 bytes.
fn kvalues(qs: &[u8]) -> [i8; 32] {
    let mut out = [0i8; 32];
    for (j, &byte) in qs.iter().enumerate() {
        out[j] = KVALUES_IQ4NL[usize::from(byte & 0x0f)];
        out[j + 16] = KVALUES_IQ4NL[usize::from(byte >> 4)];
    }
    out
}

fn kvalue_dot(qs: &[u8], q8: &[i8]) -> i32 {
    kvalues(qs)
        .iter()
        .zip(q8)
        .map(|(&k, &a)| i32::from(a) * i32::from(k))
        .sum()
}

impl BlockIQ4XS {
    /// The 6-bit scale of sub-block `ib`, minus 32.
    fn scale(&self, ib: usize) -> i32 {
        let low = (self.scales_l[ib / 2] >> (4 * (ib % 2))) & 0x0f;
        let high = ((self.scales_h >> (2 * ib)) & 3) as u8;
        i32::from(low | (high << 4)) - 32
    }
}

impl Block for BlockIQ4NL {
    const TYPE: GgmlType = GgmlType::IQ4NL;
    const VALUES: usize = QK4_NL;
    const BYTES: usize = 18;

    fn read(bytes: &[u8]) -> Self {
        let mut r = Reader::new(bytes);
        BlockIQ4NL {
            d: r.f16(),
            qs: r.bytes(),
        }
    }

    fn dequantize(&self, out: &mut [f32]) {
        let d = self.d.to_f32();
        for (y, k) in out.iter_mut().zip(kvalues(&self.qs)) {
            *y = d * f32::from(k);
        }
    }
}

impl Dot for BlockIQ4NL {
    type Activation = BlockQ8_0;

    fn dot(weights: &[Self], activation: &[BlockQ8_0]) -> f32 {
        let mut sumf = 0.0f32;
        for (x, y) in weights.iter().zip(activation) {
            let d = y.d.to_f32() * x.d.to_f32();
            sumf += d * kvalue_dot(&x.qs, &y.qs) as f32;
        }
        sumf
    }
}

impl Block for BlockIQ4XS {
    const TYPE: GgmlType = GgmlType::IQ4XS;
    const VALUES: usize = QK_K;
    const BYTES: usize = 136;

    fn read(bytes: &[u8]) -> Self {
        let mut r = Reader::new(bytes);
        BlockIQ4XS {
            d: r.f16(),
            scales_h: r.u16(),
            scales_l: r.bytes(),
            qs: r.bytes(),
        }
    }

    fn dequantize(&self, out: &mut [f32]) {
        let d = self.d.to_f32();
        for (ib, (ys, qs)) in out
            .chunks_exact_mut(32)
            .zip(self.qs.chunks_exact(16))
            .enumerate()
        {
            let dl = d * self.scale(ib) as f32;
            for (y, k) in ys.iter_mut().zip(kvalues(qs)) {
                *y = dl * f32::from(k);
            }
        }
    }
}

impl Dot for BlockIQ4XS {
    type Activation = BlockQ8K;

    fn dot(weights: &[Self], activation: &[BlockQ8K]) -> f32 {
        let mut sumf = 0.0f32;
        for (x, y) in weights.iter().zip(activation) {
            let d4d8 = x.d.to_f32() * y.d;
            for (ib, (qs, q8)) in x.qs.chunks_exact(16).zip(y.qs.chunks_exact(32)).enumerate() {
                sumf += d4d8 * x.scale(ib) as f32 * kvalue_dot(qs, q8) as f32;
            }
        }
        sumf
    }
}
