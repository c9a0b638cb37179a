//! The ~1.5-bit codebook formats IQ1_S and IQ1_M: groups of 8 values
//! `dl · (grid[j] + δ)` with an int8 grid in {−1, 0, 1} and δ = ±1/8, 11-bit grid indices.

use crate::block::{Block, Dot, Reader};
use crate::kquants::{BlockQ8K, QK_K};
use crate::tables::{IQ1S_GRID, IQ1_DELTA};
use half::f16;
use redlite_gguf::GgmlType;
use std::mem::size_of;

/// Per sub-block ib one u16 `qh[ib]`: bits 3l..3l+3 the high index bits of group l, bits
/// 12..15 the 3-bit scale (`dl = d·(2s + 1)`), bit 15 the sign of δ.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct BlockIQ1S {
    pub d: f16,
    pub qs: [u8; QK_K / 8],
    pub qh: [u16; QK_K / 32],
}
const _: () = assert!(size_of::<BlockIQ1S>() == 50);

/// No separate scale field: the f16 super-block scale is the top nibbles of the four u16
/// words of `scales` (word k holds bits 4k..4k+4); the rest of each word holds four 3-bit
/// group-pair scales. `qh` holds, per group, 3 high index bits and the sign of δ.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct BlockIQ1M {
    pub qs: [u8; QK_K / 8],
    pub qh: [u8; QK_K / 16],
    pub scales: [u8; QK_K / 32],
}
const _: () = assert!(size_of::<BlockIQ1M>() == 56);

/// Byte offset of `scales` in an IQ1_M block.
pub(crate) const IQ1M_SCALES_OFFSET: usize = QK_K / 8 + QK_K / 16;

fn grid_value(index: usize, j: usize) -> i8 {
    (IQ1S_GRID[index] >> (8 * j)) as u8 as i8
}

impl BlockIQ1S {
    fn index(&self, ib: usize, l: usize) -> usize {
        usize::from(self.qs[4 * ib + l]) | (usize::from((self.qh[ib] >> (3 * l)) & 7) << 8)
    }

    fn scale(&self, ib: usize) -> i32 {
        2 * i32::from((self.qh[ib] >> 12) & 7) + 1
    }

    fn delta_negative(&self, ib: usize) -> bool {
        self.qh[ib] & 0x8000 != 0
    }
}

impl BlockIQ1M {
    fn words(&self) -> [u16; 4] {
        let s = &self.scales;
        [0, 1, 2, 3].map(|k| u16::from_le_bytes([s[2 * k], s[2 * k + 1]]))
    }

    /// The f16 super-block scale assembled from the top nibbles of the scale words.
    pub fn d(&self) -> f16 {
        let w = self.words();
        f16::from_bits(
            (w[0] >> 12) | ((w[1] >> 8) & 0x00f0) | ((w[2] >> 4) & 0x0f00) | (w[3] & 0xf000),
        )
    }

    fn index(&self, ib: usize, l: usize) -> usize {
        let high = (self.qh[2 * ib + l / 2] >> (4 * (l % 2))) & 7;
        usize::from(self.qs[4 * ib + l]) | (usize::from(high) << 8)
    }

    /// The scale of groups 0-1 (`pair` 0) or 2-3 (`pair` 1) of sub-block `ib`.
    fn scale(&self, ib: usize, pair: usize) -> i32 {
        let word = self.words()[ib / 2];
        2 * i32::from((word >> (6 * (ib % 2) + 3 * pair)) & 7) + 1
    }

    fn delta_negative(&self, ib: usize, l: usize) -> bool {
        (self.qh[2 * ib + l / 2] >> (4 * (l % 2))) & 0x08 != 0
    }
}

fn delta(negative: bool) -> f32 {
    if negative {
        -IQ1_DELTA
    } else {
        IQ1_DELTA
    }
}

impl Block for BlockIQ1S {
    const TYPE: GgmlType = GgmlType::IQ1S;
    const VALUES: usize = QK_K;
    const BYTES: usize = 50;

    fn read(bytes: &[u8]) -> Self {
        let mut r = Reader::new(bytes);
        BlockIQ1S {
            d: r.f16(),
            qs: r.bytes(),
            qh: r.u16s(),
        }
    }

