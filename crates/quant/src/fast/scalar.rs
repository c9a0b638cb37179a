//! Scalar row kernels straight from the bytes: ggml's reference integer math with the
//! reference's float order, so every result is bit-identical to [`crate::dot_row`]. They
//! decode in place (no block copies, no allocation) and are the fallback where no SIMD
//! level is available.

use super::dispatch::RowDots;
use crate::tables::{IQ1S_GRID, IQ1_DELTA, IQ2XS_GRID, IQ2XXS_GRID, KSIGNS_IQ2XS};
use crate::QK_K;
use half::f16;

pub(crate) static KERNELS: RowDots = RowDots {
    q8_0,
    q2_k,
    q4_k,
    q5_k,
    q6_k,
    iq2_xxs,
    iq2_xs,
    iq1_m,
    f32: f32_row,
    f16: f16_row,
};

/// Q8_K activation block: `d` f32 @0, 256 int8 codes @4, 16 i16 group sums @260.
pub(crate) const Q8K_BYTES: usize = 292;
pub(crate) const Q8K_QS: usize = 4;
pub(crate) const Q8K_BSUMS: usize = 260;

/// Q8_0 block: `d` f16 @0, 32 int8 codes @2.
pub(crate) const Q8_0_BYTES: usize = 34;

#[inline]
pub(crate) fn u16_at(bytes: &[u8], offset: usize) -> u16 {
    u16::from_le_bytes([bytes[offset], bytes[offset + 1]])
}

#[inline]
pub(crate) fn u32_at(bytes: &[u8], offset: usize) -> u32 {
    u32::from_le_bytes([
        bytes[offset],
        bytes[offset + 1],
        bytes[offset + 2],
        bytes[offset + 3],
    ])
}

#[inline]
pub(crate) fn f32_at(bytes: &[u8], offset: usize) -> f32 {
    f32::from_bits(u32_at(bytes, offset))
}

fn f16_at(bytes: &[u8], offset: usize) -> f32 {
    f16::from_bits(u16_at(bytes, offset)).to_f32()
}

/// f16 → f32, exact, in general-purpose registers and one multiply. The SIMD kernels use
/// it for block scales: LLVM lowers a one-lane F16C conversion to a `pinsrw` that merges
/// into whatever register is free, often the accumulator, chaining every block's scale to
/// the previous block's FMA (Q8_0 ran at half speed).
pub(crate) fn f16_to_f32(bits: u16) -> f32 {
    let bits = u32::from(bits);
    let sign = (bits & 0x8000) << 16;
    let magnitude = bits & 0x7fff;
    if magnitude >= 0x7c00 {
        let quiet = if magnitude > 0x7c00 { 0x0040_0000 } else { 0 };
        return f32::from_bits(sign | 0x7f80_0000 | quiet | ((magnitude & 0x3ff) << 13));
    }
    // The f16 bits moved into f32 position read as the value · 2^-112, normal and
    // subnormal alike; multiplying by 2^112 is exact.
    let two_pow_112 = f32::from_bits(0x7780_0000);
    let value = f32::from_bits(magnitude << 13) * two_pow_112;
    f32::from_bits(value.to_bits() | sign)
}

/// Group sum j (0..16) of a Q8_K block.
fn bsum(q8k: &[u8], j: usize) -> i32 {
    i32::from(u16_at(q8k, Q8K_BSUMS + 2 * j) as i16)
}

/// Code i of a Q8_K block.
fn q8(q8k: &[u8], i: usize) -> i32 {
    i32::from(q8k[Q8K_QS + i] as i8)
}

