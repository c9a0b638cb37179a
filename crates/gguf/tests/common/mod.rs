//! A small valid file shared by the tests.

use redlite_gguf::{write_to_vec, GgmlType, Metadata, TensorSpec, Value, ValueType};

pub fn sample_metadata() -> Metadata {
    let mut md = Metadata::new();
    md.set("general.architecture", Value::String("qwen3next".into()));
    md.set("qwen3next.block_count", Value::U32(4));
    md.set("qwen3next.rope.freq_base", Value::F32(1.0e7));
    md.set("some.i8", Value::I8(-3));
    md.set("some.u16", Value::U16(65535));
    md.set("some.i16", Value::I16(-2));
    md.set("some.i64", Value::I64(-1 << 40));
    md.set("some.u64", Value::U64(1 << 40));
    md.set("some.f64", Value::F64(0.25));
    md.set("some.bool", Value::Bool(true));
    md.set("some.u8", Value::U8(7));
    md.set(
        "tokenizer.ggml.tokens",
        Value::strings(["a", "b", "ä½ ", ""]),
    );
    md.set("tokenizer.ggml.token_type", Value::i32s([1, 1, 3, 5]));
    md.set(
        "nested",
        Value::Array {
            item_type: ValueType::Array,
            items: vec![Value::i32s([1, 2]), Value::i32s([])],
        },
    );
    md
}

/// Three tensors: an F32 vector, a Q8_0 matrix, an F16 3-D tensor.
pub fn sample_tensors() -> Vec<(TensorSpec, Vec<u8>)> {
    let f32s: Vec<u8> = (0..5u32).flat_map(|i| (i as f32).to_le_bytes()).collect();
    let q8: Vec<u8> = (0..2 * 34).map(|i| (i * 7 % 251) as u8).collect();
    let f16: Vec<u8> = (0..2 * 3 * 4 * 2).map(|i| i as u8).collect();
    vec![
        (TensorSpec::new("norm.weight", GgmlType::F32, &[5]), f32s),
        (TensorSpec::new("blk.0.q8", GgmlType::Q8_0, &[2, 32]), q8),
        (
            TensorSpec::new("blk.0.exps", GgmlType::F16, &[2, 3, 4]),
            f16,
        ),
    ]
}

pub fn sample_file() -> Vec<u8> {
    write_to_vec(&sample_metadata(), &sample_tensors()).expect("sample file")
}
