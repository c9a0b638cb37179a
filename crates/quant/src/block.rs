//! What every block format shares: the block traits, little-endian field access and the
//! rounding helpers of ggml's reference code.

use half::f16;
use redlite_gguf::GgmlType;

/// One quantized block: `VALUES` values stored in `BYTES` bytes.
pub trait Block: Sized {
    const TYPE: GgmlType;
    const VALUES: usize;
    const BYTES: usize;

    /// Decodes a block from exactly `BYTES` bytes.
    fn read(bytes: &[u8]) -> Self;

    /// Writes the block's values into exactly `VALUES` floats.
    fn dequantize(&self, out: &mut [f32]);
}

/// A block that ggml's reference code can produce from floats.
pub trait Quantize: Block {
    /// Quantizes exactly `VALUES` floats.
    fn quantize(values: &[f32]) -> Self;

    /// Encodes the block into exactly `BYTES` bytes.
    fn write(&self, out: &mut [u8]);
}

/// A weight block with a reference dot product against ggml's activation format for it.
pub trait Dot: Block {
    /// The block type the activation is quantized to (ggml's `vec_dot_type`).
    type Activation: Quantize;

    /// The dot product of a row of weight blocks with the same number of activation blocks,
    /// in ggml's order of integer sums and float scalings.
    fn dot(weights: &[Self], activation: &[Self::Activation]) -> f32;
}

/// Sequential little-endian reads from a block's bytes.
pub(crate) struct Reader<'a> {
    bytes: &'a [u8],
    pos: usize,
}

impl<'a> Reader<'a> {
    pub(crate) fn new(bytes: &'a [u8]) -> Self {
        Reader { bytes, pos: 0 }
    }

    pub(crate) fn bytes<const N: usize>(&mut self) -> [u8; N] {
        let mut out = [0u8; N];
        out.copy_from_slice(&self.bytes[self.pos..self.pos + N]);
        self.pos += N;
        out
    }

    pub(crate) fn i8s<const N: usize>(&mut self) -> [i8; N] {
        self.bytes::<N>().map(|b| b as i8)
    }

    pub(crate) fn u16(&mut self) -> u16 {
        u16::from_le_bytes(self.bytes::<2>())
    }

    pub(crate) fn u16s<const N: usize>(&mut self) -> [u16; N] {
        let mut out = [0u16; N];
        for word in &mut out {
            *word = self.u16();
        }
        out
    }

    pub(crate) fn i16s<const N: usize>(&mut self) -> [i16; N] {
        self.u16s::<N>().map(|w| w as i16)
    }

    pub(crate) fn f16(&mut self) -> f16 {
        f16::from_bits(self.u16())
    }

    pub(crate) fn f32(&mut self) -> f32 {
        f32::from_le_bytes(self.bytes::<4>())
    }
}

/// Sequential little-endian writes into a block's bytes.
pub(crate) struct Writer<'a> {
    bytes: &'a mut [u8],
    pos: usize,
}

impl<'a> Writer<'a> {
    pub(crate) fn new(bytes: &'a mut [u8]) -> Self {
        Writer { bytes, pos: 0 }
    }

    pub(crate) fn bytes(&mut self, data: &[u8]) {
        self.bytes[self.pos..self.pos + data.len()].copy_from_slice(data);
        self.pos += data.len();
    }

    pub(crate) fn i8s(&mut self, data: &[i8]) {
        for &v in data {
            self.bytes(&[v as u8]);
        }
    }

    pub(crate) fn u16(&mut self, v: u16) {
        self.bytes(&v.to_le_bytes());
    }

    pub(crate) fn i16s(&mut self, data: &[i16]) {
        for &v in data {
            self.u16(v as u16);
        }
    }

    pub(crate) fn f16(&mut self, v: f16) {
        self.u16(v.to_bits());
    }

    pub(crate) fn f32(&mut self, v: f32) {
        self.bytes(&v.to_le_bytes());
    }
}

/// ggml's `nearest_int`: round half to even through the 1.5·2^23 trick. Valid for
/// |x| ≤ 2^22, which every caller guarantees by construction.
pub(crate) fn nearest_int(x: f32) -> i32 {
    let shifted = x + 12_582_912.0;
    (shifted.to_bits() & 0x007f_ffff) as i32 - 0x0040_0000
}

/// The sign of element `j` of a group from its sign byte: bit j set means negative.
pub(crate) fn sign(signs: u8, j: usize) -> i32 {
    if signs & (1 << j) != 0 {
        -1
    } else {
        1
    }
}

/// Byte `j` of a little-endian packed grid entry.
pub(crate) fn grid_byte(entry: u64, j: usize) -> u8 {
    (entry >> (8 * j)) as u8
}
