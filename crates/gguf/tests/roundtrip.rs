//! Files written by our writer read back identically, one file or split in parts.

mod common;

use common::{sample_file, sample_metadata, sample_tensors};
use redlite_gguf::{
    write_to_vec, GgmlType, GgufFile, GgufModel, Metadata, TensorSpec, Value, SPLIT_COUNT,
    SPLIT_NO, SPLIT_TENSORS_COUNT,
};

#[test]
fn metadata_and_tensors_round_trip() {
    let file = GgufFile::from_bytes(sample_file()).unwrap();
    assert_eq!(file.version(), 3);
    assert_eq!(file.metadata(), &sample_metadata());
    let tensors = sample_tensors();
    assert_eq!(file.tensors().len(), tensors.len());
    for (info, (spec, data)) in file.tensors().iter().zip(&tensors) {
        assert_eq!(info.name, spec.name);
        assert_eq!(info.ty, spec.ty);
        assert_eq!(info.shape, spec.shape);
        assert!(info.offset.is_multiple_of(32));
        assert_eq!(file.tensor_data(info), &data[..]);
    }
    assert!(file.data_offset().is_multiple_of(32));
    let exps = &file.tensors()[2];
    assert_eq!(exps.ggml_shape(), vec![4, 3, 2]);
    assert_eq!((exps.rows(), exps.row_len(), exps.elements()), (6, 4, 24));
}

#[test]
fn custom_alignment_is_honoured() {
    let mut md = sample_metadata();
    md.set("general.alignment", Value::U32(64));
    let bytes = write_to_vec(&md, &sample_tensors()).unwrap();
    let file = GgufFile::from_bytes(bytes).unwrap();
    assert_eq!(file.alignment(), 64);
    assert!(file.tensors().iter().all(|t| t.offset.is_multiple_of(64)));
    assert!(file.data_offset().is_multiple_of(64));
}

#[test]
fn typed_accessors_explain_mismatches() {
    let md = sample_metadata();
    assert_eq!(md.u64("qwen3next.block_count").unwrap(), 4);
    assert_eq!(md.f64("qwen3next.rope.freq_base").unwrap(), 1.0e7);
    assert_eq!(md.array("tokenizer.ggml.tokens").unwrap().len(), 4);
    let err = md.str("qwen3next.block_count").unwrap_err().to_string();
    assert!(
        err.contains("qwen3next.block_count") && err.contains("U32"),
        "{err}"
    );
    let err = md.u64("missing.key").unwrap_err().to_string();
    assert!(err.contains("missing.key"), "{err}");
    assert_eq!(md.u64("some.i8").ok(), None);
}

fn write_split(dir: &std::path::Path, parts: usize) -> std::path::PathBuf {
    let tensors = sample_tensors();
    let per = tensors.len().div_ceil(parts);
    let mut first = None;
    for k in 0..parts {
        let mut md = if k == 0 {
            sample_metadata()
        } else {
            Metadata::new()
        };
        md.set(SPLIT_NO, Value::U16(k as u16));
        md.set(SPLIT_COUNT, Value::U16(parts as u16));
        md.set(SPLIT_TENSORS_COUNT, Value::I32(tensors.len() as i32));
        let chunk: Vec<(TensorSpec, Vec<u8>)> =
            tensors.iter().skip(k * per).take(per).cloned().collect();
        let path = dir.join(format!("model-{:05}-of-{:05}.gguf", k + 1, parts));
        std::fs::write(&path, write_to_vec(&md, &chunk).unwrap()).unwrap();
        first.get_or_insert(path);
    }
    first.unwrap()
}

#[test]
fn split_files_open_as_one_model() {
    let dir = tempfile::tempdir().unwrap();
    let first = write_split(dir.path(), 3);
    // Any part's name opens the whole set.
    let second = dir.path().join("model-00002-of-00003.gguf");
    for path in [first, second] {
        let model = GgufModel::open(&path).unwrap();
        assert_eq!(model.files().len(), 3);
        assert_eq!(model.tensor_count(), 3);
        assert_eq!(
            model.metadata().str("general.architecture").unwrap(),
            "qwen3next"
        );
        for (spec, data) in sample_tensors() {
            assert_eq!(model.tensor_data(&spec.name).unwrap(), &data[..]);
            assert_eq!(model.require(&spec.name).unwrap().ty, spec.ty);
        }
    }
}

#[test]
fn a_missing_part_is_named() {
    let dir = tempfile::tempdir().unwrap();
    let first = write_split(dir.path(), 3);
    let third = dir.path().join("model-00003-of-00003.gguf");
    std::fs::remove_file(&third).unwrap();
    let err = GgufModel::open(&first).err().unwrap().to_string();
    assert!(
        err.contains("model-00003-of-00003.gguf") && err.contains("missing"),
        "{err}"
    );
}

#[test]
fn writer_refuses_wrong_amounts_of_data() {
    let specs = [TensorSpec::new("t", GgmlType::F32, &[2])];
    let mut w = redlite_gguf::GgufWriter::new(
        Vec::new(),
        std::path::Path::new("x"),
        &Metadata::new(),
        &specs,
    )
    .unwrap();
    w.write_data(&[0; 4]).unwrap();
    let err = w.finish().err().unwrap().to_string();
    assert!(err.contains("\"t\" got 4 of its 8 bytes"), "{err}");

    let mut w = redlite_gguf::GgufWriter::new(
        Vec::new(),
        std::path::Path::new("x"),
        &Metadata::new(),
        &specs,
    )
    .unwrap();
    assert!(w.write_data(&[0; 12]).is_err());

    let bad = [TensorSpec::new("q", GgmlType::Q4K, &[3, 100])];
    let err = redlite_gguf::GgufWriter::new(
        Vec::new(),
        std::path::Path::new("x"),
        &Metadata::new(),
        &bad,
    )
    .err()
    .unwrap()
    .to_string();
    assert!(err.contains("\"q\"") && err.contains("Q4_K"), "{err}");
}
