//! The 32-value "legacy" formats: Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, Q8_1.
//!
//! All six quantize with ggml's reference (`quantize_row_*_ref`) algorithm. Q8_0 and Q8_1
//! double as the activation formats of the dot products of the others.

use crate::block::{Block, Dot, Quantize, Reader, Writer};
use half::f16;
use redlite_gguf::GgmlType;
use std::mem::size_of;

const QK: usize = 32;

/// `d · (q − 8)`, q a nibble: values j (low nibbles) and j + 16 (high nibbles) share byte j.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct BlockQ4_0 {
    pub d: f16,
    pub qs: [u8; QK / 2],
}
const _: () = assert!(size_of::<BlockQ4_0>() == 18);

/// `d · q + m`, q a nibble.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct BlockQ4_1 {
    pub d: f16,
    pub m: f16,
    pub qs: [u8; QK / 2],
}
const _: () = assert!(size_of::<BlockQ4_1>() == 20);

/// `d · (q − 16)`, q 5 bits: the nibble plus bit j of `qh` (little-endian u32) for value j.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct BlockQ5_0 {
    pub d: f16,
    pub qh: [u8; 4],
    pub qs: [u8; QK / 2],
}
const _: () = assert!(size_of::<BlockQ5_0>() == 22);

/// `d · q + m`, q 5 bits as in Q5_0.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct BlockQ5_1 {
    pub d: f16,
    pub m: f16,
    pub qh: [u8; 4],
    pub qs: [u8; QK / 2],
}
const _: () = assert!(size_of::<BlockQ5_1>() == 24);

/// `d · q`, q int8.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct BlockQ8_0 {
    pub d: f16,
    pub qs: [i8; QK],
}
const _: () = assert!(size_of::<BlockQ8_0>() == 34);

/// `d · q`, q int8; `s` = d · Σq, which the Q4_1 / Q5_1 dots use for their min term.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct BlockQ8_1 {
    pub d: f16,
    pub s: f16,
    pub qs: [i8; QK],
}
const _: () = assert!(size_of::<BlockQ8_1>() == 36);

/// Splits the nibble bytes into the 32 low-nibble-first codes.
fn nibbles(qs: &[u8; QK / 2]) -> [u8; QK] {
    let mut q = [0u8; QK];
    for (j, &byte) in qs.iter().enumerate() {
        q[j] = byte & 0x0f;
        q[j + QK / 2] = byte >> 4;
    }
    q
}

/// The 5-bit codes of Q5_0 / Q5_1.
fn five_bit(qs: &[u8; QK / 2], qh: [u8; 4]) -> [u8; QK] {
    let high = u32::from_le_bytes(qh);
    let mut q = nibbles(qs);
    for (j, code) in q.iter_mut().enumerate() {
        *code |= (((high >> j) & 1) as u8) << 4;
    }
    q
}

/// Packs 32 codes (≤ 31) into nibble bytes and, for 5-bit codes, the high-bit word.
fn pack(codes: &[u8; QK]) -> ([u8; QK / 2], [u8; 4]) {
    let mut qs = [0u8; QK / 2];
    let mut qh = 0u32;
    for j in 0..QK / 2 {
        let (lo, hi) = (codes[j], codes[j + QK / 2]);
        qs[j] = (lo & 0x0f) | ((hi & 0x0f) << 4);
        qh |= u32::from(lo >> 4) << j;
        qh |= u32::from(hi >> 4) << (j + QK / 2);
    }
    (qs, qh.to_le_bytes())
}

/// The value of largest magnitude (the first one on ties), as ggml's symmetric quantizers
/// pick it.
fn signed_absmax(values: &[f32]) -> f32 {
    let (mut amax, mut max) = (0.0f32, 0.0f32);
    for &v in values {
        if amax < v.abs() {
            amax = v.abs();
            max = v;
        }
    }
    max
}

fn min_max(values: &[f32]) -> (f32, f32) {
    let (mut min, mut max) = (f32::MAX, -f32::MAX);
    for &v in values {
        min = min.min(v);
        max = max.max(v);
    }
    (min, max)
}

