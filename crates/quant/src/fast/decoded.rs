//! Rows of the grid types (IQ2_XXS, IQ2_XS, IQ1_M) decoded once to signed int8 weights and
//! per-sub-block scale vectors, for products with many activations (prompt processing).
//! Decoding a grid row costs table lookups and sign assembly for every 8 values; a batch
//! of T tokens pays it once instead of T times.
//!
//! The dot of a decoded row forms exactly the i32 block sums the AVX2 row kernel forms
//! (`maddubs(|w|, sign(q8, w))`, `madd` with the sub-block scales) and does the same f32
//! work with them (one fma per block in the same lane order), so its result is
//! bit-identical to [`super::vec_dot`]. It reaches those sums another way: it biases the
//! activation to `q8 + 128` (unsigned) and multiplies the signed weights directly, then
//! removes `128·Σw` per lane with the row's precomputed [`DecodedRow::offsets`]: one `xor`
//! per 32 values and token instead of a `sign`, which on Zen 3 competes with `maddubs` and
//! `madd` for the same two pipes. Exact because no i16 pair saturates (|w| ≤ 43, so a pair
//! is at most 2·255·43) and Q8_K codes lie in −127..=127: the quantizer never writes −128,
//! where `sign` would not negate (tested for extreme and non-finite inputs too).

use redlite_gguf::GgmlType;

use super::scalar::{f16_to_f32, iq1m_d, u16_at, u32_at};
use crate::tables::{IQ1S_GRID, IQ2XS_GRID, IQ2XXS_GRID, KSIGNS_IQ2XS};
use crate::{QuantError, QuantOp};

/// Values per super-block and per sub-block.
const QK: usize = 256;
const SUB: usize = 32;

/// One row decoded for repeated dots (buffers reused from row to row).
#[derive(Clone, Debug, Default)]
pub struct DecodedRow {
    pub(crate) ty: Option<GgmlType>,
    /// Super-block scale `d` per block.
    pub(crate) d: Vec<f32>,
    /// Signed weight codes (i8 as bytes), 32 per sub-block.
    pub(crate) w: Vec<u8>,
    /// 16 i16 lanes per sub-block: the scale of each lane pair's group, as the kernel's
    /// `madd` multiplies them.
    pub(crate) scales: Vec<i16>,
    /// 8 i32 lanes per block: −Σ over its sub-blocks of `madd(maddubs(128, w), scales)`,
    /// what biasing the activation by 128 adds to each lane of the block sum.
    pub(crate) offsets: Vec<i32>,
    /// Q4_K only (empty for the grid types): the super-block's `dmin` per block and the
    /// 6-bit min of each 32-value sub-block, the values being `d·scale·q − dmin·min`.
    pub(crate) dmin: Vec<f32>,
    pub(crate) mins: Vec<i16>,
}

/// Whether the decoded-row dots ([`super::dot_decoded`]) support `ty`.
pub fn decodable(ty: GgmlType) -> bool {
    matches!(ty, GgmlType::IQ2XXS | GgmlType::IQ2XS | GgmlType::IQ1M)
}

/// Whether [`decode_row`] and the tile kernels ([`super::dot_decoded_tile`]) support `ty`:
/// the grid types and Q4_K.
pub fn tileable(ty: GgmlType) -> bool {
    decodable(ty) || ty == GgmlType::Q4K
}

/// For each sign byte, a mask with 0xFF in the bytes to negate.
static BYTE_MASKS: [u64; 256] = byte_masks();

const fn byte_masks() -> [u64; 256] {
    let mut out = [0u64; 256];
    let mut i = 0;
    while i < 256 {
        let mut j = 0;
        while j < 8 {
            if (i >> j) & 1 == 1 {
                out[i] |= 0xff << (8 * j);
            }
            j += 1;
        }
        i += 1;
    }
    out
}

const LOW_BITS: u64 = 0x0101_0101_0101_0101;
const HIGH_BITS: u64 = 0x8080_8080_8080_8080;

/// Eight grid magnitudes (bytes ≥ 1) with the bytes of `signs` negated, as i8 bytes: two's
/// complement per byte, `(g ^ m) + (m & 1)`, which never carries since no byte is 0.
fn signed_grid8(grid: u64, signs: u8) -> u64 {
    let m = BYTE_MASKS[usize::from(signs)];
    (grid ^ m).wrapping_add(m & LOW_BITS)
}

