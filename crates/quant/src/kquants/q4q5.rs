//! Q4_K and Q5_K: 8 sub-blocks of 32 values with a 6-bit scale and a 6-bit min each.
//!
//! The 256 codes come in 4 chunks of 64: chunk c uses bytes 32c..32c+32 of `qs`, its
//! first 32 values (sub-block 2c) the low nibbles, the next 32 the high nibbles. Q5_K adds
//! bit s of `qh[l]` as the fifth bit of value 32s + l.

use super::{lane_sums, make_qkx2_quants, scale_min_k4, BlockQ8K, Lanes, QK_K};
use crate::block::{nearest_int, Block, Dot, Quantize, Reader, Writer};
use half::f16;
use redlite_gguf::GgmlType;
use std::mem::size_of;

/// `d·sc·q − dmin·m` for sub-block scale sc and min m, q 4 bits.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct BlockQ4K {
    pub d: f16,
    pub dmin: f16,
    pub scales: [u8; 12],
    pub qs: [u8; QK_K / 2],
}
const _: () = assert!(size_of::<BlockQ4K>() == 144);

/// As Q4_K with 5-bit codes.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct BlockQ5K {
    pub d: f16,
    pub dmin: f16,
    pub scales: [u8; 12],
    pub qh: [u8; QK_K / 8],
    pub qs: [u8; QK_K / 2],
}
const _: () = assert!(size_of::<BlockQ5K>() == 176);

fn nibble_codes(qs: &[u8; QK_K / 2]) -> [i8; QK_K] {
    let mut codes = [0i8; QK_K];
    for chunk in 0..4 {
        for l in 0..32 {
            let byte = qs[32 * chunk + l];
            codes[64 * chunk + l] = (byte & 0x0f) as i8;
            codes[64 * chunk + 32 + l] = (byte >> 4) as i8;
        }
    }
    codes
}

fn five_bit_codes(qs: &[u8; QK_K / 2], qh: &[u8; QK_K / 8]) -> [i8; QK_K] {
    let mut codes = nibble_codes(qs);
    for (n, code) in codes.iter_mut().enumerate() {
        let (sub, l) = (n / 32, n % 32);
        *code |= (((qh[l] >> sub) & 1) << 4) as i8;
    }
    codes
}

/// Dequantizes the shared `d·sc·q − dmin·m` layout.
fn dequantize_affine(d: f16, dmin: f16, scales: &[u8; 12], codes: &[i8; QK_K], out: &mut [f32]) {
    let (d, dmin) = (d.to_f32(), dmin.to_f32());
    for (s, (ys, qs)) in out
        .chunks_exact_mut(32)
        .zip(codes.chunks_exact(32))
        .enumerate()
    {
        let (sc, m) = scale_min_k4(s, scales);
        let d1 = d * f32::from(sc);
        let m1 = dmin * f32::from(m);
        for (y, &q) in ys.iter_mut().zip(qs) {
            *y = d1 * f32::from(q) - m1;
        }
    }
}

/// ggml's scalar Q4_K / Q5_K dot: lane sums for the scales, one integer sum for the mins.
fn dot_affine<'a>(
    blocks: impl Iterator<Item = (f16, f16, &'a [u8; 12], [i8; QK_K])>,
    activation: &[BlockQ8K],
) -> f32 {
    let mut lanes = Lanes::default();
    let mut sumf = 0.0f32;
    for ((d, dmin, scales, codes), y) in blocks.zip(activation) {
        let mut scale16 = [0i32; 16];
        let mut min_sum = 0i32;
        for (j, scale) in scale16.iter_mut().enumerate() {
            let (sc, m) = scale_min_k4(j / 2, scales);
            *scale = i32::from(sc);
            min_sum += i32::from(y.bsums[j]) * i32::from(m);
        }
        lanes.add(d.to_f32() * y.d, &lane_sums(&codes, &y.qs, &scale16));
        sumf -= dmin.to_f32() * y.d * min_sum as f32;
    }
    lanes.total(sumf)
}

impl Block for BlockQ4K {
    const TYPE: GgmlType = GgmlType::Q4K;
    const VALUES: usize = QK_K;
    const BYTES: usize = 144;

    fn read(bytes: &[u8]) -> Self {
        let mut r = Reader::new(bytes);
        BlockQ4K {
            d: r.f16(),
            dmin: r.f16(),
            scales: r.bytes(),
            qs: r.bytes(),
        }
    }

    fn dequantize(&self, out: &mut [f32]) {
        dequantize_affine(
            self.d,
            self.dmin,
            &self.scales,
            &nibble_codes(&self.qs),
            out,
        );
    }
}

