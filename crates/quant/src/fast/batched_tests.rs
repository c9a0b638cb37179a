//! The batched paths against the one-row kernels, bit for bit: rows decoded once and dotted
//! with one or several activations, several activations against one row, the vector
//! decoders against the portable one, and the batched kernels across SIMD levels. Shares the
//! seeded rows and activations of `tests.rs`.

use super::tests::*;
use super::*;

#[test]
fn decoded_rows_dot_bit_identically() {
    use crate::{decode_row, decoded_dots_available, dot_decoded, DecodedRow};
    if !decoded_dots_available() {
        eprintln!("skipped: decoded-row dots need AVX2");
        return;
    }
    for ty in [GgmlType::IQ2XXS, GgmlType::IQ2XS, GgmlType::IQ1M] {
        for (seed, blocks) in [(1u64, 1usize), (2, 8), (3, 16)] {
            let row = decoded_test_row(ty, blocks, seed);
            let act: Vec<f32> = (0..blocks * 256)
                .map(|i| ((i * 37 + seed as usize) % 251) as f32 / 125.0 - 1.0)
                .collect();
            let act = QuantizedActivation::new(ty, &act).unwrap();
            let mut decoded = DecodedRow::default();
            decode_row(ty, &row, &mut decoded).unwrap();
            let a = dot_decoded(&decoded, &act).unwrap();
            let b = crate::vec_dot(ty, &row, &act).unwrap();
            assert_eq!(
                a.to_bits(),
                b.to_bits(),
                "{ty}: decoded {a} vs row kernel {b}"
            );
        }
    }
}

/// Random valid blocks with finite scales.
pub(super) fn decoded_test_row(ty: GgmlType, blocks: usize, seed: u64) -> Vec<u8> {
    let mut state = seed.wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1;
    let mut bytes: Vec<u8> = (0..blocks * ty.block_bytes())
        .map(|_| {
            state ^= state << 13;
            state ^= state >> 7;
            state ^= state << 17;
            state as u8
        })
        .collect();
    for block in bytes.chunks_exact_mut(ty.block_bytes()) {
        if ty == GgmlType::IQ1M {
            crate::set_iq1m_scale(block, half::f16::from_f32(0.01)).unwrap();
        } else {
            block[..2].copy_from_slice(&half::f16::from_f32(0.01).to_le_bytes());
        }
    }
    bytes
}

/// The many-activation entry points (four activations per pass where a four-wide kernel
/// exists, the rest one by one) give each activation exactly what `vec_dot` gives it.
#[test]
fn many_activation_dots_are_bit_identical_to_vec_dot() {
    use crate::{decode_row, decoded_dots_available, dot_decoded_many, DecodedRow};
    let mut rng = Rng(0x5eed);
    for ty in [
        GgmlType::Q4K,
        GgmlType::Q5K,
        GgmlType::Q6K,
        GgmlType::Q2K,
        GgmlType::IQ2XXS,
        GgmlType::IQ2XS,
        GgmlType::IQ1M,
    ] {
        // Every batch width (8, 4, 3, 2) and a single remainder.
        for (blocks, n_acts) in [
            (1usize, 1usize),
            (2, 2),
            (1, 3),
            (2, 4),
            (8, 9),
            (3, 13),
            (2, 19),
        ] {
            let values = blocks * 256;
            let row = match ty {
                GgmlType::IQ2XXS | GgmlType::IQ2XS | GgmlType::IQ1M => {
                    decoded_test_row(ty, blocks, n_acts as u64)
                }
                _ => random_rows(&mut rng, ty, values, 1),
            };
            let acts: Vec<QuantizedActivation> = (0..n_acts)
                .map(|t| QuantizedActivation::new(ty, &random_activation(&mut rng, values, t)))
                .collect::<Result<_, _>>()
                .unwrap();
            let want: Vec<u32> = acts
                .iter()
                .map(|a| vec_dot(ty, &row, a).unwrap().to_bits())
                .collect();
            let mut out = vec![0f32; n_acts];
            vec_dot_many(ty, &row, &acts, &mut out).unwrap();
            let got: Vec<u32> = out.iter().map(|v| v.to_bits()).collect();
            assert_eq!(
                got, want,
                "{ty}: vec_dot_many, {blocks} blocks, {n_acts} acts"
            );
            if decoded_dots_available() && crate::decodable(ty) {
                let mut decoded = DecodedRow::default();
                decode_row(ty, &row, &mut decoded).unwrap();
                let mut out = vec![0f32; n_acts];
                dot_decoded_many(&decoded, &acts, &mut out).unwrap();
                let got: Vec<u32> = out.iter().map(|v| v.to_bits()).collect();
                assert_eq!(
                    got, want,
                    "{ty}: dot_decoded_many, {blocks} blocks, {n_acts} acts"
                );
            }
        }
    }
}

