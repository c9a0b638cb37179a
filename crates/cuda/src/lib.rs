//! CUDA backend. Compiled only when the `cuda` feature of the `redlite` binary is on.
//!
//! The driver, NVRTC compilation with its on-disk cache and the kernels arrive with the
//! CUDA backend issue; this crate exists now so the workspace has its final shape.

/// Whether this build carries the CUDA backend at all.
pub const BUILT_WITH_CUDA: bool = true;
