//! The 2-bit codebook formats IQ2_XXS, IQ2_XS and IQ2_S.
//!
//! Each decodes groups of 8 values as `db · grid[index][j] · ±1` with a grid of
//! magnitudes in {8, 25, 43}, 32-value sub-blocks, and a sub-block scale
//! `db = d·(0.5 + s)·0.25` for a 4-bit s. IQ2_XXS and IQ2_XS store 7 sign bits per group
//! (the 8th is implied by even parity, `KSIGNS_IQ2XS`); IQ2_S stores all 8.

use crate::block::{grid_byte, sign, Block, Dot, Reader};
use crate::kquants::{BlockQ8K, QK_K};
use crate::tables::{IQ2S_GRID, IQ2XS_GRID, IQ2XXS_GRID, KSIGNS_IQ2XS};
use half::f16;
use redlite_gguf::GgmlType;
use std::mem::size_of;

/// Per sub-block ib two u32 words at `qs[4ib..4ib+4]`: A = 4 grid indices (one byte per
/// group), B = 4 × 7 sign bits, then the 4-bit scale in bits 28..32.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct BlockIQ2XXS {
    pub d: f16,
    pub qs: [u16; QK_K / 8],
}
const _: () = assert!(size_of::<BlockIQ2XXS>() == 66);

/// Per group one u16: a 9-bit grid index and a 7-bit sign index; per sub-block one scale
/// byte (low nibble for groups 0-1, high nibble for groups 2-3).
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct BlockIQ2XS {
    pub d: f16,
    pub qs: [u16; QK_K / 8],
    pub scales: [u8; QK_K / 32],
}
const _: () = assert!(size_of::<BlockIQ2XS>() == 74);

/// `qs[0..32]` the low 8 bits of the 10-bit grid indices, `qs[32..64]` one explicit sign
/// byte per group, `qh[ib]` the high index bits (2 per group), scales as IQ2_XS.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct BlockIQ2S {
    pub d: f16,
    pub qs: [u8; QK_K / 4],
    pub qh: [u8; QK_K / 32],
    pub scales: [u8; QK_K / 32],
}
const _: () = assert!(size_of::<BlockIQ2S>() == 82);

/// One decoded group of 8: grid entry, sign byte, and the 4-bit scale nibble.
struct Group {
    grid: u64,
    signs: u8,
    scale: u8,
}

impl BlockIQ2XXS {
    fn group(&self, ib: usize, l: usize) -> Group {
        let a = u32::from(self.qs[4 * ib]) | (u32::from(self.qs[4 * ib + 1]) << 16);
        let b = u32::from(self.qs[4 * ib + 2]) | (u32::from(self.qs[4 * ib + 3]) << 16);
        Group {
            grid: IQ2XXS_GRID[((a >> (8 * l)) & 0xff) as usize],
            signs: KSIGNS_IQ2XS[((b >> (7 * l)) & 127) as usize],
            scale: (b >> 28) as u8,
        }
    }
}

impl BlockIQ2XS {
    fn group(&self, ib: usize, l: usize) -> Group {
        let word = self.qs[4 * ib + l];
        Group {
            grid: IQ2XS_GRID[usize::from(word & 511)],
            signs: KSIGNS_IQ2XS[usize::from(word >> 9)],
            scale: (self.scales[ib] >> (4 * (l / 2))) & 0x0f,
        }
    }
}

impl BlockIQ2S {
    fn group(&self, ib: usize, l: usize) -> Group {
        let high = usize::from((self.qh[ib] >> (2 * l)) & 3) << 8;
        Group {
            grid: IQ2S_GRID[usize::from(self.qs[4 * ib + l]) | high],
            signs: self.qs[QK_K / 8 + 4 * ib + l],
            scale: (self.scales[ib] >> (4 * (l / 2))) & 0x0f,
        }
    }
}

