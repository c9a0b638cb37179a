//! AVX2 decoding of grid rows, and the dot of a decoded row with a Q8_K activation (see
//! `fast::decoded`).

use super::iquants::f16c_at;
use super::{load_256, split_scales};
use crate::fast::decoded::DecodedRow;
use crate::tables::{IQ2XS_GRID, IQ2XXS_GRID};
use std::arch::x86_64::*;

#[inline]
pub(super) fn load_i8(v: &[u8]) -> __m256i {
    debug_assert!(v.len() >= 32);
    // SAFETY: callers pass 32-element slices (`dot_decoded` checked the row and activation lengths); loadu has no alignment requirement.
    unsafe { _mm256_loadu_si256(v.as_ptr().cast()) }
}

#[inline]
pub(crate) fn load_i32(v: &[i32]) -> __m256i {
    let v = &v[..8];
    // SAFETY: `v` has 8 readable i32; loadu has no alignment requirement.
    unsafe { _mm256_loadu_si256(v.as_ptr().cast()) }
}

#[inline]
pub(super) fn load_i16(v: &[i16]) -> __m256i {
    debug_assert!(v.len() >= 16);
    // SAFETY: callers pass 16-element slices (`dot_decoded` checked the row and activation lengths); loadu has no alignment requirement.
    unsafe { _mm256_loadu_si256(v.as_ptr().cast()) }
}

/// [`DecodedRow::offsets`] from the decoded weights and scales (for IQ1_M, whose values
/// the portable decoder writes): per block, −Σ `madd(maddubs(128, w), scales)`.
#[target_feature(enable = "avx2,fma,f16c")]
pub(crate) fn fill_offsets(out: &mut DecodedRow) {
    let bias = _mm256_set1_epi8(i8::MIN);
    let blocks = out
        .w
        .chunks_exact(256)
        .zip(out.scales.chunks_exact(128))
        .zip(out.offsets.chunks_exact_mut(8));
    for ((w, scales), offsets) in blocks {
        let mut sum = _mm256_setzero_si256();
        for (w, scales) in w.chunks_exact(32).zip(scales.chunks_exact(16)) {
            let pairs = _mm256_maddubs_epi16(bias, load_i8(w));
            sum = _mm256_add_epi32(sum, _mm256_madd_epi16(pairs, load_i16(scales)));
        }
        store_offsets(offsets, sum);
    }
}

/// Stores a block's offsets: the negated sum of its sub-blocks' `madd(maddubs(128, w), scales)`.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
fn store_offsets(offsets: &mut [i32], sum: __m256i) {
    let offsets = &mut offsets[..8];
    let negated = _mm256_sub_epi32(_mm256_setzero_si256(), sum);
    // SAFETY: `offsets` holds 8 i32 (32 bytes); storeu has no alignment requirement.
    unsafe { _mm256_storeu_si256(offsets.as_mut_ptr().cast(), negated) };
}

/// Stores one sub-block's 32 weights and 16 scale lanes; returns its share of the block's
/// offsets (`madd(maddubs(128, w), scales)`).
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
fn store_sub(w: &mut [u8], scales: &mut [i16], weights: __m256i, scale: __m256i) -> __m256i {
    let (w, scales) = (&mut w[..32], &mut scales[..16]);
    // SAFETY: `w` holds 32 bytes and `scales` 16 i16; storeu has no alignment requirement.
    unsafe {
        _mm256_storeu_si256(w.as_mut_ptr().cast(), weights);
        _mm256_storeu_si256(scales.as_mut_ptr().cast(), scale);
    }
    let bias = _mm256_set1_epi8(i8::MIN);
    _mm256_madd_epi16(_mm256_maddubs_epi16(bias, weights), scale)
}

/// Two grid entries of `table` (by index) as one 128-bit vector, the first low.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
pub(super) fn grid_pair(table: &[u64], first: usize, second: usize) -> __m128i {
    let low = _mm_cvtsi64_si128(table[first] as i64);
    let high: *const u64 = &table[second];
    // SAFETY: `high` points at one table entry (8 readable bytes); loadh has no alignment requirement.
    let pair = unsafe { _mm_loadh_pd(_mm_castsi128_pd(low), high.cast()) };
    _mm_castpd_si128(pair)
}

/// The signs of a sub-block's 32 values from its sign bits, broadcast in `bits`, as `±1`
/// bytes for `sign_epi8`: `byte` shuffles each value's bit into its byte (0x80: none, for
/// the eighth value of a group), `bit` tests it, and each group's eighth sign is the parity
/// of its seven (a `sad` byte sum of the seven 0xff masks is 255 × their count, odd when
/// the count is), as `KSIGNS_IQ2XS` says.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
pub(super) fn sign_bytes(bits: __m256i, byte: __m256i, bit: __m256i) -> __m256i {
    let picked = _mm256_and_si256(_mm256_shuffle_epi8(bits, byte), bit);
    let negative = _mm256_cmpeq_epi8(picked, bit);
    let parity = _mm256_slli_epi64::<63>(_mm256_sad_epu8(negative, _mm256_setzero_si256()));
    _mm256_or_si256(_mm256_or_si256(negative, parity), _mm256_set1_epi8(1))
}

/// Where the 7 sign bits of group `l`'s value `k` sit in a sub-block's sign bits, as
/// [`sign_bytes`] takes them: the byte (a `shuffle_epi8` index, 0x80 for the eighth value)
/// when `byte`, else the bit within it (0x01 for the eighth value, whose zero byte never
/// has it). `first` is the bit of group 0's first sign, `stride` the step between groups.
const fn sign_layout(first: usize, stride: usize, byte: bool) -> [u8; 32] {
    let mut out = [0u8; 32];
    let mut i = 0;
    while i < 32 {
        let (group, k) = (i / 8, i % 8);
        let bit = first + stride * group + k;
        out[i] = match (k, byte) {
            (7, true) => 0x80,
            (7, false) => 0x01,
            (_, true) => (bit / 8) as u8,
            (_, false) => 1 << (bit % 8),
        };
        i += 1;
    }
    out
}

