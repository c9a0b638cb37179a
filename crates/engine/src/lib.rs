//! The qwen3next engine: model configuration and tensor layout, synthetic model files, and
//! file inspection. The forward pass, backends and generation loop build on these.

pub mod backend;
pub mod bench;
pub mod chat;
pub mod error;
pub mod generate;
pub mod inspect;
pub mod model;
pub mod sampling;
pub mod session;
pub mod state;
pub mod synth;
pub mod tokenizer;
pub mod vocab;

pub use error::{EngineError, Result};