fn inverse(d: f32) -> f32 {
    if d != 0.0 {
        1.0 / d
    } else {
        0.0
    }
}

/// Symmetric codes `min(top, trunc(x·id + offset))`, as ggml's Q4_0 / Q5_0 reference does
/// (the C code truncates through an int8 cast; the operand is never negative).
fn symmetric_codes(values: &[f32], id: f32, offset: f32, top: u8) -> [u8; QK] {
    let mut codes = [0u8; QK];
    for (code, &v) in codes.iter_mut().zip(values) {
        *code = ((v * id + offset) as i8 as u8).min(top);
    }
    codes
}

/// Affine codes `min(top, trunc((x − min)·id + 0.5))` of the Q4_1 / Q5_1 reference.
fn affine_codes(values: &[f32], min: f32, id: f32, top: u8) -> [u8; QK] {
    let mut codes = [0u8; QK];
    for (code, &v) in codes.iter_mut().zip(values) {
        *code = (((v - min) * id + 0.5) as i8 as u8).min(top);
    }
    codes
}

/// ggml's Q8 reference rounding: `roundf` (half away from zero) of `x · id`.
fn q8_codes(values: &[f32]) -> (f32, [i8; QK]) {
    let amax = values.iter().fold(0.0f32, |acc, v| acc.max(v.abs()));
    let d = amax / 127.0;
    let id = inverse(d);
    let mut qs = [0i8; QK];
    for (q, &v) in qs.iter_mut().zip(values) {
        *q = (v * id).round() as i8;
    }
    (d, qs)
}

impl Block for BlockQ4_0 {
    const TYPE: GgmlType = GgmlType::Q4_0;
    const VALUES: usize = QK;
    const BYTES: usize = 18;

    fn read(bytes: &[u8]) -> Self {
        let mut r = Reader::new(bytes);
        BlockQ4_0 {
            d: r.f16(),
            qs: r.bytes(),
        }
    }

    fn dequantize(&self, out: &mut [f32]) {
        let d = self.d.to_f32();
        for (y, q) in out.iter_mut().zip(nibbles(&self.qs)) {
            *y = d * (i32::from(q) - 8) as f32;
        }
    }
}

impl Quantize for BlockQ4_0 {
    fn quantize(values: &[f32]) -> Self {
        let d = signed_absmax(values) / -8.0;
        let codes = symmetric_codes(values, inverse(d), 8.5, 15);
        BlockQ4_0 {
            d: f16::from_f32(d),
            qs: pack(&codes).0,
        }
    }

    fn write(&self, out: &mut [u8]) {
        let mut w = Writer::new(out);
        w.f16(self.d);
        w.bytes(&self.qs);
    }
}

impl Dot for BlockQ4_0 {
    type Activation = BlockQ8_0;

    fn dot(weights: &[Self], activation: &[BlockQ8_0]) -> f32 {
        let mut sumf = 0.0f32;
        for (x, y) in weights.iter().zip(activation) {
            let sumi: i32 = nibbles(&x.qs)
                .iter()
                .zip(&y.qs)
                .map(|(&q, &a)| (i32::from(q) - 8) * i32::from(a))
                .sum();
            sumf += sumi as f32 * x.d.to_f32() * y.d.to_f32();
        }
        sumf
    }
}

impl Block for BlockQ4_1 {
    const TYPE: GgmlType = GgmlType::Q4_1;
    const VALUES: usize = QK;
    const BYTES: usize = 20;

    fn read(bytes: &[u8]) -> Self {
        let mut r = Reader::new(bytes);
        BlockQ4_1 {
            d: r.f16(),
            m: r.f16(),
            qs: r.bytes(),
        }
    }

    fn dequantize(&self, out: &mut [f32]) {
        let (d, m) = (self.d.to_f32(), self.m.to_f32());
        for (y, q) in out.iter_mut().zip(nibbles(&self.qs)) {
            *y = d * f32::from(q) + m;
        }
    }
}

impl Quantize for BlockQ4_1 {
    fn quantize(values: &[f32]) -> Self {
        let (min, max) = min_max(values);
        let d = (max - min) / 15.0;
        let codes = affine_codes(values, min, inverse(d), 15);
        BlockQ4_1 {
            d: f16::from_f32(d),
            m: f16::from_f32(min),
            qs: pack(&codes).0,
        }
    }

