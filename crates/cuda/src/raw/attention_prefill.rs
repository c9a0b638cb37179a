//! Launch of the flash prefill attention kernel (`attention_prefill.cu`).

use super::layers::{allow_shared, builder, launched};
use crate::error::CudaError;
use cudarc::driver::{
    CudaFunction, CudaStream, CudaView, CudaViewMut, DeviceRepr, LaunchConfig, PushKernelArg,
};

/// `attention_prefill_kernel<KV, HD>(q, qg, k_cache, v_cache, o, partials, tokens, pos0,
/// heads, kv_heads, chunk, scale)`, after raising the kernel's dynamic shared memory limit to
/// the launch's.
#[allow(clippy::too_many_arguments)]
pub(crate) fn launch_attention_prefill<T: DeviceRepr>(
    stream: &CudaStream,
    kernel: &CudaFunction,
    config: LaunchConfig,
    (q, qg): (&CudaView<'_, f32>, &CudaView<'_, f32>),
    (k_cache, v_cache): (&CudaView<'_, T>, &CudaView<'_, T>),
    o: &mut CudaViewMut<'_, f32>,
    partials: &mut CudaViewMut<'_, f32>,
    dims: [i32; 5],
    scale: f32,
) -> Result<(), CudaError> {
    allow_shared(kernel, config)?;
    let mut launch = builder(stream, kernel);
    launch
        .arg(q)
        .arg(qg)
        .arg(k_cache)
        .arg(v_cache)
        .arg(o)
        .arg(partials);
    for d in &dims {
        launch.arg(d);
    }
    launch.arg(&scale);
    // SAFETY: arguments match the signature (dims tokens, pos0, heads, kv_heads, chunk); q and
    // o hold tokens x heads x HD floats and qg twice that, the caches pos0 + tokens positions
    // of kv_heads x HD (HD the kernel's specialization, T its KV type; the op entry checked
    // them). The launcher sized grid.x x (PREFILL_ROWS / group) ≥ tokens, grid.y = kv_heads,
    // and with grid.z > 1 splits partials to hold tokens x heads x grid.z x (HD + 2) floats
    // and grid.z x chunk to cover pos0 + tokens positions. The dynamic shared memory is the
    // kernel's `prefill_shared_floats` in bytes, within the limit set above (checked against
    // the device's opt-in maximum).
    launched(stream, "cuLaunchKernel(attention_prefill)", unsafe {
        launch.launch(config)
    })
}
