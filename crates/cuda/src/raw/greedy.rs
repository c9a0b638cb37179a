//! Launches of the greedy-sampling kernels (`elementwise.cu`: the argmax and the ids of its
//! keys); the op entries in `greedy.rs` checked the buffers and sized the grid.

use super::layers::{builder, launched};
use crate::error::CudaError;
use cudarc::driver::{
    CudaFunction, CudaStream, CudaView, CudaViewMut, LaunchConfig, PushKernelArg,
};

/// `argmax_kernel(x, n, best)`: `best[r]` (zeroed) ends as the largest key of row r of x
/// (n values), for the grid.y rows.
pub(crate) fn launch_argmax(
    stream: &CudaStream,
    kernel: &CudaFunction,
    config: LaunchConfig,
    x: &CudaView<'_, f32>,
    n: i32,
    best: &mut CudaViewMut<'_, u64>,
) -> Result<(), CudaError> {
    let mut launch = builder(stream, kernel);
    launch.arg(x).arg(&n).arg(best);
    // SAFETY: arguments match the signature; x holds grid.y rows of n values (threads past
    // n read none), best grid.y u64 (op entry); blockDim is a multiple of 32 (at most 1,024:
    // 32 warp slots).
    launched(stream, "cuLaunchKernel(argmax)", unsafe {
        launch.launch(config)
    })
}

/// `ids_of_keys_kernel(keys, n, ids)`: the token of each of the n keys into ids.
pub(crate) fn launch_ids_of_keys(
    stream: &CudaStream,
    kernel: &CudaFunction,
    config: LaunchConfig,
    keys: &CudaView<'_, u64>,
    n: i32,
    ids: &mut CudaViewMut<'_, u32>,
) -> Result<(), CudaError> {
    let mut launch = builder(stream, kernel);
    launch.arg(keys).arg(&n).arg(ids);
    // SAFETY: arguments match the signature; keys and ids hold n values each (op entry);
    // threads past n return.
    launched(stream, "cuLaunchKernel(ids_of_keys)", unsafe {
        launch.launch(config)
    })
}
