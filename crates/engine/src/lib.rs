//! The qwen3next engine: model configuration and tensor layout, synthetic model files, and
//! file inspection. The forward pass, backends and generation loop build on these.

pub mod error;
pub mod inspect;
pub mod model;
pub mod synth;
pub mod vocab;

pub use error::{EngineError, Result};
