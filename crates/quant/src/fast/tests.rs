//! Every fast kernel against the reference [`dot_row`] on seeded random blocks, at every
//! SIMD level this CPU has (a level it lacks is skipped with a message).
//!
//! * The scalar level keeps the reference's integer sums and float order: bit-identical.
//! * SIMD levels keep the integer sums (exact) but accumulate the scaled block sums in
//!   another float order. Bound: `(terms + 16) · ε · M`, where `terms` is how many scaled
//!   terms one f32 accumulator lane takes (one per block for the quantized types, n/32
//!   products for F32 / F16), ε = `f32::EPSILON`, and M = Σ |w_i|·|a_i| over the
//!   dequantized weights and activation, with the scale part and the min part of the
//!   weights (Q2_K, Q4_K, Q5_K) counted separately because the reference rounds them
//!   separately.

use super::*;
use crate::{dequantize_row, dot_row, scale_fields, set_iq1m_scale, ScaleKind};
use half::f16;

const FAST_TYPES: [GgmlType; 10] = [
    GgmlType::IQ1M,
    GgmlType::IQ2XXS,
    GgmlType::IQ2XS,
    GgmlType::Q2K,
    GgmlType::Q4K,
    GgmlType::Q5K,
    GgmlType::Q6K,
    GgmlType::Q8_0,
    GgmlType::F16,
    GgmlType::F32,
];

/// SplitMix64, as in the crate tests.
pub(super) struct Rng(pub(super) u64);

impl Rng {
    fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }

    fn uniform(&mut self, lo: f32, hi: f32) -> f32 {
        let unit = (self.next_u64() >> 40) as f32 / (1u64 << 24) as f32;
        lo + (hi - lo) * unit
    }
}

/// Random valid rows: random bytes with finite scales, or random floats for F32 / F16.
pub(super) fn random_rows(rng: &mut Rng, ty: GgmlType, values: usize, rows: usize) -> Vec<u8> {
    if !ty.is_quantized() {
        let floats: Vec<f32> = (0..values * rows).map(|_| rng.uniform(-1.0, 1.0)).collect();
        let mut bytes = vec![0u8; values * rows * ty.block_bytes()];
        crate::quantize_row(ty, &floats, &mut bytes).expect("float types quantize");
        return bytes;
    }
    let mut bytes = vec![0u8; values * rows / ty.block_values() * ty.block_bytes()];
    bytes.fill_with(|| rng.next_u64() as u8);
    for block in bytes.chunks_exact_mut(ty.block_bytes()) {
        for field in scale_fields(ty) {
            let value = match field.kind {
                ScaleKind::Dmin => rng.uniform(-0.05, 0.05),
                _ => rng.uniform(0.005, 0.05),
            };
            field.write(block, value);
        }
        if ty == GgmlType::IQ1M {
            set_iq1m_scale(block, f16::from_f32(rng.uniform(0.005, 0.05))).expect("IQ1_M block");
        }
    }
    bytes
}

/// Activations: uniform, or ±1 only (every code ±127, the saturation edge of `maddubs`).
pub(super) fn random_activation(rng: &mut Rng, values: usize, trial: usize) -> Vec<f32> {
    (0..values)
        .map(|_| match trial % 3 {
            0 => rng.uniform(-2.0, 2.0),
            1 => rng.uniform(-2.0, 2.0).signum(),
            _ => rng.uniform(-1.0, 1.0) * rng.uniform(0.0, 8.0).exp(),
        })
        .collect()
}

fn dequantized(ty: GgmlType, bytes: &[u8], values: usize) -> Vec<f32> {
    let mut out = vec![0.0; values];
    dequantize_row(ty, bytes, &mut out).expect("dequantize");
    out
}

/// The row with every field of `kind` set to zero.
fn with_zeroed(ty: GgmlType, row: &[u8], kind: ScaleKind) -> Vec<u8> {
    let mut row = row.to_vec();
    for block in row.chunks_exact_mut(ty.block_bytes()) {
        for field in scale_fields(ty).iter().filter(|f| f.kind == kind) {
            field.write(block, 0.0);
        }
    }
    row
}