/// The eight 6-bit scales and eight 6-bit mins of Q4_K / Q5_K from their 12 packed bytes
/// (ggml's `get_scale_min_k4` for all sub-blocks at once).
#[inline]
pub(crate) fn scales_mins_k4(packed: &[u8]) -> ([u8; 8], [u8; 8]) {
    let (s0, s1, s2) = (u32_at(packed, 0), u32_at(packed, 4), u32_at(packed, 8));
    let low6 = 0x3f3f_3f3f;
    let scales_hi = (s2 & 0x0f0f_0f0f) | (((s0 >> 6) & 0x0303_0303) << 4);
    let mins_hi = ((s2 >> 4) & 0x0f0f_0f0f) | (((s1 >> 6) & 0x0303_0303) << 4);
    let join = |lo: u32, hi: u32| {
        let mut out = [0u8; 8];
        out[..4].copy_from_slice(&lo.to_le_bytes());
        out[4..].copy_from_slice(&hi.to_le_bytes());
        out
    };
    (join(s0 & low6, scales_hi), join(s1 & low6, mins_hi))
}

/// ggml's eight float lane accumulators of the Q4_K / Q5_K / Q6_K dots: lane l gets
/// `d · Σ scale·code·q8` over the elements i ≡ l (mod 8) of each block; summed once.
struct Lanes([f32; 8]);

impl Lanes {
    fn add(&mut self, d: f32, lanes: &[i32; 8]) {
        for (sum, &lane) in self.0.iter_mut().zip(lanes) {
            *sum += d * lane as f32;
        }
    }

    fn total(&self, mut start: f32) -> f32 {
        for &sum in &self.0 {
            start += sum;
        }
        start
    }
}

fn q8_0(row: &[u8], act: &[u8]) -> f32 {
    let mut sumf = 0.0f32;
    for (x, y) in row
        .chunks_exact(Q8_0_BYTES)
        .zip(act.chunks_exact(Q8_0_BYTES))
    {
        let sumi: i32 = x[2..]
            .iter()
            .zip(&y[2..])
            .map(|(&w, &a)| i32::from(w as i8) * i32::from(a as i8))
            .sum();
        sumf += sumi as f32 * (f16_at(x, 0) * f16_at(y, 0));
    }
    sumf
}

/// Q2_K: scales[16] @0, qs[64] @16, d @80, dmin @82.
fn q2_k(row: &[u8], act: &[u8]) -> f32 {
    let mut sumf = 0.0f32;
    for (x, y) in row.chunks_exact(84).zip(act.chunks_exact(Q8K_BYTES)) {
        let scales = &x[..16];
        let qs = &x[16..80];
        let summs: i32 = (0..16)
            .map(|j| bsum(y, j) * i32::from(scales[j] >> 4))
            .sum();
        let mut sub_sums = [0i32; 16];
        for half in 0..2 {
            for p in 0..4 {
                for l in 0..32 {
                    let n = 128 * half + 32 * p + l;
                    let code = (qs[32 * half + l] >> (2 * p)) & 3;
                    sub_sums[n / 16] += q8(y, n) * i32::from(code);
                }
            }
        }
        let isum: i32 = (0..16)
            .map(|s| i32::from(scales[s] & 0x0f) * sub_sums[s])
            .sum();
        let yd = f32_at(y, 0);
        let dall = yd * f16_at(x, 80);
        let dmin = yd * f16_at(x, 82);
        sumf += dall * isum as f32 - dmin * summs as f32;
    }
    sumf
}

/// The shared Q4_K / Q5_K dot; `code(x, n)` is the unsigned code of value n.
fn affine_k(row: &[u8], act: &[u8], block_bytes: usize, code: fn(&[u8], usize) -> i32) -> f32 {
    let mut lanes = Lanes([0.0; 8]);
    let mut sumf = 0.0f32;
    for (x, y) in row
        .chunks_exact(block_bytes)
        .zip(act.chunks_exact(Q8K_BYTES))
    {
        let (scales, mins) = scales_mins_k4(&x[4..16]);
        let min_sum: i32 = (0..16).map(|j| bsum(y, j) * i32::from(mins[j / 2])).sum();
        let mut sums = [0i32; 8];
        for n in 0..QK_K {
            sums[n % 8] += i32::from(scales[n / 32]) * (code(x, n) * q8(y, n));
        }
        let yd = f32_at(y, 0);
        lanes.add(f16_at(x, 0) * yd, &sums);
        sumf -= f16_at(x, 2) * yd * min_sum as f32;
    }
    lanes.total(sumf)
}

