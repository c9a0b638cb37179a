//! The 3-bit codebook formats IQ3_XXS and IQ3_S.
//!
//! Groups of 8 values are two 4-magnitude grid entries with one sign byte. IQ3_XXS has
//! 8-bit grid indices, 7 stored sign bits per group (parity implies the 8th) and
//! `db = d·(0.5 + s)·0.5`; IQ3_S has 9-bit indices, 8 explicit sign bits and
//! `db = d·(1 + 2s)`.

use crate::block::{sign, Block, Dot, Reader};
use crate::kquants::{BlockQ8K, QK_K};
use crate::tables::{IQ3S_GRID, IQ3XXS_GRID, KSIGNS_IQ2XS};
use half::f16;
use redlite_gguf::GgmlType;
use std::mem::size_of;

/// `qs` holds two grid indices per group; `scales_and_signs` one u32 per sub-block:
/// 4 × 7 sign bits and the 4-bit scale in bits 28..32.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct BlockIQ3XXS {
    pub d: f16,
    pub qs: [u8; QK_K / 4],
    pub scales_and_signs: [u8; QK_K / 8],
}
const _: () = assert!(size_of::<BlockIQ3XXS>() == 98);

/// `qs` the low 8 index bits (two per group), `qh[ib]` the 9th bit of the 8 indices of
/// sub-block ib, `signs` one byte per group, `scales` two 4-bit scales per byte.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct BlockIQ3S {
    pub d: f16,
    pub qs: [u8; QK_K / 4],
    pub qh: [u8; QK_K / 32],
    pub signs: [u8; QK_K / 8],
    pub scales: [u8; QK_K / 64],
}
const _: () = assert!(size_of::<BlockIQ3S>() == 110);

/// The 8 magnitudes and sign byte of one group.
struct Group {
    magnitudes: [u8; 8],
    signs: u8,
}

fn join(first: u32, second: u32) -> [u8; 8] {
    let (a, b) = (first.to_le_bytes(), second.to_le_bytes());
    [a[0], a[1], a[2], a[3], b[0], b[1], b[2], b[3]]
}

impl BlockIQ3XXS {
    fn word(&self, ib: usize) -> u32 {
        let b = &self.scales_and_signs[4 * ib..4 * ib + 4];
        u32::from_le_bytes([b[0], b[1], b[2], b[3]])
    }

    fn group(&self, ib: usize, l: usize) -> Group {
        let q = &self.qs[8 * ib + 2 * l..8 * ib + 2 * l + 2];
        Group {
            magnitudes: join(
                IQ3XXS_GRID[usize::from(q[0])],
                IQ3XXS_GRID[usize::from(q[1])],
            ),
            signs: KSIGNS_IQ2XS[((self.word(ib) >> (7 * l)) & 127) as usize],
        }
    }

    fn scale(&self, ib: usize) -> u32 {
        self.word(ib) >> 28
    }
}

impl BlockIQ3S {
    fn group(&self, ib: usize, l: usize) -> Group {
        let index = |k: usize| {
            let high = usize::from((self.qh[ib] >> (2 * l + k)) & 1) << 8;
            usize::from(self.qs[8 * ib + 2 * l + k]) | high
        };
        Group {
            magnitudes: join(IQ3S_GRID[index(0)], IQ3S_GRID[index(1)]),
            signs: self.signs[4 * ib + l],
        }
    }

    fn scale(&self, ib: usize) -> u32 {
        u32::from((self.scales[ib / 2] >> (4 * (ib % 2))) & 0x0f)
    }
}

/// `db · magnitude · sign` per value, in gguf-py's (and ggml's) order of float products.
fn dequantize_groups(
    db: impl Fn(usize) -> f32,
    group: impl Fn(usize, usize) -> Group,
    out: &mut [f32],
) {
    for (g, ys) in out.chunks_exact_mut(8).enumerate() {
        let db = db(g / 4);
        let Group { magnitudes, signs } = group(g / 4, g % 4);
        for (j, y) in ys.iter_mut().enumerate() {
            *y = db * f32::from(magnitudes[j]) * sign(signs, j) as f32;
        }
    }
}

/// Σ over a sub-block's 4 groups of magnitude · sign · q8.
fn sub_block_sum(group: impl Fn(usize) -> Group, q8: &[i8]) -> i32 {
    let mut sumi = 0i32;
    for (l, q8) in q8.chunks_exact(8).enumerate() {
        let Group { magnitudes, signs } = group(l);
        for j in 0..8 {
            sumi += i32::from(magnitudes[j]) * i32::from(q8[j]) * sign(signs, j);
        }
    }
    sumi
}

impl Block for BlockIQ3XXS {
    const TYPE: GgmlType = GgmlType::IQ3XXS;
    const VALUES: usize = QK_K;
    const BYTES: usize = 98;

    fn read(bytes: &[u8]) -> Self {
        let mut r = Reader::new(bytes);
        BlockIQ3XXS {
            d: r.f16(),
            qs: r.bytes(),
            scales_and_signs: r.bytes(),
        }
    }

    fn dequantize(&self, out: &mut [f32]) {
        let d = self.d.to_f32();
        let db = |ib: usize| d * (0.5 + self.scale(ib) as f32) * 0.5;
        dequantize_groups(db, |ib, l| self.group(ib, l), out);
    }
}

impl Dot for BlockIQ3XXS {
    type Activation = BlockQ8K;

    fn dot(weights: &[Self], activation: &[BlockQ8K]) -> f32 {
        let mut sumf = 0.0f32;
        for (x, y) in weights.iter().zip(activation) {
            let mut bsum = 0i32;
            for (ib, q8) in y.qs.chunks_exact(32).enumerate() {
                let ls = 2 * x.scale(ib) as i32 + 1;
                bsum += sub_block_sum(|l| x.group(ib, l), q8) * ls;
            }
            sumf += x.d.to_f32() * y.d * bsum as f32;
        }
        0.25 * sumf
    }
}

impl Block for BlockIQ3S {
    const TYPE: GgmlType = GgmlType::IQ3S;
    const VALUES: usize = QK_K;
    const BYTES: usize = 110;

    fn read(bytes: &[u8]) -> Self {
        let mut r = Reader::new(bytes);
        BlockIQ3S {
            d: r.f16(),
            qs: r.bytes(),
            qh: r.bytes(),
            signs: r.bytes(),
            scales: r.bytes(),
        }
    }

    fn dequantize(&self, out: &mut [f32]) {
        let d = self.d.to_f32();
        let db = |ib: usize| d * (1 + 2 * self.scale(ib)) as f32;
        dequantize_groups(db, |ib, l| self.group(ib, l), out);
    }
}

impl Dot for BlockIQ3S {
    type Activation = BlockQ8K;

    fn dot(weights: &[Self], activation: &[BlockQ8K]) -> f32 {
        let mut sumf = 0.0f32;
        for (x, y) in weights.iter().zip(activation) {
            let mut bsum = 0i32;
            for (ib, q8) in y.qs.chunks_exact(32).enumerate() {
                let ls = 2 * x.scale(ib) as i32 + 1;
                bsum += sub_block_sum(|l| x.group(ib, l), q8) * ls;
            }
            sumf += x.d.to_f32() * y.d * bsum as f32;
        }
        sumf
    }
}