/// The AVX2 row decoders (IQ2_XXS, IQ2_XS; IQ1_M's offsets) write exactly what the
/// portable decoder writes.
#[test]
fn vector_decoding_equals_the_portable_decoder() {
    for (ty, seed, blocks) in [
        (GgmlType::IQ2XXS, 1u64, 1usize),
        (GgmlType::IQ2XXS, 7, 8),
        (GgmlType::IQ2XXS, 9, 17),
        (GgmlType::IQ2XS, 2, 1),
        (GgmlType::IQ2XS, 5, 9),
        (GgmlType::IQ1M, 4, 1),
        (GgmlType::IQ1M, 6, 9),
    ] {
        assert_decoders_agree(ty, &decoded_test_row(ty, blocks, seed));
    }
}

/// Every 7-bit sign index in every group position (128 sub-blocks), through the AVX2
/// decoders' vector sign bits and parity, against the portable decoder's `KSIGNS_IQ2XS`.
#[test]
fn vector_decoding_covers_every_sign_index() {
    for ty in [GgmlType::IQ2XXS, GgmlType::IQ2XS] {
        let mut row = decoded_test_row(ty, 16, 3);
        for (b, block) in row.chunks_exact_mut(ty.block_bytes()).enumerate() {
            for (ib, word) in block[2..66].chunks_exact_mut(8).enumerate() {
                // Over the 128 sub-blocks, each group position sees each index once.
                let sign = |l: u64| (8 * b as u64 + ib as u64 + 37 * l) % 128;
                let old = u64::from_le_bytes(word.try_into().unwrap());
                let new = (0..4).fold(0u64, |acc, l| match ty {
                    // Grid indices and the scale kept; signs at 32 + 7l.
                    GgmlType::IQ2XXS => acc | sign(l) << (32 + 7 * l),
                    // One u16 per group: grid index kept, signs at 9.
                    _ => acc | ((old >> (16 * l)) & 511 | sign(l) << 9) << (16 * l),
                });
                let kept = match ty {
                    GgmlType::IQ2XXS => old & 0xf000_0000_ffff_ffff,
                    _ => 0,
                };
                word.copy_from_slice(&(kept | new).to_le_bytes());
            }
        }
        assert_decoders_agree(ty, &row);
    }
}

fn assert_decoders_agree(ty: GgmlType, row: &[u8]) {
    use crate::{decode_row, DecodedRow};
    let blocks = row.len() / ty.block_bytes();
    let mut fast = DecodedRow::default();
    decode_row(ty, row, &mut fast).unwrap();
    let mut portable = fast.clone();
    portable.w.fill(0);
    portable.scales.fill(0);
    portable.offsets.fill(0);
    portable.d.fill(0.0);
    super::decoded::decode_blocks(ty, row, &mut portable);
    assert_eq!(fast.w, portable.w, "{ty} weights, {blocks} blocks");
    assert_eq!(fast.scales, portable.scales, "{ty} scales, {blocks} blocks");
    assert_eq!(
        fast.offsets, portable.offsets,
        "{ty} offsets, {blocks} blocks"
    );
    assert_eq!(
        fast.d.iter().map(|v| v.to_bits()).collect::<Vec<_>>(),
        portable.d.iter().map(|v| v.to_bits()).collect::<Vec<_>>()
    );
}

