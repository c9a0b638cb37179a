//! Launch of the span copies (`elementwise.cu`'s `copy_spans_kernel`); the op entry in
//! `copies.rs` wrote the table from borrowed buffers and sized the grid.

use super::layers::{builder, launched};
use crate::error::CudaError;
use cudarc::driver::{CudaFunction, CudaStream, CudaView, LaunchConfig, PushKernelArg};

/// `copy_spans_kernel(spans)`: span `blockIdx.y` of the table (source, destination, floats).
pub(crate) fn launch_copy_spans(
    stream: &CudaStream,
    kernel: &CudaFunction,
    config: LaunchConfig,
    spans: &CudaView<'_, u64>,
) -> Result<(), CudaError> {
    let mut launch = builder(stream, kernel);
    launch.arg(spans);
    // SAFETY: arguments match the signature; the table holds grid.y spans of three values
    // (op entry), each naming device buffers of at least its length that the caller owns.
    launched(stream, "cuLaunchKernel(copy_spans)", unsafe {
        launch.launch(config)
    })
}
