//! Errors of the engine crate.

use thiserror::Error;

#[derive(Debug, Error)]
pub enum EngineError {
    #[error(transparent)]
    Gguf(#[from] redlite_gguf::GgufError),

    #[error(transparent)]
    Quant(#[from] redlite_quant::QuantError),

    #[error("architecture {found:?} is not supported (this engine runs \"qwen3next\")")]
    UnsupportedArchitecture { found: String },

    #[error("bad model configuration: {0}")]
    BadConfig(String),

    #[error("tensor {name:?} has shape {found:?}, expected {expected:?} from the metadata")]
    ShapeMismatch {
        name: String,
        expected: Vec<u64>,
        found: Vec<u64>,
    },

    #[error("tensor {name:?} is missing (the metadata implies it)")]
    MissingTensor { name: String },

    #[error("the prompt needs {needed} positions but the context holds {capacity}")]
    ContextFull { needed: usize, capacity: usize },

    #[error("token id {id} is outside the vocabulary of {n_vocab}")]
    BadToken { id: u32, n_vocab: usize },

    #[error(transparent)]
    Tokenizer(#[from] crate::tokenizer::TokenizerError),

    #[error(transparent)]
    Chat(#[from] crate::chat::ChatError),

    #[error(transparent)]
    Sampling(#[from] crate::sampling::SamplingError),

    #[error("--mtp needs the model's MTP block, but the file has none (qwen3next.nextn_predict_layers is absent or 0: files converted before mid-2026 dropped it; `redlite synth --mtp` writes one)")]
    NoMtpBlock,

    #[error("synthetic model: {0}")]
    Synth(String),

    /// A Hugging Face checkpoint that `convert` cannot read or map.
    #[error("convert: {0}")]
    Convert(String),

    /// A CUDA backend failure (driver, kernel launch, shape check, allocation).
    #[cfg(feature = "cuda")]
    #[error("CUDA: {0}")]
    Cuda(String),

    #[error("{path}: {source}")]
    Io {
        path: std::path::PathBuf,
        #[source]
        source: std::io::Error,
    },
}

#[cfg(feature = "cuda")]
impl From<redlite_cuda::CudaError> for EngineError {
    fn from(error: redlite_cuda::CudaError) -> EngineError {
        EngineError::Cuda(error.to_string())
    }
}

pub type Result<T> = std::result::Result<T, EngineError>;
