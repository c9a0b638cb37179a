//! Bit-exact dequantization against gguf-py, and quantization against gguf-py where it
//! can quantize. Fixtures come from `scripts/fixtures/gen_quant_fixtures.py`.

use redlite_gguf::GgmlType;
use redlite_quant::{dequantize_row, quantize_row};
use std::path::PathBuf;

fn fixture_dir() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures")
}

fn read(name: &str) -> Vec<u8> {
    let path = fixture_dir().join(name);
    std::fs::read(&path).unwrap_or_else(|e| panic!("reading {}: {e}", path.display()))
}

fn read_f32(name: &str) -> Vec<f32> {
    read(name)
        .chunks_exact(4)
        .map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]]))
        .collect()
}

fn manifest() -> serde_json::Value {
    let text = String::from_utf8(read("manifest.json")).expect("manifest is UTF-8");
    serde_json::from_str(&text).expect("manifest is JSON")
}

fn type_named(name: &str) -> GgmlType {
    GgmlType::from_name(name).unwrap_or_else(|| panic!("unknown type {name} in manifest"))
}

#[test]
fn dequantize_is_bit_exact_with_gguf_py() {
    let manifest = manifest();
    let entries = manifest["dequantize"].as_array().expect("dequantize list");
    assert_eq!(entries.len(), 24, "one fixture per supported type");
    for entry in entries {
        let name = entry["type"].as_str().expect("type name");
        let ty = type_named(name);
        let blocks = read(&format!("{name}.bin"));
        let expected = read_f32(&format!("{name}.f32"));
        let mut got = vec![0f32; expected.len()];
        dequantize_row(ty, &blocks, &mut got).unwrap_or_else(|e| panic!("{name}: {e}"));
        let per_block = ty.block_values();
        for (i, (g, e)) in got.iter().zip(&expected).enumerate() {
            assert!(
                g.to_bits() == e.to_bits(),
                "{name}: block {} value {}: got {g:e} ({:#010x}), gguf-py {e:e} ({:#010x}) [{}]",
                i / per_block,
                i % per_block,
                g.to_bits(),
                e.to_bits(),
                entry["reference"],
            );
        }
    }
}

#[test]
fn quantize_is_byte_identical_with_gguf_py() {
    let manifest = manifest();
    let values = read_f32("quantize_input.f32");
    for name in manifest["quantize"].as_array().expect("quantize list") {
        let name = name.as_str().expect("type name");
        let ty = type_named(name);
        let expected = read(&format!("{name}.quant.bin"));
        let mut got = vec![0u8; expected.len()];
        quantize_row(ty, &values, &mut got).unwrap_or_else(|e| panic!("{name}: {e}"));
        for (i, (g, e)) in got.iter().zip(&expected).enumerate() {
            let block_bytes = ty.block_bytes();
            assert_eq!(
                g,
                e,
                "{name}: block {} byte {}: got {g:#04x}, gguf-py {e:#04x}",
                i / block_bytes,
                i % block_bytes
            );
        }
    }
}

/// Quantize → dequantize error of the fixture values, bounded per type by the step
/// size of its grid relative to the block's largest magnitude.
#[test]
fn quantize_round_trips_within_the_format_error() {
    let values = read_f32("quantize_input.f32");
    let cases = [
        (GgmlType::F32, 0.0),
        (GgmlType::F16, 1.0 / 2048.0),
        (GgmlType::BF16, 1.0 / 256.0),
        (GgmlType::Q8_0, 1.0 / 254.0 + 1e-3),
        (GgmlType::Q8_1, 1.0 / 254.0 + 1e-3),
        (GgmlType::Q8K, 1.0 / 254.0 + 1e-6),
        // Q4_0 / Q5_0 map the signed maximum to −8 / −16, so the other sign is clipped at
        // 7/8 / 15/16 of it: a clip of 1/8 (1/16) plus half a step.
        (GgmlType::Q4_0, 1.0 / 8.0 + 1.0 / 16.0),
        (GgmlType::Q4_1, 1.0 / 15.0),
        (GgmlType::Q5_0, 1.0 / 16.0 + 1.0 / 32.0),
        (GgmlType::Q5_1, 1.0 / 31.0),
        (GgmlType::Q4K, 0.15),
        (GgmlType::Q6K, 0.04),
    ];
    for (ty, relative) in cases {
        let mut bytes =
            vec![0u8; ty.row_bytes(values.len() as u64).expect("whole blocks") as usize];
        quantize_row(ty, &values, &mut bytes).unwrap_or_else(|e| panic!("{ty}: {e}"));
        let mut back = vec![0f32; values.len()];
        dequantize_row(ty, &bytes, &mut back).unwrap_or_else(|e| panic!("{ty}: {e}"));
        let per_block = ty.block_values().max(32);
        for (b, (xs, ys)) in values
            .chunks(per_block)
            .zip(back.chunks(per_block))
            .enumerate()
        {
            let amax = xs.iter().fold(0f32, |m, v| m.max(v.abs()));
            for (i, (x, y)) in xs.iter().zip(ys).enumerate() {
                let bound = if ty.block_values() == 1 {
                    relative * x.abs()
                } else {
                    relative * amax
                };
                assert!(
                    (x - y).abs() <= bound,
                    "{ty}: block {b} value {i}: {x} came back as {y} (bound {bound})"
                );
            }
        }
        // On average the fit is far better than the worst case: the block maximum is a few
        // standard deviations of these normal values.
        let err: f32 = values
            .iter()
            .zip(&back)
            .map(|(x, y)| (x - y) * (x - y))
            .sum();
        let norm: f32 = values.iter().map(|x| x * x).sum();
        assert!(
            err <= 4.0 * norm * relative * relative,
            "{ty}: relative squared error {}",
            err / norm
        );
    }
}