/// Q4_K: d @0, dmin @2, scales[12] @4, qs[128] @16; value 64c + l (l < 32) is the low
/// nibble of qs[32c + l], value 64c + 32 + l its high nibble.
fn q4_k(row: &[u8], act: &[u8]) -> f32 {
    affine_k(row, act, 144, |x, n| {
        let byte = x[16 + 32 * (n / 64) + n % 32];
        i32::from(if n % 64 < 32 { byte & 0x0f } else { byte >> 4 })
    })
}

/// Q5_K: as Q4_K with qh[32] @16, qs[128] @48; bit n/32 of qh[n % 32] is bit 4 of value n.
fn q5_k(row: &[u8], act: &[u8]) -> f32 {
    affine_k(row, act, 176, |x, n| {
        let byte = x[48 + 32 * (n / 64) + n % 32];
        let low = if n % 64 < 32 { byte & 0x0f } else { byte >> 4 };
        let high = (x[16 + n % 32] >> (n / 32)) & 1;
        i32::from(low | (high << 4))
    })
}

/// Q6_K: ql[128] @0, qh[64] @128, int8 scales[16] @192, d @208.
fn q6_k(row: &[u8], act: &[u8]) -> f32 {
    let mut lanes = Lanes([0.0; 8]);
    for (x, y) in row.chunks_exact(210).zip(act.chunks_exact(Q8K_BYTES)) {
        let mut sums = [0i32; 8];
        for half in 0..2 {
            let ql = &x[64 * half..64 * half + 64];
            let qh = &x[128 + 32 * half..128 + 32 * half + 32];
            for l in 0..32 {
                let h = qh[l];
                let codes = [
                    (ql[l] & 0x0f) | ((h & 3) << 4),
                    (ql[l + 32] & 0x0f) | (((h >> 2) & 3) << 4),
                    (ql[l] >> 4) | (((h >> 4) & 3) << 4),
                    (ql[l + 32] >> 4) | (((h >> 6) & 3) << 4),
                ];
                for (k, &code) in codes.iter().enumerate() {
                    let n = 128 * half + 32 * k + l;
                    let scale = i32::from(x[192 + n / 16] as i8);
                    sums[n % 8] += scale * ((i32::from(code) - 32) * q8(y, n));
                }
            }
        }
        lanes.add(f16_at(x, 208) * f32_at(y, 0), &sums);
    }
    lanes.total(0.0)
}

/// One IQ2 group of 8 values: (grid entry, sign byte, 4-bit sub-block scale).
type Iq2Group = (u64, u8, u8);

/// The shared IQ2_XXS / IQ2_XS dot: per sub-block Σ (2s + 1)·Σ grid·sign·q8 over its four
/// groups, times `d · d8`, and a final 1/8. `group(x, ib, l)` is group l of sub-block ib.
fn iq2(
    row: &[u8],
    act: &[u8],
    block_bytes: usize,
    group: fn(&[u8], usize, usize) -> Iq2Group,
) -> f32 {
    let mut sumf = 0.0f32;
    for (x, y) in row
        .chunks_exact(block_bytes)
        .zip(act.chunks_exact(Q8K_BYTES))
    {
        let mut bsum = 0i32;
        for g in 0..QK_K / 8 {
            let (grid, signs, scale) = group(x, g / 4, g % 4);
            let mut sumi = 0i32;
            for j in 0..8 {
                let magnitude = i32::from((grid >> (8 * j)) as u8);
                let value = magnitude * q8(y, 8 * g + j);
                sumi += if signs & (1 << j) != 0 { -value } else { value };
            }
            bsum += sumi * (2 * i32::from(scale) + 1);
        }
        sumf += f16_at(x, 0) * f32_at(y, 0) * bsum as f32;
    }
    0.125 * sumf
}