/// The decoded-row dots bias the activation by 128 (`fast::decoded`), which is exact only
/// because Q8_K codes never reach −128: not for extreme, non-finite or subnormal inputs.
#[test]
fn q8k_codes_never_reach_minus_128() {
    let mut rng = Rng(0xfa57_0006);
    let mut cases: Vec<Vec<f32>> = (0..3)
        .map(|t| random_activation(&mut rng, 256, t))
        .collect();
    for special in [
        f32::NAN,
        -f32::NAN,
        f32::INFINITY,
        f32::NEG_INFINITY,
        f32::MAX,
        f32::MIN,
        -1e-40,
        1e-45,
        -0.0,
    ] {
        // The special value alone, and among ordinary values of either sign.
        cases.push(vec![special; 256]);
        cases.push(
            (0..256)
                .map(|i| {
                    if i == 17 {
                        special
                    } else {
                        (i as f32 - 128.0) * 0.37
                    }
                })
                .collect(),
        );
        cases.push(
            (0..256)
                .map(|i| {
                    if i % 2 == 0 {
                        special
                    } else {
                        -1e-39 * i as f32
                    }
                })
                .collect(),
        );
    }
    cases.push(
        (0..256)
            .map(|i| {
                if i == 3 {
                    -3.0
                } else {
                    3.0 * (i as f32 / 256.0)
                }
            })
            .collect(),
    );
    for values in &cases {
        let act = QuantizedActivation::new(GgmlType::IQ2XXS, values).unwrap();
        let codes = &act.bytes()[4..4 + 256];
        assert!(!codes.contains(&0x80), "−128 from {:?}", &values[..4]);
    }
}

/// Every batched kernel of every SIMD level above AVX2 (AVX-512) against the AVX2 one, bit
/// for bit: random blocks of each batched type, and batch sizes that use every width the
/// grouping picks (8, 4, 3, 2 and the single remainder) and the width-1 decoded dot.
#[test]
fn batched_kernels_are_bit_identical_across_simd_levels() {
    use crate::{decode_row, DecodedRow};
    let levels: Vec<SimdLevel> = available_levels()
        .into_iter()
        .filter(|&level| level > SimdLevel::Avx2)
        .collect();
    if !available_levels().contains(&SimdLevel::Avx2) || levels.is_empty() {
        eprintln!("skipped: this CPU has no SIMD level above AVX2");
        return;
    }
    let mut rng = Rng(0xa512_0001);
    for ty in [
        GgmlType::Q2K,
        GgmlType::Q4K,
        GgmlType::Q5K,
        GgmlType::IQ2XXS,
        GgmlType::IQ2XS,
        GgmlType::IQ1M,
    ] {
        for (blocks, n_acts) in [
            (1usize, 1usize),
            (3, 2),
            (2, 3),
            (1, 4),
            (5, 8),
            (4, 15),
            (2, 23),
        ] {
            for trial in 0..3 {
                let values = blocks * 256;
                let row = random_rows(&mut rng, ty, values, 1);
                let acts: Vec<QuantizedActivation> = (0..n_acts)
                    .map(|t| {
                        let act = random_activation(&mut rng, values, trial + t);
                        QuantizedActivation::new(ty, &act)
                    })
                    .collect::<Result<_, _>>()
                    .unwrap();
                let bits = |out: &[f32]| out.iter().map(|v| v.to_bits()).collect::<Vec<_>>();
                let mut want = vec![0f32; n_acts];
                let mut got = vec![0f32; n_acts];
                if crate::decodable(ty) {
                    let mut decoded = DecodedRow::default();
                    decode_row(ty, &row, &mut decoded).unwrap();
                    dot_decoded_many_at(SimdLevel::Avx2, &decoded, &acts, &mut want).unwrap();
                    for &level in &levels {
                        dot_decoded_many_at(level, &decoded, &acts, &mut got).unwrap();
                        assert_eq!(bits(&got), bits(&want), "{ty} {level:?}: {n_acts} acts");
                        let single = dot_decoded_at(level, &decoded, &acts[0]).unwrap();
                        assert_eq!(single.to_bits(), want[0].to_bits(), "{ty} {level:?}: one");
                    }
                } else {
                    vec_dot_many_at(SimdLevel::Avx2, ty, &row, &acts, &mut want).unwrap();
                    for &level in &levels {
                        vec_dot_many_at(level, ty, &row, &acts, &mut got).unwrap();
                        assert_eq!(bits(&got), bits(&want), "{ty} {level:?}: {n_acts} acts");
                    }
                }
            }
        }
    }
}
