//! Every way a GGUF file can be refused, each naming the file and what was wrong.

use std::path::PathBuf;

use thiserror::Error;

#[derive(Debug, Error)]
pub enum GgufError {
    #[error("{path}: {source}")]
    Io {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },

    #[error("{path}: not a GGUF file (magic is {found:?}, expected \"GGUF\")")]
    BadMagic { path: PathBuf, found: [u8; 4] },

    #[error("{path}: GGUF version {found} is not supported (expected 2 or 3)")]
    UnsupportedVersion { path: PathBuf, found: u32 },

    #[error("{path}: truncated while reading {what} at byte {offset}: needs {needed} bytes, the file has {available} left")]
    Truncated {
        path: PathBuf,
        what: String,
        offset: u64,
        needed: u64,
        available: u64,
    },

    #[error("{path}: {what} claims {count} entries, more than the {limit} the file could hold")]
    CountTooLarge {
        path: PathBuf,
        what: String,
        count: u64,
        limit: u64,
    },

    #[error("{path}: metadata key {key:?} has unknown value type {found}")]
    UnknownValueType {
        path: PathBuf,
        key: String,
        found: u32,
    },

    #[error("{path}: nested arrays deeper than {limit} levels under key {key:?}")]
    NestingTooDeep {
        path: PathBuf,
        key: String,
        limit: usize,
    },

    #[error("{path}: {what} is not valid UTF-8")]
    BadUtf8 { path: PathBuf, what: String },

    #[error("{path}: metadata key {key:?} appears twice")]
    DuplicateKey { path: PathBuf, key: String },

    #[error("{path}: tensor {name:?} appears twice")]
    DuplicateTensor { path: PathBuf, name: String },

    #[error("{path}: general.alignment is {found}, expected a non-zero power of two")]
    BadAlignment { path: PathBuf, found: u64 },

    #[error("{path}: tensor {tensor:?} has unknown block type id {found}")]
    UnknownTensorType {
        path: PathBuf,
        tensor: String,
        found: u32,
    },

    #[error("{path}: tensor {tensor:?} has {found} dimensions, expected 1 to {limit}")]
    BadDimensionCount {
        path: PathBuf,
        tensor: String,
        found: u32,
        limit: u32,
    },

    #[error("{path}: tensor {tensor:?} has shape {shape:?} whose size overflows")]
    ShapeOverflow {
        path: PathBuf,
        tensor: String,
        shape: Vec<u64>,
    },

    #[error("{path}: tensor {tensor:?} rows of {row} values are not a whole number of {ty} blocks of {block}")]
    RowNotBlockAligned {
        path: PathBuf,
        tensor: String,
        ty: String,
        row: u64,
        block: usize,
    },

    #[error(
        "{path}: tensor {tensor:?} offset {offset} is not a multiple of the alignment {alignment}"
    )]
    MisalignedTensor {
        path: PathBuf,
        tensor: String,
        offset: u64,
        alignment: u64,
    },

    #[error("{path}: tensor {tensor:?} data [{start}, {end}) lies outside the data section of {data_len} bytes")]
    TensorOutOfBounds {
        path: PathBuf,
        tensor: String,
        start: u64,
        end: u64,
        data_len: u64,
    },

    #[error("{path}: tensors {first:?} and {second:?} overlap")]
    TensorsOverlap {
        path: PathBuf,
        first: String,
        second: String,
    },

    #[error("{path}: split files: {problem}")]
    Split { path: PathBuf, problem: String },

    #[error("metadata key {key:?} is missing")]
    MissingKey { key: String },

    #[error("metadata key {key:?} is {found}, expected {expected}")]
    WrongValueType {
        key: String,
        expected: String,
        found: String,
    },

    #[error("tensor {name:?} is missing")]
    MissingTensor { name: String },

    #[error("writing {path}: {problem}")]
    Write { path: PathBuf, problem: String },
}

pub type Result<T> = std::result::Result<T, GgufError>;
