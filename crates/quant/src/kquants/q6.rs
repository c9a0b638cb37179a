//! Q6_K: 16 sub-blocks of 16 values with int8 scales and 6-bit codes.
//!
//! Two halves of 128 values: half H uses `ql[64H..64H+64]`, `qh[32H..32H+32]`; for
//! l = 0..32 the four values l, l+32, l+64, l+96 of the half take the low nibble of
//! `ql[l]`, the low nibble of `ql[l+32]`, the high nibble of `ql[l]`, the high nibble of
//! `ql[l+32]`, each with two high bits from `qh[l]` (bits 0-1, 2-3, 4-5, 6-7).

use super::{lane_sums, make_qx_quants, BlockQ8K, Lanes, GROUP_MAX_EPS, QK_K};
use crate::block::{nearest_int, Block, Dot, Quantize, Reader, Writer};
use half::f16;
use redlite_gguf::GgmlType;
use std::mem::size_of;

/// `d·scales[s]·(q − 32)`.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct BlockQ6K {
    pub ql: [u8; QK_K / 2],
    pub qh: [u8; QK_K / 4],
    pub scales: [i8; QK_K / 16],
    pub d: f16,
}
const _: () = assert!(size_of::<BlockQ6K>() == 210);

impl BlockQ6K {
    /// The signed codes (q − 32, in −32..=31) in value order.
    fn codes(&self) -> [i8; QK_K] {
        let mut codes = [0i8; QK_K];
        for half in 0..2 {
            let ql = &self.ql[64 * half..64 * half + 64];
            let qh = &self.qh[32 * half..32 * half + 32];
            let out = &mut codes[128 * half..128 * half + 128];
            for l in 0..32 {
                let h = qh[l];
                out[l] = ((ql[l] & 0x0f) | ((h & 3) << 4)) as i8 - 32;
                out[l + 32] = ((ql[l + 32] & 0x0f) | (((h >> 2) & 3) << 4)) as i8 - 32;
                out[l + 64] = ((ql[l] >> 4) | (((h >> 4) & 3) << 4)) as i8 - 32;
                out[l + 96] = ((ql[l + 32] >> 4) | (((h >> 6) & 3) << 4)) as i8 - 32;
            }
        }
        codes
    }
}

impl Block for BlockQ6K {
    const TYPE: GgmlType = GgmlType::Q6K;
    const VALUES: usize = QK_K;
    const BYTES: usize = 210;

    fn read(bytes: &[u8]) -> Self {
        let mut r = Reader::new(bytes);
        BlockQ6K {
            ql: r.bytes(),
            qh: r.bytes(),
            scales: r.i8s(),
            d: r.f16(),
        }
    }

    fn dequantize(&self, out: &mut [f32]) {
        let d = self.d.to_f32();
        let codes = self.codes();
        for (s, (ys, qs)) in out
            .chunks_exact_mut(16)
            .zip(codes.chunks_exact(16))
            .enumerate()
        {
            let dl = d * f32::from(self.scales[s]);
            for (y, &q) in ys.iter_mut().zip(qs) {
                *y = dl * f32::from(q);
            }
        }
    }
}

impl Quantize for BlockQ6K {
    /// ggml's `quantize_row_q6_K_ref`: fit each sub-block with `make_qx_quants`, scale the
    /// 16 scales so the signed largest maps to −128, then requantize every value against
    /// its stored (rounded) scale.
    fn quantize(values: &[f32]) -> Self {
        let mut codes = [0u8; QK_K];
        let mut scales = [0f32; QK_K / 16];
        let (mut max_scale, mut max_abs_scale) = (0.0f32, 0.0f32);
        for (ib, x) in values.chunks_exact(16).enumerate() {
            scales[ib] = make_qx_quants(x, 32, &mut codes[16 * ib..16 * ib + 16]);
            if scales[ib].abs() > max_abs_scale {
                max_abs_scale = scales[ib].abs();
                max_scale = scales[ib];
            }
        }
        if max_abs_scale < GROUP_MAX_EPS {
            return BlockQ6K {
                ql: [0; QK_K / 2],
                qh: [0; QK_K / 4],
                scales: [0; QK_K / 16],
                d: f16::ZERO,
            };
        }

        let iscale = -128.0 / max_scale;
        let d = f16::from_f32(1.0 / iscale);
        let mut block_scales = [0i8; QK_K / 16];
        for (stored, &scale) in block_scales.iter_mut().zip(&scales) {
            *stored = nearest_int(iscale * scale).min(127) as i8;
        }
        for (j, x) in values.chunks_exact(16).enumerate() {
            let dl = d.to_f32() * f32::from(block_scales[j]);
            if dl == 0.0 {
                continue;
            }
            for (code, &v) in codes[16 * j..16 * j + 16].iter_mut().zip(x) {
                *code = (nearest_int(v / dl).clamp(-32, 31) + 32) as u8;
            }
        }

        let mut ql = [0u8; QK_K / 2];
        let mut qh = [0u8; QK_K / 4];
        for half in 0..2 {
            let l_codes = &codes[128 * half..128 * half + 128];
            for l in 0..32 {
                let (q1, q2, q3, q4) = (
                    l_codes[l],
                    l_codes[l + 32],
                    l_codes[l + 64],
                    l_codes[l + 96],
                );
                ql[64 * half + l] = (q1 & 0x0f) | ((q3 & 0x0f) << 4);
                ql[64 * half + l + 32] = (q2 & 0x0f) | ((q4 & 0x0f) << 4);
                qh[32 * half + l] =
                    (q1 >> 4) | ((q2 >> 4) << 2) | ((q3 >> 4) << 4) | ((q4 >> 4) << 6);
            }
        }
        BlockQ6K {
            ql,
            qh,
            scales: block_scales,
            d,
        }
    }

    fn write(&self, out: &mut [u8]) {
        let mut w = Writer::new(out);
        w.bytes(&self.ql);
        w.bytes(&self.qh);
        w.i8s(&self.scales);
        w.f16(self.d);
    }
}

impl Dot for BlockQ6K {
    type Activation = BlockQ8K;

    fn dot(weights: &[Self], activation: &[BlockQ8K]) -> f32 {
        let mut lanes = Lanes::default();
        for (x, y) in weights.iter().zip(activation) {
            let scale16 = x.scales.map(i32::from);
            lanes.add(x.d.to_f32() * y.d, &lane_sums(&x.codes(), &y.qs, &scale16));
        }
        lanes.total(0.0)
    }
}