/// `db · grid · sign` for every group, in gguf-py's (and ggml's) order of float products.
fn dequantize_groups(d: f16, group: impl Fn(usize, usize) -> Group, out: &mut [f32]) {
    let d = d.to_f32();
    for (g, ys) in out.chunks_exact_mut(8).enumerate() {
        let Group { grid, signs, scale } = group(g / 4, g % 4);
        let db = d * (0.5 + f32::from(scale)) * 0.25;
        for (j, y) in ys.iter_mut().enumerate() {
            *y = db * f32::from(grid_byte(grid, j)) * sign(signs, j) as f32;
        }
    }
}

/// ggml's scalar dot for the three formats: per sub-block Σ (2s + 1)·Σ grid·sign·q8 over
/// its groups, times `d · d8`, and a final 1/8.
fn dot_groups<B>(
    weights: &[B],
    activation: &[BlockQ8K],
    d: impl Fn(&B) -> f16,
    group: impl Fn(&B, usize, usize) -> Group,
) -> f32 {
    let mut sumf = 0.0f32;
    for (x, y) in weights.iter().zip(activation) {
        let mut bsum = 0i32;
        for (g, q8) in y.qs.chunks_exact(8).enumerate() {
            let Group { grid, signs, scale } = group(x, g / 4, g % 4);
            let sumi: i32 = q8
                .iter()
                .enumerate()
                .map(|(j, &a)| i32::from(grid_byte(grid, j)) * i32::from(a) * sign(signs, j))
                .sum();
            bsum += sumi * (2 * i32::from(scale) + 1);
        }
        sumf += d(x).to_f32() * y.d * bsum as f32;
    }
    0.125 * sumf
}

impl Block for BlockIQ2XXS {
    const TYPE: GgmlType = GgmlType::IQ2XXS;
    const VALUES: usize = QK_K;
    const BYTES: usize = 66;

    fn read(bytes: &[u8]) -> Self {
        let mut r = Reader::new(bytes);
        BlockIQ2XXS {
            d: r.f16(),
            qs: r.u16s(),
        }
    }

    fn dequantize(&self, out: &mut [f32]) {
        dequantize_groups(self.d, |ib, l| self.group(ib, l), out);
    }
}

impl Dot for BlockIQ2XXS {
    type Activation = BlockQ8K;

    fn dot(weights: &[Self], activation: &[BlockQ8K]) -> f32 {
        dot_groups(weights, activation, |x| x.d, Self::group)
    }
}

impl Block for BlockIQ2XS {
    const TYPE: GgmlType = GgmlType::IQ2XS;
    const VALUES: usize = QK_K;
    const BYTES: usize = 74;

    fn read(bytes: &[u8]) -> Self {
        let mut r = Reader::new(bytes);
        BlockIQ2XS {
            d: r.f16(),
            qs: r.u16s(),
            scales: r.bytes(),
        }
    }

    fn dequantize(&self, out: &mut [f32]) {
        dequantize_groups(self.d, |ib, l| self.group(ib, l), out);
    }
}

impl Dot for BlockIQ2XS {
    type Activation = BlockQ8K;

    fn dot(weights: &[Self], activation: &[BlockQ8K]) -> f32 {
        dot_groups(weights, activation, |x| x.d, Self::group)
    }
}

impl Block for BlockIQ2S {
    const TYPE: GgmlType = GgmlType::IQ2S;
    const VALUES: usize = QK_K;
    const BYTES: usize = 82;

    fn read(bytes: &[u8]) -> Self {
        let mut r = Reader::new(bytes);
        BlockIQ2S {
            d: r.f16(),
            qs: r.bytes(),
            qh: r.bytes(),
            scales: r.bytes(),
        }
    }

    fn dequantize(&self, out: &mut [f32]) {
        dequantize_groups(self.d, |ib, l| self.group(ib, l), out);
    }
}

impl Dot for BlockIQ2S {
    type Activation = BlockQ8K;

    fn dot(weights: &[Self], activation: &[BlockQ8K]) -> f32 {
        dot_groups(weights, activation, |x| x.d, Self::group)
    }
}
