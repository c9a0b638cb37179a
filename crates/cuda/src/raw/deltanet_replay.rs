//! Launch of the replayed MTP rollback (`deltanet_replay.cu`); the op entry in
//! `deltanet_replay.rs` checked the table's buffers and sized the grid.

use super::layers::{builder, launched};
use crate::error::CudaError;
use cudarc::driver::{CudaFunction, CudaStream, CudaView, LaunchConfig, PushKernelArg};

/// `deltanet_replay_kernel<DK>(layers, kept, k_heads, v_heads, conv_len)`.
pub(crate) fn launch_deltanet_replay(
    stream: &CudaStream,
    kernel: &CudaFunction,
    config: LaunchConfig,
    layers: &CudaView<'_, u64>,
    dims: [i32; 4],
) -> Result<(), CudaError> {
    let mut launch = builder(stream, kernel);
    launch.arg(layers);
    for d in &dims {
        launch.arg(d);
    }
    // SAFETY: arguments match the signature; the table holds grid.y layers of five addresses
    // (op entry), each naming a device buffer the caller owns of the length the op entry
    // checked against (kept, k_heads, v_heads, DK = block) and conv_len; grid.x = v_heads.
    launched(stream, "cuLaunchKernel(deltanet_replay)", unsafe {
        launch.launch(config)
    })
}
