//! The model: hyperparameters and the tensors they imply.

pub mod config;
pub mod forward;
pub mod load;
pub mod mtp;
pub mod tensors;
pub mod weights;

pub use config::{DeltaNetLayout, HybridConfig, LayerKind};
pub use tensors::{expected_tensors, Role, TensorPlan};