impl Quantize for BlockQ4K {
    /// ggml's `quantize_row_q4_K_ref`: fit each sub-block with `make_qkx2_quants`, quantize
    /// the 8 scales and 8 mins to 6 bits against their maxima, then requantize every value
    /// against the stored (rounded) scale and min.
    fn quantize(values: &[f32]) -> Self {
        let mut codes = [0u8; QK_K];
        let mut scales = [0f32; QK_K / 32];
        let mut mins = [0f32; QK_K / 32];
        let (mut max_scale, mut max_min) = (0.0f32, 0.0f32);
        for (j, x) in values.chunks_exact(32).enumerate() {
            let mut sum_x2 = 0.0f32;
            for &v in x {
                sum_x2 += v * v;
            }
            let av_x = (sum_x2 / 32.0).sqrt();
            let mut weights = [0f32; 32];
            for (w, &v) in weights.iter_mut().zip(x) {
                *w = av_x + v.abs();
            }
            let sub_codes = &mut codes[32 * j..32 * j + 32];
            (scales[j], mins[j]) = make_qkx2_quants(x, &weights, 15, sub_codes, -1.0, 0.1, 20);
            max_scale = max_scale.max(scales[j]);
            max_min = max_min.max(mins[j]);
        }

        let inv_scale = if max_scale > 0.0 {
            63.0 / max_scale
        } else {
            0.0
        };
        let inv_min = if max_min > 0.0 { 63.0 / max_min } else { 0.0 };
        let mut packed = [0u8; 12];
        for j in 0..QK_K / 32 {
            let ls = (nearest_int(inv_scale * scales[j]) as u8).min(63);
            let lm = (nearest_int(inv_min * mins[j]) as u8).min(63);
            if j < 4 {
                packed[j] = ls;
                packed[j + 4] = lm;
            } else {
                packed[j + 4] = (ls & 0x0f) | ((lm & 0x0f) << 4);
                packed[j - 4] |= (ls >> 4) << 6;
                packed[j] |= (lm >> 4) << 6;
            }
        }
        let d = f16::from_f32(max_scale / 63.0);
        let dmin = f16::from_f32(max_min / 63.0);

        for (j, x) in values.chunks_exact(32).enumerate() {
            let (sc, m) = scale_min_k4(j, &packed);
            let dl = d.to_f32() * f32::from(sc);
            if dl == 0.0 {
                continue;
            }
            let ml = dmin.to_f32() * f32::from(m);
            for (code, &v) in codes[32 * j..32 * j + 32].iter_mut().zip(x) {
                *code = nearest_int((v + ml) / dl).clamp(0, 15) as u8;
            }
        }

        let mut qs = [0u8; QK_K / 2];
        for chunk in 0..4 {
            for l in 0..32 {
                qs[32 * chunk + l] = codes[64 * chunk + l] | (codes[64 * chunk + 32 + l] << 4);
            }
        }
        BlockQ4K {
            d,
            dmin,
            scales: packed,
            qs,
        }
    }

    fn write(&self, out: &mut [u8]) {
        let mut w = Writer::new(out);
        w.f16(self.d);
        w.f16(self.dmin);
        w.bytes(&self.scales);
        w.bytes(&self.qs);
    }
}

impl Dot for BlockQ4K {
    type Activation = BlockQ8K;

    fn dot(weights: &[Self], activation: &[BlockQ8K]) -> f32 {
        let blocks = weights
            .iter()
            .map(|x| (x.d, x.dmin, &x.scales, nibble_codes(&x.qs)));
        dot_affine(blocks, activation)
    }
}

impl Block for BlockQ5K {
    const TYPE: GgmlType = GgmlType::Q5K;
    const VALUES: usize = QK_K;
    const BYTES: usize = 176;

    fn read(bytes: &[u8]) -> Self {
        let mut r = Reader::new(bytes);
        BlockQ5K {
            d: r.f16(),
            dmin: r.f16(),
            scales: r.bytes(),
            qh: r.bytes(),
            qs: r.bytes(),
        }
    }

    fn dequantize(&self, out: &mut [f32]) {
        let codes = five_bit_codes(&self.qs, &self.qh);
        dequantize_affine(self.d, self.dmin, &self.scales, &codes, out);
    }
}

impl Dot for BlockQ5K {
    type Activation = BlockQ8K;

    fn dot(weights: &[Self], activation: &[BlockQ8K]) -> f32 {
        let blocks = weights
            .iter()
            .map(|x| (x.d, x.dmin, &x.scales, five_bit_codes(&x.qs, &x.qh)));
        dot_affine(blocks, activation)
    }
}
