//! Crate-level tests: block geometry, the reference dots against dequantized dots on
//! seeded random blocks, scale-field helpers and errors.

use super::*;
use std::mem::size_of;

/// SplitMix64: a tiny deterministic generator, enough for random blocks.
struct Rng(u64);

impl Rng {
    fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }

    /// Uniform in [lo, hi).
    fn uniform(&mut self, lo: f32, hi: f32) -> f32 {
        let unit = (self.next_u64() >> 40) as f32 / (1u64 << 24) as f32;
        lo + (hi - lo) * unit
    }

    fn fill(&mut self, bytes: &mut [u8]) {
        for b in bytes {
            *b = self.next_u64() as u8;
        }
    }
}

/// Every type with a dot, as the synthetic-model writer would make them.
const TYPES: [GgmlType; 24] = [
    GgmlType::F32,
    GgmlType::F16,
    GgmlType::BF16,
    GgmlType::Q4_0,
    GgmlType::Q4_1,
    GgmlType::Q5_0,
    GgmlType::Q5_1,
    GgmlType::Q8_0,
    GgmlType::Q8_1,
    GgmlType::Q2K,
    GgmlType::Q3K,
    GgmlType::Q4K,
    GgmlType::Q5K,
    GgmlType::Q6K,
    GgmlType::Q8K,
    GgmlType::IQ2XXS,
    GgmlType::IQ2XS,
    GgmlType::IQ2S,
    GgmlType::IQ3XXS,
    GgmlType::IQ3S,
    GgmlType::IQ1S,
    GgmlType::IQ1M,
    GgmlType::IQ4NL,
    GgmlType::IQ4XS,
];