/// M of the module docs.
fn magnitude(ty: GgmlType, row: &[u8], act: &QuantizedActivation) -> f64 {
    let n = act.values();
    let a = dequantized(act.ty(), act.bytes(), n);
    let has_min = scale_fields(ty).iter().any(|f| f.kind == ScaleKind::Dmin);
    let parts = if has_min {
        vec![
            dequantized(ty, &with_zeroed(ty, row, ScaleKind::Dmin), n),
            dequantized(ty, &with_zeroed(ty, row, ScaleKind::D), n),
        ]
    } else {
        vec![dequantized(ty, row, n)]
    };
    parts
        .iter()
        .flat_map(|w| w.iter().zip(&a))
        .map(|(&w, &a)| (f64::from(w) * f64::from(a)).abs())
        .sum()
}

fn tolerance(ty: GgmlType, row: &[u8], act: &QuantizedActivation) -> f64 {
    let n = act.values();
    let terms = if ty.is_quantized() {
        n / ty.block_values()
    } else {
        n / 32
    };
    (terms + 16) as f64 * f64::from(f32::EPSILON) * magnitude(ty, row, act)
}

/// Lengths per type: 256..4096 for the super-block types, plus odd ones where blocks are
/// smaller (tails of the float kernels).
fn lengths(ty: GgmlType) -> Vec<usize> {
    let mut lengths = vec![256, 512, 1280, 2048, 4096];
    match ty {
        GgmlType::Q8_0 => lengths.extend([32, 96, 288]),
        GgmlType::F32 | GgmlType::F16 => lengths.extend([1, 7, 65, 127, 300]),
        _ => {}
    }
    lengths
}

#[test]
fn scalar_level_is_bit_identical_to_dot_row() {
    let mut rng = Rng(0xfa57_0001);
    for ty in FAST_TYPES {
        for (trial, n) in lengths(ty).into_iter().enumerate() {
            let row = random_rows(&mut rng, ty, n, 1);
            let activation = random_activation(&mut rng, n, trial);
            let act = QuantizedActivation::new(ty, &activation).expect("activation");
            let expected = dot_row(ty, &row, &activation).expect("reference");
            let got = vec_dot_at(SimdLevel::Scalar, ty, &row, &act).expect("scalar");
            assert_eq!(
                got.to_bits(),
                expected.to_bits(),
                "{ty} n={n}: scalar {got} vs dot_row {expected}"
            );
        }
    }
}

#[test]
fn every_level_matches_the_reference_within_rounding() {
    let mut rng = Rng(0xfa57_0002);
    for level in SimdLevel::ALL {
        if table(level).is_none() {
            eprintln!("skipping {}: this CPU lacks it", level.name());
            continue;
        }
        for ty in FAST_TYPES {
            for (trial, n) in lengths(ty).into_iter().enumerate() {
                let row = random_rows(&mut rng, ty, n, 1);
                let activation = random_activation(&mut rng, n, trial);
                let act = QuantizedActivation::new(ty, &activation).expect("activation");
                let expected = f64::from(dot_row(ty, &row, &activation).expect("reference"));
                let got = f64::from(vec_dot_at(level, ty, &row, &act).expect("fast"));
                let tol = tolerance(ty, &row, &act);
                assert!(
                    (got - expected).abs() <= tol,
                    "{} {ty} n={n} trial {trial}: {got} vs dot_row {expected} (tol {tol})",
                    level.name()
                );
            }
        }
    }
}

#[test]
fn matvec_is_vec_dot_per_row_at_every_level() {
    let mut rng = Rng(0xfa57_0003);
    let (n, rows) = (512, 5);
    for level in available_levels() {
        for ty in FAST_TYPES {
            let weights = random_rows(&mut rng, ty, n, rows);
            let activation = random_activation(&mut rng, n, 0);
            let act = QuantizedActivation::new(ty, &activation).expect("activation");
            let mut out = vec![f32::NAN; rows];
            matvec_at(level, ty, &weights, rows, &act, &mut out).expect("matvec");
            let row_len = weights.len() / rows;
            for (r, &y) in out.iter().enumerate() {
                let row = &weights[r * row_len..(r + 1) * row_len];
                let single = vec_dot_at(level, ty, row, &act).expect("vec_dot");
                assert_eq!(
                    y.to_bits(),
                    single.to_bits(),
                    "{} {ty} row {r}",
                    level.name()
                );
            }
        }
    }
}