    fn write(&self, out: &mut [u8]) {
        let mut w = Writer::new(out);
        w.f16(self.d);
        w.f16(self.m);
        w.bytes(&self.qs);
    }
}

impl Dot for BlockQ4_1 {
    type Activation = BlockQ8_1;

    fn dot(weights: &[Self], activation: &[BlockQ8_1]) -> f32 {
        let mut sumf = 0.0f32;
        for (x, y) in weights.iter().zip(activation) {
            let sumi: i32 = nibbles(&x.qs)
                .iter()
                .zip(&y.qs)
                .map(|(&q, &a)| i32::from(q) * i32::from(a))
                .sum();
            sumf += (x.d.to_f32() * y.d.to_f32()) * sumi as f32 + x.m.to_f32() * y.s.to_f32();
        }
        sumf
    }
}

impl Block for BlockQ5_0 {
    const TYPE: GgmlType = GgmlType::Q5_0;
    const VALUES: usize = QK;
    const BYTES: usize = 22;

    fn read(bytes: &[u8]) -> Self {
        let mut r = Reader::new(bytes);
        BlockQ5_0 {
            d: r.f16(),
            qh: r.bytes(),
            qs: r.bytes(),
        }
    }

    fn dequantize(&self, out: &mut [f32]) {
        let d = self.d.to_f32();
        for (y, q) in out.iter_mut().zip(five_bit(&self.qs, self.qh)) {
            *y = d * (i32::from(q) - 16) as f32;
        }
    }
}

impl Quantize for BlockQ5_0 {
    fn quantize(values: &[f32]) -> Self {
        let d = signed_absmax(values) / -16.0;
        let (qs, qh) = pack(&symmetric_codes(values, inverse(d), 16.5, 31));
        BlockQ5_0 {
            d: f16::from_f32(d),
            qh,
            qs,
        }
    }

    fn write(&self, out: &mut [u8]) {
        let mut w = Writer::new(out);
        w.f16(self.d);
        w.bytes(&self.qh);
        w.bytes(&self.qs);
    }
}

impl Dot for BlockQ5_0 {
    type Activation = BlockQ8_0;

    fn dot(weights: &[Self], activation: &[BlockQ8_0]) -> f32 {
        let mut sumf = 0.0f32;
        for (x, y) in weights.iter().zip(activation) {
            let sumi: i32 = five_bit(&x.qs, x.qh)
                .iter()
                .zip(&y.qs)
                .map(|(&q, &a)| (i32::from(q) - 16) * i32::from(a))
                .sum();
            sumf += (x.d.to_f32() * y.d.to_f32()) * sumi as f32;
        }
        sumf
    }
}

impl Block for BlockQ5_1 {
    const TYPE: GgmlType = GgmlType::Q5_1;
    const VALUES: usize = QK;
    const BYTES: usize = 24;

    fn read(bytes: &[u8]) -> Self {
        let mut r = Reader::new(bytes);
        BlockQ5_1 {
            d: r.f16(),
            m: r.f16(),
            qh: r.bytes(),
            qs: r.bytes(),
        }
    }

    fn dequantize(&self, out: &mut [f32]) {
        let (d, m) = (self.d.to_f32(), self.m.to_f32());
        for (y, q) in out.iter_mut().zip(five_bit(&self.qs, self.qh)) {
            *y = d * f32::from(q) + m;
        }
    }
}

impl Quantize for BlockQ5_1 {
    fn quantize(values: &[f32]) -> Self {
        let (min, max) = min_max(values);
        let d = (max - min) / 31.0;
        let (qs, qh) = pack(&affine_codes(values, min, inverse(d), 31));
        BlockQ5_1 {
            d: f16::from_f32(d),
            m: f16::from_f32(min),
            qh,
            qs,
        }
    }

    fn write(&self, out: &mut [u8]) {
        let mut w = Writer::new(out);
        w.f16(self.d);
        w.f16(self.m);
        w.bytes(&self.qh);
        w.bytes(&self.qs);
    }
}