/// A row of `values` values of `ty`: random bytes with finite scales (or random floats
/// for the float types).
fn random_row(rng: &mut Rng, ty: GgmlType, values: usize) -> Vec<u8> {
    if !ty.is_quantized() {
        let floats: Vec<f32> = (0..values).map(|_| rng.uniform(-1.0, 1.0)).collect();
        let mut bytes = vec![0u8; values * ty.block_bytes()];
        quantize_row(ty, &floats, &mut bytes).expect("float types quantize");
        return bytes;
    }
    let mut bytes = vec![0u8; values / ty.block_values() * ty.block_bytes()];
    rng.fill(&mut bytes);
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

fn dequantized(ty: GgmlType, bytes: &[u8], values: usize) -> Vec<f32> {
    let mut out = vec![0f32; values];
    dequantize_row(ty, bytes, &mut out).expect("dequantize");
    out
}

fn f16_at(bytes: &[u8], offset: usize) -> f32 {
    f16::from_bits(u16::from_le_bytes([bytes[offset], bytes[offset + 1]])).to_f32()
}

/// The block types' constants agree with their struct sizes and with the GGUF table.
#[test]
fn block_geometry_matches_the_gguf_table() {
    fn check<B: Block>(size: usize) {
        assert_eq!(B::BYTES, size, "{} struct size", B::TYPE);
        assert_eq!(B::BYTES, B::TYPE.block_bytes(), "{} bytes", B::TYPE);
        assert_eq!(B::VALUES, B::TYPE.block_values(), "{} values", B::TYPE);
    }
    check::<BlockQ4_0>(size_of::<BlockQ4_0>());
    check::<BlockQ4_1>(size_of::<BlockQ4_1>());
    check::<BlockQ5_0>(size_of::<BlockQ5_0>());
    check::<BlockQ5_1>(size_of::<BlockQ5_1>());
    check::<BlockQ8_0>(size_of::<BlockQ8_0>());
    check::<BlockQ8_1>(size_of::<BlockQ8_1>());
    check::<BlockQ2K>(size_of::<BlockQ2K>());
    check::<BlockQ3K>(size_of::<BlockQ3K>());
    check::<BlockQ4K>(size_of::<BlockQ4K>());
    check::<BlockQ5K>(size_of::<BlockQ5K>());
    check::<BlockQ6K>(size_of::<BlockQ6K>());
    check::<BlockQ8K>(size_of::<BlockQ8K>());
    check::<BlockIQ2XXS>(size_of::<BlockIQ2XXS>());
    check::<BlockIQ2XS>(size_of::<BlockIQ2XS>());
    check::<BlockIQ2S>(size_of::<BlockIQ2S>());
    check::<BlockIQ3XXS>(size_of::<BlockIQ3XXS>());
    check::<BlockIQ3S>(size_of::<BlockIQ3S>());
    check::<BlockIQ1S>(size_of::<BlockIQ1S>());
    check::<BlockIQ1M>(size_of::<BlockIQ1M>());
    check::<BlockIQ4NL>(size_of::<BlockIQ4NL>());
    check::<BlockIQ4XS>(size_of::<BlockIQ4XS>());
}

/// `dot_row` equals the f64 dot of the dequantized weights with the dequantized
/// quantized activation up to float rounding, and the plain dequantized dot up to the
/// activation's quantization error (Cauchy-Schwarz: ‖w‖·‖a − a'‖).
#[test]
fn dot_matches_dequantized_dot_for_every_type() {
    let mut rng = Rng(0x5eed_0001);
    for ty in TYPES {
        for trial in 0..4 {
            let n = 512;
            let weights = random_row(&mut rng, ty, n);
            let activation: Vec<f32> = (0..n).map(|_| rng.uniform(-2.0, 2.0)).collect();
            let w = dequantized(ty, &weights, n);

            let act_ty = vec_dot_type(ty);
            let mut act_bytes =
                vec![0u8; act_ty.row_bytes(n as u64).expect("whole blocks") as usize];
            quantize_row(act_ty, &activation, &mut act_bytes).expect("activation quantizes");
            let a_q = dequantized(act_ty, &act_bytes, n);

            let exact: f64 = w
                .iter()
                .zip(&a_q)
                .map(|(&x, &y)| f64::from(x) * f64::from(y))
                .sum();
            let magnitude: f64 = w
                .iter()
                .zip(&a_q)
                .map(|(&x, &y)| f64::from(x * y).abs())
                .sum();
            // Q4_1 / Q5_1 use Q8_1's f16-rounded s = d·Σq for their min term.
            let mut min_term_rounding = 0.0f64;
            if act_ty == GgmlType::Q8_1 {
                let (wb, ab) = (ty.block_bytes(), act_ty.block_bytes());
                for (wblock, ablock) in weights.chunks_exact(wb).zip(act_bytes.chunks_exact(ab)) {
                    let bound = f64::from(f16_at(wblock, 2) * f16_at(ablock, 2)).abs();
                    min_term_rounding += bound / 1024.0;
                }
            }
            let got = f64::from(dot_row(ty, &weights, &activation).expect("dot"));
            let tol = 1e-5 * magnitude + min_term_rounding + 1e-6;
            assert!(
                (got - exact).abs() <= tol,
                "{ty} trial {trial}: dot_row {got} vs dequantized {exact} (tol {tol})"
            );

            let plain: f64 = w
                .iter()
                .zip(&activation)
                .map(|(&x, &y)| f64::from(x) * f64::from(y))
                .sum();
            let w_norm = w.iter().map(|&x| f64::from(x).powi(2)).sum::<f64>().sqrt();
            let a_err = activation
                .iter()
                .zip(&a_q)
                .map(|(&x, &y)| f64::from(x - y).powi(2))
                .sum::<f64>()
                .sqrt();
            let loose = w_norm * a_err + tol;
            assert!(
                (got - plain).abs() <= loose,
                "{ty} trial {trial}: dot_row {got} vs f32 activation {plain} (tol {loose})"
            );
        }
    }
}

#[test]
fn vec_dot_types_follow_ggml() {
    use GgmlType as T;
    let expected = [
        (T::F32, T::F32),
        (T::F16, T::F16),
        (T::BF16, T::BF16),
        (T::Q4_0, T::Q8_0),
        (T::Q5_0, T::Q8_0),
        (T::Q8_0, T::Q8_0),
        (T::IQ4NL, T::Q8_0),
        (T::Q4_1, T::Q8_1),
        (T::Q5_1, T::Q8_1),
        (T::Q2K, T::Q8K),
        (T::Q6K, T::Q8K),
        (T::IQ1M, T::Q8K),
        (T::IQ4XS, T::Q8K),
        (T::TQ1_0, T::F32),
    ];
    for (ty, act) in expected {
        assert_eq!(vec_dot_type(ty), act, "{ty}");
    }
}

#[test]
fn zero_rows_quantize_to_zero() {
    for ty in [
        GgmlType::Q8_0,
        GgmlType::Q8_1,
        GgmlType::Q8K,
        GgmlType::Q4K,
        GgmlType::Q6K,
        GgmlType::Q4_0,
        GgmlType::Q5_1,
    ] {
        let values = vec![0f32; 256];
        let mut bytes = vec![0xffu8; ty.row_bytes(256).expect("whole blocks") as usize];
        quantize_row(ty, &values, &mut bytes).expect("quantize");
        let back = dequantized(ty, &bytes, 256);
        assert!(back.iter().all(|&v| v == 0.0), "{ty}: {back:?}");
    }
}

#[test]
fn q8k_bsums_are_the_group_sums() {
    let mut rng = Rng(7);
    let values: Vec<f32> = (0..256).map(|_| rng.uniform(-3.0, 3.0)).collect();
    let block = BlockQ8K::quantize(&values);
    for (j, &sum) in block.bsums.iter().enumerate() {
        let expected: i32 = block.qs[16 * j..16 * j + 16]
            .iter()
            .map(|&q| i32::from(q))
            .sum();
        assert_eq!(i32::from(sum), expected, "group {j}");
    }
    assert!(block.qs.iter().any(|&q| q == -127 || q == 127));
}

#[test]
fn nearest_int_rounds_half_to_even() {
    for (x, expected) in [
        (0.5f32, 0),
        (1.5, 2),
        (2.5, 2),
        (-0.5, 0),
        (-1.5, -2),
        (3.49, 3),
        (-7.7, -8),
        (126.5, 126),
    ] {
        assert_eq!(block::nearest_int(x), expected, "{x}");
    }
}

#[test]
fn bf16_conversion_rounds_to_nearest_even() {
    assert_eq!(float::f32_to_bf16(1.0), 0x3f80);
    assert_eq!(float::f32_to_bf16(f32::from_bits(0x3f80_8000)), 0x3f80); // tie to even
    assert_eq!(float::f32_to_bf16(f32::from_bits(0x3f81_8000)), 0x3f82); // tie to even
    assert_eq!(float::f32_to_bf16(f32::from_bits(0x3f80_8001)), 0x3f81);
    assert_eq!(float::f32_to_bf16(f32::NAN) & 0x7fc0, 0x7fc0);
}

#[test]
fn iq1m_scale_round_trips_and_keeps_group_scales() {
    let mut rng = Rng(11);
    let mut block = vec![0u8; 56];
    rng.fill(&mut block);
    let before = block.clone();
    let d = f16::from_f32(0.0123);
    set_iq1m_scale(&mut block, d).expect("one block");
    assert_eq!(BlockIQ1M::read(&block).d(), d);
    assert_eq!(block[..48], before[..48]);
    for k in 0..4 {
        assert_eq!(
            block[48 + 2 * k],
            before[48 + 2 * k],
            "low byte of word {k}"
        );
        assert_eq!(
            block[49 + 2 * k] & 0x0f,
            before[49 + 2 * k] & 0x0f,
            "word {k}"
        );
    }
    assert!(set_iq1m_scale(&mut block[..55], d).is_err());
}

#[test]
fn scale_fields_sit_inside_their_blocks() {
    for ty in TYPES {
        for field in scale_fields(ty) {
            let width = if field.kind == ScaleKind::DF32 { 4 } else { 2 };
            assert!(field.offset + width <= ty.block_bytes(), "{ty}: {field:?}");
        }
    }
    assert!(scale_fields(GgmlType::IQ1M).is_empty());
    assert_eq!(
        scale_fields(GgmlType::Q6K),
        &[ScaleField {
            offset: 208,
            kind: ScaleKind::D
        }]
    );
}

#[test]
fn errors_name_the_op_type_and_sizes() {
    let mut out = vec![0f32; 256];
    let err = dequantize_row(GgmlType::Q4K, &[0u8; 143], &mut out).unwrap_err();
    assert_eq!(
        err,
        QuantError::ByteLength {
            op: QuantOp::Dequantize,
            ty: GgmlType::Q4K,
            expected: 144,
            found: 143
        }
    );
    assert_eq!(
        err.to_string(),
        "dequantize Q4_K: expected 144 bytes, found 143"
    );

    let err = dot_row(GgmlType::Q8_0, &[0u8; 34], &[0f32; 31]).unwrap_err();
    assert!(
        matches!(
            err,
            QuantError::PartialBlock {
                block_values: 32,
                found: 31,
                ..
            }
        ),
        "{err}"
    );

    let err = quantize_row(GgmlType::IQ2XXS, &[0f32; 256], &mut [0u8; 66]).unwrap_err();
    assert_eq!(
        err,
        QuantError::Unsupported {
            op: QuantOp::Quantize,
            ty: GgmlType::IQ2XXS
        }
    );
    assert_eq!(err.to_string(), "quantize: type IQ2_XXS is not supported");

    let err = dequantize_row(GgmlType::MXFP4, &[0u8; 17], &mut [0f32; 32]).unwrap_err();
    assert_eq!(
        err,
        QuantError::Unsupported {
            op: QuantOp::Dequantize,
            ty: GgmlType::MXFP4
        }
    );
}