#[test]
fn f16_to_f32_matches_half_everywhere() {
    for bits in 0..=u16::MAX {
        let expected = f16::from_bits(bits).to_f32();
        let got = scalar::f16_to_f32(bits);
        if expected.is_nan() {
            assert!(got.is_nan(), "{bits:#06x}");
        } else {
            assert_eq!(got.to_bits(), expected.to_bits(), "{bits:#06x}");
        }
    }
}

#[test]
fn best_level_is_the_last_available() {
    let levels = available_levels();
    assert_eq!(levels[0], SimdLevel::Scalar);
    let last = levels.last().expect("scalar is always available");
    assert_eq!(simd_level(), last.name());
    eprintln!("fast kernels: {}", simd_level());
}

#[test]
fn activation_bytes_are_the_vec_dot_type_quantization() {
    let mut rng = Rng(0xfa57_0004);
    let activation = random_activation(&mut rng, 512, 0);
    for ty in FAST_TYPES {
        let act = QuantizedActivation::new(ty, &activation).expect("activation");
        let act_ty = vec_dot_type(ty);
        let mut expected = vec![0u8; row_bytes(QuantOp::Quantize, act_ty, 512).expect("len")];
        quantize_row(act_ty, &activation, &mut expected).expect("quantize");
        assert_eq!(act.ty(), act_ty);
        assert_eq!(act.values(), 512);
        assert_eq!(act.bytes(), &expected[..]);
    }
}

#[test]
fn requantize_reuses_the_activation() {
    let mut rng = Rng(0xfa57_0005);
    let first = random_activation(&mut rng, 1024, 0);
    let second = random_activation(&mut rng, 512, 0);
    let mut act = QuantizedActivation::new(GgmlType::Q4K, &first).expect("activation");
    act.requantize(GgmlType::Q8_0, &second).expect("requantize");
    assert_eq!(
        act,
        QuantizedActivation::new(GgmlType::Q8_0, &second).expect("fresh")
    );
}

#[test]
fn errors_name_the_mismatch() {
    let op = QuantOp::Dot;
    let activation = vec![0.5f32; 256];
    let act = QuantizedActivation::new(GgmlType::Q4K, &activation).expect("activation");
    let q4k_row = vec![0u8; 144];
    assert_eq!(
        vec_dot(GgmlType::Q8_0, &[0u8; 34 * 8], &act),
        Err(QuantError::ActivationType {
            op,
            ty: GgmlType::Q8_0,
            expected: GgmlType::Q8_0,
            found: GgmlType::Q8K,
        })
    );
    assert_eq!(
        vec_dot(GgmlType::Q3K, &[0u8; 110], &act),
        Err(QuantError::Unsupported {
            op,
            ty: GgmlType::Q3K
        })
    );
    assert_eq!(
        vec_dot(GgmlType::Q4K, &q4k_row[..100], &act),
        Err(QuantError::ByteLength {
            op,
            ty: GgmlType::Q4K,
            expected: 144,
            found: 100,
        })
    );
    let mut out = [0.0f32; 2];
    assert_eq!(
        matvec(GgmlType::Q4K, &q4k_row, 2, &act, &mut out),
        Err(QuantError::ByteLength {
            op,
            ty: GgmlType::Q4K,
            expected: 288,
            found: 144,
        })
    );
    assert_eq!(
        matvec(GgmlType::Q4K, &q4k_row, 1, &act, &mut out),
        Err(QuantError::ValueLength {
            op,
            ty: GgmlType::Q4K,
            expected: 1,
            found: 2,
        })
    );
    assert_eq!(vec_dot(GgmlType::Q4K, &q4k_row, &act), Ok(0.0));
}
