//! Shared by the GPU test files: the device, or a clean skip where there is none.

use std::sync::Arc;

use redlite_cuda::{CudaError, Device};

/// The device, or `None` after printing why `test` is skipped (no driver, NVRTC or GPU).
pub fn device(test: &str) -> Option<Arc<Device>> {
    match Device::open(0) {
        Ok(device) => Some(Arc::new(device)),
        Err(error @ (CudaError::NoDriver | CudaError::NoNvrtc | CudaError::NoDevice { .. })) => {
            eprintln!("skipping {test}: {error}");
            None
        }
        Err(error) => panic!("{test}: CUDA device failed to open: {error}"),
    }
}