/// Bytewise wrapping add of eight i8 lanes (no carry between bytes).
fn add_bytes(a: u64, b: u64) -> u64 {
    ((a & !HIGH_BITS).wrapping_add(b & !HIGH_BITS)) ^ ((a ^ b) & HIGH_BITS)
}

fn put8(w: &mut [u8], at: usize, v: u64) {
    w[at..at + 8].copy_from_slice(&v.to_le_bytes());
}

fn put_scales(scales: &mut [i16], at: usize, low: i16, high: i16) {
    scales[at..at + 8].fill(low);
    scales[at + 8..at + 16].fill(high);
}

/// Decodes a row of `ty` (whole blocks) into `out`.
pub fn decode_row(ty: GgmlType, row: &[u8], out: &mut DecodedRow) -> Result<(), QuantError> {
    let op = QuantOp::Dot;
    if !tileable(ty) {
        return Err(QuantError::Unsupported { op, ty });
    }
    let block = ty.block_bytes();
    if !row.len().is_multiple_of(block) {
        return Err(QuantError::ByteLength {
            op,
            ty,
            expected: row.len() / block * block,
            found: row.len(),
        });
    }
    let blocks = row.len() / block;
    out.ty = Some(ty);
    out.d.resize(blocks, 0.0);
    out.w.resize(blocks * QK, 0);
    out.scales.resize(blocks * QK / SUB * 16, 0);
    out.offsets.resize(blocks * 8, 0);
    if ty == GgmlType::Q4K {
        decode_q4k(row, out);
        return Ok(());
    }
    out.dmin.clear();
    out.mins.clear();
    #[cfg(target_arch = "x86_64")]
    if super::avx2::decode_grid_row(ty, row, out) {
        return Ok(());
    }
    decode_blocks(ty, row, out);
    Ok(())
}

/// The portable decoder (and the reference the AVX2 one is tested against).
pub(crate) fn decode_blocks(ty: GgmlType, row: &[u8], out: &mut DecodedRow) {
    decode_values(ty, row, out);
    fill_offsets(out);
}

/// The portable decoder's `d`, weights and scales (not the offsets).
pub(crate) fn decode_values(ty: GgmlType, row: &[u8], out: &mut DecodedRow) {
    let block = ty.block_bytes();
    let (d, w, scales) = (&mut out.d, &mut out.w, &mut out.scales);
    for (b, x) in row.chunks_exact(block).enumerate() {
        match ty {
            GgmlType::IQ2XXS => {
                d[b] = f16_to_f32(u16_at(x, 0));
                for ib in 0..8 {
                    let sub = b * 8 + ib;
                    let (a, bits) = (u32_at(x, 2 + 8 * ib), u32_at(x, 6 + 8 * ib));
                    for l in 0..4 {
                        let grid = IQ2XXS_GRID[((a >> (8 * l)) & 0xff) as usize];
                        let signs = KSIGNS_IQ2XS[((bits >> (7 * l)) & 127) as usize];
                        put8(w, sub * SUB + 8 * l, signed_grid8(grid, signs));
                    }
                    let s = 2 * (bits >> 28) as i16 + 1;
                    put_scales(scales, sub * 16, s, s);
                }
            }
            GgmlType::IQ2XS => {
                d[b] = f16_to_f32(u16_at(x, 0));
                for ib in 0..8 {
                    let sub = b * 8 + ib;
                    for l in 0..4 {
                        let word = u16_at(x, 2 + 8 * ib + 2 * l);
                        let grid = IQ2XS_GRID[usize::from(word & 511)];
                        put8(
                            w,
                            sub * SUB + 8 * l,
                            signed_grid8(grid, KSIGNS_IQ2XS[usize::from(word >> 9)]),
                        );
                    }
                    let packed = i16::from(x[66 + ib]);
                    put_scales(
                        scales,
                        sub * 16,
                        2 * (packed & 0x0f) + 1,
                        2 * (packed >> 4) + 1,
                    );
                }
            }
            _ => {
                // IQ1_M: value = 8·grid + δ with grid ∈ {−1, 0, 1} and δ = ±1 per group.
                let words = [0, 1, 2, 3].map(|k| u16_at(x, 48 + 2 * k));
                d[b] = f16_to_f32(iq1m_d(words));
                for ib in 0..8 {
                    let sub = b * 8 + ib;
                    for l in 0..4 {
                        let qh = usize::from(x[32 + 2 * ib + l / 2] >> (4 * (l % 2)));
                        let grid = IQ1S_GRID[usize::from(x[4 * ib + l]) | ((qh & 7) << 8)];
                        let times8 = (grid << 3) & 0xf8f8_f8f8_f8f8_f8f8;
                        let delta = if (qh >> 3) & 1 == 1 {
                            u64::MAX
                        } else {
                            LOW_BITS
                        };
                        put8(w, sub * SUB + 8 * l, add_bytes(times8, delta));
                    }
                    let word = words[ib / 2] >> (6 * (ib % 2));
                    put_scales(
                        scales,
                        sub * 16,
                        2 * (word & 7) as i16 + 1,
                        2 * ((word >> 3) & 7) as i16 + 1,
                    );
                }
            }
        }
    }
}

