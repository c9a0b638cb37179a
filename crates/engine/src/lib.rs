//! The qwen3next engine: the model (config, tensor layout, the forward pass written once),
//! backends (CPU; CUDA behind the `cuda` feature), per-sequence state, sessions and the
//! generation loop, tokenizer, chat template, sampling, benchmarks, synthetic model files and
//! file inspection.

pub mod backend;
pub mod bench;
pub mod chat;
pub mod convert;
pub mod error;
pub mod generate;
pub mod inspect;
pub mod model;
pub mod plan;
pub mod quality;
pub mod sampling;
pub mod serve;
pub mod session;
pub mod speculative;
pub mod state;
pub mod synth;
pub mod tokenizer;
pub mod vocab;

pub use error::{EngineError, Result};