impl Dot for BlockQ5_1 {
    type Activation = BlockQ8_1;

    fn dot(weights: &[Self], activation: &[BlockQ8_1]) -> f32 {
        let mut sumf = 0.0f32;
        for (x, y) in weights.iter().zip(activation) {
            let sumi: i32 = five_bit(&x.qs, x.qh)
                .iter()
                .zip(&y.qs)
                .map(|(&q, &a)| i32::from(q) * i32::from(a))
                .sum();
            sumf += (x.d.to_f32() * y.d.to_f32()) * sumi as f32 + x.m.to_f32() * y.s.to_f32();
        }
        sumf
    }
}

impl Block for BlockQ8_0 {
    const TYPE: GgmlType = GgmlType::Q8_0;
    const VALUES: usize = QK;
    const BYTES: usize = 34;

    fn read(bytes: &[u8]) -> Self {
        let mut r = Reader::new(bytes);
        BlockQ8_0 {
            d: r.f16(),
            qs: r.i8s(),
        }
    }

    fn dequantize(&self, out: &mut [f32]) {
        let d = self.d.to_f32();
        for (y, &q) in out.iter_mut().zip(&self.qs) {
            *y = f32::from(q) * d;
        }
    }
}

impl Quantize for BlockQ8_0 {
    fn quantize(values: &[f32]) -> Self {
        let (d, qs) = q8_codes(values);
        BlockQ8_0 {
            d: f16::from_f32(d),
            qs,
        }
    }

    fn write(&self, out: &mut [u8]) {
        let mut w = Writer::new(out);
        w.f16(self.d);
        w.i8s(&self.qs);
    }
}

/// Integer dot of two int8 blocks.
fn int8_dot(a: &[i8; QK], b: &[i8; QK]) -> i32 {
    a.iter()
        .zip(b)
        .map(|(&x, &y)| i32::from(x) * i32::from(y))
        .sum()
}

impl Dot for BlockQ8_0 {
    type Activation = BlockQ8_0;

    fn dot(weights: &[Self], activation: &[BlockQ8_0]) -> f32 {
        let mut sumf = 0.0f32;
        for (x, y) in weights.iter().zip(activation) {
            sumf += int8_dot(&x.qs, &y.qs) as f32 * (x.d.to_f32() * y.d.to_f32());
        }
        sumf
    }
}

impl Block for BlockQ8_1 {
    const TYPE: GgmlType = GgmlType::Q8_1;
    const VALUES: usize = QK;
    const BYTES: usize = 36;

    fn read(bytes: &[u8]) -> Self {
        let mut r = Reader::new(bytes);
        BlockQ8_1 {
            d: r.f16(),
            s: r.f16(),
            qs: r.i8s(),
        }
    }

    fn dequantize(&self, out: &mut [f32]) {
        let d = self.d.to_f32();
        for (y, &q) in out.iter_mut().zip(&self.qs) {
            *y = f32::from(q) * d;
        }
    }
}

impl Quantize for BlockQ8_1 {
    fn quantize(values: &[f32]) -> Self {
        let (d, qs) = q8_codes(values);
        let sum: i32 = qs.iter().map(|&q| i32::from(q)).sum();
        BlockQ8_1 {
            d: f16::from_f32(d),
            s: f16::from_f32(sum as f32 * d),
            qs,
        }
    }

    fn write(&self, out: &mut [u8]) {
        let mut w = Writer::new(out);
        w.f16(self.d);
        w.f16(self.s);
        w.i8s(&self.qs);
    }
}

/// ggml has no Q8_1 weight dot; this pairs Q8_1 with itself like Q8_0 × Q8_0.
impl Dot for BlockQ8_1 {
    type Activation = BlockQ8_1;

    fn dot(weights: &[Self], activation: &[BlockQ8_1]) -> f32 {
        let mut sumf = 0.0f32;
        for (x, y) in weights.iter().zip(activation) {
            sumf += int8_dot(&x.qs, &y.qs) as f32 * (x.d.to_f32() * y.d.to_f32());
        }
        sumf
    }
}