/// IQ2_XXS: the sign word (a sub-block's high u32) holds group `l`'s bits at `7l`.
pub(super) static IQ2XXS_SIGN_BYTE: [u8; 32] = sign_layout(0, 7, true);
pub(super) static IQ2XXS_SIGN_BIT: [u8; 32] = sign_layout(0, 7, false);
/// IQ2_XS: a sub-block's four u16 hold group `l`'s sign bits at `16l + 9`.
static IQ2XS_SIGN_BYTE: [u8; 32] = sign_layout(9, 16, true);
static IQ2XS_SIGN_BIT: [u8; 32] = sign_layout(9, 16, false);

/// The 9-bit grid index of group `l` of an IQ2_XS sub-block (four u16).
#[inline]
fn iq2xs_index(words: &[u8; 8], l: usize) -> usize {
    usize::from(u16::from_le_bytes([words[2 * l], words[2 * l + 1]]) & 511)
}

/// IQ2_XS blocks (d @0, one u16 per group: 9-bit grid index, 7-bit sign index; scales @66),
/// decoded like [`decode_iq2xxs`], the four words broadcast for the signs.
#[target_feature(enable = "avx2,fma,f16c")]
pub(crate) fn decode_iq2xs(row: &[u8], out: &mut DecodedRow) {
    let sign_byte = load_256(&IQ2XS_SIGN_BYTE);
    let sign_bit = load_256(&IQ2XS_SIGN_BIT);
    let blocks = row
        .chunks_exact(74)
        .zip(out.d.iter_mut())
        .zip(out.w.chunks_exact_mut(256))
        .zip(out.scales.chunks_exact_mut(128))
        .zip(out.offsets.chunks_exact_mut(8));
    for ((((x, d), w), scales), offsets) in blocks {
        *d = f16c_at(x, 0);
        let mut sum = _mm256_setzero_si256();
        let subs = x[2..66]
            .chunks_exact(8)
            .zip(&x[66..])
            .zip(w.chunks_exact_mut(32))
            .zip(scales.chunks_exact_mut(16));
        for (((words, &packed), w), scales) in subs {
            let Some(words) = words.first_chunk::<8>() else {
                break;
            };
            let magnitudes = _mm256_set_m128i(
                grid_pair(&IQ2XS_GRID, iq2xs_index(words, 2), iq2xs_index(words, 3)),
                grid_pair(&IQ2XS_GRID, iq2xs_index(words, 0), iq2xs_index(words, 1)),
            );
            let bits = _mm256_set1_epi64x(i64::from_le_bytes(*words));
            let weights = _mm256_sign_epi8(magnitudes, sign_bytes(bits, sign_byte, sign_bit));
            let packed = i16::from(packed);
            let scale = split_scales(2 * (packed & 0x0f) + 1, 2 * (packed >> 4) + 1);
            sum = _mm256_add_epi32(sum, store_sub(w, scales, weights, scale));
        }
        store_offsets(offsets, sum);
    }
}

/// IQ2_XXS blocks (d @0, then per sub-block four grid indices and a u32 of 4 × 7 sign bits
/// with the scale in its top four bits), decoded with the signs built in vector registers
/// ([`sign_bytes`]); `sign_epi8` with them gives the same bytes as the portable decoder's
/// two's-complement negation.
#[target_feature(enable = "avx2,fma,f16c")]
pub(crate) fn decode_iq2xxs(row: &[u8], out: &mut DecodedRow) {
    let sign_byte = load_256(&IQ2XXS_SIGN_BYTE);
    let sign_bit = load_256(&IQ2XXS_SIGN_BIT);
    let blocks = row
        .chunks_exact(66)
        .zip(out.d.iter_mut())
        .zip(out.w.chunks_exact_mut(256))
        .zip(out.scales.chunks_exact_mut(128))
        .zip(out.offsets.chunks_exact_mut(8));
    for ((((x, d), w), scales), offsets) in blocks {
        *d = f16c_at(x, 0);
        let mut sum = _mm256_setzero_si256();
        let subs = x[2..]
            .chunks_exact(8)
            .zip(w.chunks_exact_mut(32))
            .zip(scales.chunks_exact_mut(16));
        for ((word, w), scales) in subs {
            let Some(word) = word.first_chunk::<8>() else {
                break;
            };
            let index = |l: usize| usize::from(word[l]);
            let magnitudes = _mm256_set_m128i(
                grid_pair(&IQ2XXS_GRID, index(2), index(3)),
                grid_pair(&IQ2XXS_GRID, index(0), index(1)),
            );
            let sign_word = u32::from_le_bytes([word[4], word[5], word[6], word[7]]);
            // SAFETY: `word` has 8 readable bytes, so 4 from its fifth; loadu has no alignment requirement.
            let bits =
                _mm256_broadcastd_epi32(unsafe { _mm_loadu_si32(word[4..].as_ptr().cast()) });
            let weights = _mm256_sign_epi8(magnitudes, sign_bytes(bits, sign_byte, sign_bit));
            let scale = _mm256_set1_epi16(2 * (sign_word >> 28) as i16 + 1);
            sum = _mm256_add_epi32(sum, store_sub(w, scales, weights, scale));
        }
        store_offsets(offsets, sum);
    }
}