/// Q4_K blocks (d, dmin: f16; 12 bytes of 6-bit scales and mins; 128 bytes of 4-bit codes,
/// 32-value sub-block 2j in the low nibbles of bytes 32j..32j+32, 2j + 1 in the high ones):
/// the codes as bytes 0..=15, each sub-block's scale in its 16 scale lanes, its min, and the
/// offsets.
fn decode_q4k(row: &[u8], out: &mut DecodedRow) {
    let blocks = row.len() / 144;
    out.dmin.resize(blocks, 0.0);
    out.mins.resize(blocks * 8, 0);
    for (b, x) in row.chunks_exact(144).enumerate() {
        out.d[b] = f16_to_f32(u16_at(x, 0));
        out.dmin[b] = f16_to_f32(u16_at(x, 2));
        let packed = &x[4..16];
        for j in 0..8 {
            let (scale, min) = if j < 4 {
                (packed[j] & 63, packed[j + 4] & 63)
            } else {
                (
                    (packed[j + 4] & 0x0f) | ((packed[j - 4] >> 6) << 4),
                    (packed[j + 4] >> 4) | ((packed[j] >> 6) << 4),
                )
            };
            put_scales(
                &mut out.scales,
                (b * 8 + j) * 16,
                i16::from(scale),
                i16::from(scale),
            );
            out.mins[b * 8 + j] = i16::from(min);
        }
        let (codes, w) = (&x[16..144], &mut out.w[b * QK..(b + 1) * QK]);
        for (pair, (lo, hi)) in codes
            .chunks_exact(32)
            .zip(w.chunks_exact_mut(64).map(|c| c.split_at_mut(32)))
        {
            for ((l, h), &c) in lo.iter_mut().zip(hi.iter_mut()).zip(pair) {
                *l = c & 0x0f;
                *h = c >> 4;
            }
        }
    }
    fill_offsets(out);
}

/// [`DecodedRow::offsets`] of every block, from the decoded weights and scales.
fn fill_offsets(out: &mut DecodedRow) {
    let blocks = out
        .w
        .chunks_exact(QK)
        .zip(out.scales.chunks_exact(QK / SUB * 16))
        .zip(out.offsets.chunks_exact_mut(8));
    for ((w, scales), offsets) in blocks {
        block_offsets(w, scales, offsets);
    }
}

/// [`DecodedRow::offsets`] of one block from its 256 weights and 8 × 16 scale lanes: lane
/// `j` of a 32-byte vector covers bytes 4j..4j+4 (lanes 0–3 the low half, whose scales are
/// lanes 0–7, lanes 4–7 the high half, scales 8–15).
fn block_offsets(w: &[u8], scales: &[i16], offsets: &mut [i32]) {
    for (j, offset) in offsets.iter_mut().enumerate() {
        let mut sum = 0i32;
        for (sub, scales) in w.chunks_exact(SUB).zip(scales.chunks_exact(16)) {
            let weights: i32 = sub[4 * j..4 * j + 4]
                .iter()
                .map(|&b| i32::from(b as i8))
                .sum();
            sum += 128 * weights * i32::from(scales[2 * j]);
        }
        *offset = -sum;
    }
}