    fn dequantize(&self, out: &mut [f32]) {
        let d = self.d.to_f32();
        for (g, ys) in out.chunks_exact_mut(8).enumerate() {
            let (ib, l) = (g / 4, g % 4);
            let dl = d * self.scale(ib) as f32;
            let delta = delta(self.delta_negative(ib));
            let index = self.index(ib, l);
            for (j, y) in ys.iter_mut().enumerate() {
                *y = dl * (f32::from(grid_value(index, j)) + delta);
            }
        }
    }
}

impl Dot for BlockIQ1S {
    type Activation = BlockQ8K;

    fn dot(weights: &[Self], activation: &[BlockQ8K]) -> f32 {
        let mut sumf = 0.0f32;
        for (x, y) in weights.iter().zip(activation) {
            let (mut sumi, mut sumi_delta) = (0i32, 0i32);
            for (ib, q8) in y.qs.chunks_exact(32).enumerate() {
                let mut lsum = 0i32;
                for (l, q8) in q8.chunks_exact(8).enumerate() {
                    let index = x.index(ib, l);
                    for (j, &a) in q8.iter().enumerate() {
                        lsum += i32::from(a) * i32::from(grid_value(index, j));
                    }
                }
                let ls = x.scale(ib);
                let sign = if x.delta_negative(ib) { -1 } else { 1 };
                sumi += ls * lsum;
                sumi_delta +=
                    ls * sign * (i32::from(y.bsums[2 * ib]) + i32::from(y.bsums[2 * ib + 1]));
            }
            sumf += x.d.to_f32() * y.d * (sumi as f32 + IQ1_DELTA * sumi_delta as f32);
        }
        sumf
    }
}

impl Block for BlockIQ1M {
    const TYPE: GgmlType = GgmlType::IQ1M;
    const VALUES: usize = QK_K;
    const BYTES: usize = 56;

    fn read(bytes: &[u8]) -> Self {
        let mut r = Reader::new(bytes);
        BlockIQ1M {
            qs: r.bytes(),
            qh: r.bytes(),
            scales: r.bytes(),
        }
    }

    fn dequantize(&self, out: &mut [f32]) {
        let d = self.d().to_f32();
        for (g, ys) in out.chunks_exact_mut(8).enumerate() {
            let (ib, l) = (g / 4, g % 4);
            let dl = d * self.scale(ib, l / 2) as f32;
            let delta = delta(self.delta_negative(ib, l));
            let index = self.index(ib, l);
            for (j, y) in ys.iter_mut().enumerate() {
                *y = dl * (f32::from(grid_value(index, j)) + delta);
            }
        }
    }
}

impl Dot for BlockIQ1M {
    type Activation = BlockQ8K;

    fn dot(weights: &[Self], activation: &[BlockQ8K]) -> f32 {
        let mut sumf = 0.0f32;
        for (x, y) in weights.iter().zip(activation) {
            let (mut sumi, mut sumi_delta) = (0i32, 0i32);
            for (ib, q8) in y.qs.chunks_exact(32).enumerate() {
                let (mut grid_sums, mut delta_sums) = ([0i32; 2], [0i32; 2]);
                for (l, q8) in q8.chunks_exact(8).enumerate() {
                    let index = x.index(ib, l);
                    let (mut lsum, mut qsum) = (0i32, 0i32);
                    for (j, &a) in q8.iter().enumerate() {
                        lsum += i32::from(a) * i32::from(grid_value(index, j));
                        qsum += i32::from(a);
                    }
                    let sign = if x.delta_negative(ib, l) { -1 } else { 1 };
                    grid_sums[l / 2] += lsum;
                    delta_sums[l / 2] += qsum * sign;
                }
                let (ls1, ls2) = (x.scale(ib, 0), x.scale(ib, 1));
                sumi += grid_sums[0] * ls1 + grid_sums[1] * ls2;
                sumi_delta += delta_sums[0] * ls1 + delta_sums[1] * ls2;
            }
            sumf += x.d().to_f32() * y.d * (sumi as f32 + IQ1_DELTA * sumi_delta as f32);
        }
        sumf
    }
}

/// Writes the f16 super-block scale of an IQ1_M block into the top nibbles of its four
/// scale words, keeping the 12 low bits of each (the group scales).
pub(crate) fn set_iq1m_scale(scales: &mut [u8], d: f16) {
    let bits = d.to_bits();
    for k in 0..4 {
        let word = u16::from_le_bytes([scales[2 * k], scales[2 * k + 1]]);
        let nibble = (bits >> (4 * k)) & 0x0f;
        let word = (word & 0x0fff) | (nibble << 12);
        scales[2 * k..2 * k + 2].copy_from_slice(&word.to_le_bytes());
    }
}
