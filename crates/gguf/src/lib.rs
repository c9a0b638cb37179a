//! The GGUF container: metadata, the tensor table and zero-copy views of tensor bytes
//! (one file or a set of split files), and a streaming writer.
//!
//! Shapes are converted once, here, to outermost-first order: a weight with GGUF dimensions
//! `{in, out}` has `shape == [out, in]`.

mod error;
mod file;
mod model;
mod parse;
mod tensor;
mod types;
mod value;
mod writer;

pub use error::{GgufError, Result};
pub use file::GgufFile;
pub use model::{split_paths, GgufModel, TensorRef, SPLIT_COUNT, SPLIT_NO, SPLIT_TENSORS_COUNT};
pub use parse::{ALIGNMENT_KEY, DEFAULT_ALIGNMENT, MAX_DIMS};
pub use tensor::TensorInfo;
pub use types::GgmlType;
pub use value::{Metadata, Value, ValueType};
pub use writer::{write_to_vec, GgufWriter, TensorSpec};