/// IQ2_XXS: d @0, per sub-block two u32 @2 + 8ib: grid indices, then 4 × 7 sign bits and
/// the scale in bits 28..32.
fn iq2_xxs(row: &[u8], act: &[u8]) -> f32 {
    iq2(row, act, 66, |x, ib, l| {
        let (a, b) = (u32_at(x, 2 + 8 * ib), u32_at(x, 6 + 8 * ib));
        (
            IQ2XXS_GRID[((a >> (8 * l)) & 0xff) as usize],
            KSIGNS_IQ2XS[((b >> (7 * l)) & 127) as usize],
            (b >> 28) as u8,
        )
    })
}

/// IQ2_XS: d @0, one u16 per group @2 (9-bit grid index, 7-bit sign index), scales[8] @66.
fn iq2_xs(row: &[u8], act: &[u8]) -> f32 {
    iq2(row, act, 74, |x, ib, l| {
        let word = u16_at(x, 2 + 2 * (4 * ib + l));
        (
            IQ2XS_GRID[usize::from(word & 511)],
            KSIGNS_IQ2XS[usize::from(word >> 9)],
            (x[66 + ib] >> (4 * (l / 2))) & 0x0f,
        )
    })
}

/// The f16 super-block scale of an IQ1_M block: the top nibbles of its four scale words.
pub(crate) fn iq1m_d(scale_words: [u16; 4]) -> u16 {
    let w = scale_words;
    (w[0] >> 12) | ((w[1] >> 8) & 0x00f0) | ((w[2] >> 4) & 0x0f00) | (w[3] & 0xf000)
}

/// IQ1_M: qs[32] @0, qh[16] @32, scale words @48.
fn iq1_m(row: &[u8], act: &[u8]) -> f32 {
    let mut sumf = 0.0f32;
    for (x, y) in row.chunks_exact(56).zip(act.chunks_exact(Q8K_BYTES)) {
        let words = [0, 1, 2, 3].map(|k| u16_at(x, 48 + 2 * k));
        let (mut sumi, mut sumi_delta) = (0i32, 0i32);
        for ib in 0..QK_K / 32 {
            let (mut grid_sums, mut delta_sums) = ([0i32; 2], [0i32; 2]);
            for l in 0..4 {
                let qh = x[32 + 2 * ib + l / 2] >> (4 * (l % 2));
                let index = usize::from(x[4 * ib + l]) | (usize::from(qh & 7) << 8);
                let (mut lsum, mut qsum) = (0i32, 0i32);
                for j in 0..8 {
                    let a = q8(y, 32 * ib + 8 * l + j);
                    lsum += a * i32::from((IQ1S_GRID[index] >> (8 * j)) as u8 as i8);
                    qsum += a;
                }
                grid_sums[l / 2] += lsum;
                delta_sums[l / 2] += if qh & 8 != 0 { -qsum } else { qsum };
            }
            let word = words[ib / 2];
            let ls1 = 2 * i32::from((word >> (6 * (ib % 2))) & 7) + 1;
            let ls2 = 2 * i32::from((word >> (6 * (ib % 2) + 3)) & 7) + 1;
            sumi += grid_sums[0] * ls1 + grid_sums[1] * ls2;
            sumi_delta += delta_sums[0] * ls1 + delta_sums[1] * ls2;
        }
        let d = f16::from_bits(iq1m_d(words)).to_f32();
        sumf += d * f32_at(y, 0) * (sumi as f32 + IQ1_DELTA * sumi_delta as f32);
    }
    sumf
}

/// ggml's scalar float dot: f32 products accumulated in f64.
fn f32_row(row: &[u8], act: &[u8]) -> f32 {
    let mut sum = 0.0f64;
    for (w, a) in row.chunks_exact(4).zip(act.chunks_exact(4)) {
        sum += f64::from(f32_at(w, 0) * f32_at(a, 0));
    }
    sum as f32
}

/// F16 weights against the F16 activation (ggml's `vec_dot_type` for F16).
fn f16_row(row: &[u8], act: &[u8]) -> f32 {
    let mut sum = 0.0f64;
    for (w, a) in row.chunks_exact(2).zip(act.chunks_exact(2)) {
        sum += f64::from(f16_at(w, 0) * f16_at(a, 0));
    }
    sum as f32
}
