//! Errors of the memory planner: a model it cannot read, or settings it cannot plan for.

use redlite_gguf::GgmlType;
use thiserror::Error;

use crate::error::EngineError;

#[derive(Debug, Error)]
pub enum PlanError {
    /// The file's metadata or tensor table does not describe a qwen3next model.
    #[error(transparent)]
    Model(#[from] EngineError),

    #[error("tensor {name:?}: a {ty} tensor of shape {shape:?} is not a whole number of blocks or overflows")]
    TensorSize {
        name: String,
        ty: GgmlType,
        shape: Vec<u64>,
    },

    #[error("--mtp asks for the MTP block, but the file has none (qwen3next.nextn_predict_layers is absent or 0; files converted before mid-2026 dropped it)")]
    NoMtpBlock,

    #[error("{name} is {value}: {why}")]
    BadSetting {
        name: &'static str,
        value: String,
        why: String,
    },

    #[error(
        "{input:?} is not a byte size ({why}); write e.g. 24GiB, 24G, 16000MiB or 25769803776"
    )]
    BadBytes { input: String, why: &'static str },
}

pub type Result<T> = std::result::Result<T, PlanError>;
