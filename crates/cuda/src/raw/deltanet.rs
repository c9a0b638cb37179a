//! Launches of the DeltaNet kernels (`deltanet.cu`: split, conv, prep, delta rule, the fused
//! step, gated norm). Each function pushes the arguments in the kernel's order and type; the
//! op entries in `layer_ops` checked every buffer length the grid implies, and the launchers
//! in `deltanet_launch` sized the grid and the dynamic shared memory.

use super::layers::{allow_shared, builder, launched, NO_POS};
use crate::error::CudaError;
use cudarc::driver::{
    CudaFunction, CudaStream, CudaView, CudaViewMut, LaunchConfig, PushKernelArg,
};

/// `deltanet_split_kernel(p, qkv, z, k_heads, dk, r, dv)`.
pub(crate) fn launch_deltanet_split(
    stream: &CudaStream,
    kernel: &CudaFunction,
    config: LaunchConfig,
    p: &CudaView<'_, f32>,
    qkv: &mut CudaViewMut<'_, f32>,
    z: &mut CudaViewMut<'_, f32>,
    dims: [i32; 4],
) -> Result<(), CudaError> {
    let mut launch = builder(stream, kernel);
    launch.arg(p).arg(qkv).arg(z);
    for d in &dims {
        launch.arg(d);
    }
    // SAFETY: arguments match the signature (k_heads, dk, r, dv); per token (grid.y) p holds
    // channels + inner values, qkv channels and z inner; threads past the row return.
    launched(stream, "cuLaunchKernel(deltanet_split)", unsafe {
        launch.launch(config)
    })
}

/// `conv_silu_kernel<KERNEL>` or `conv_silu_tokens_kernel<KERNEL>` (the same arguments:
/// qkv, state, w, channels, tokens).
pub(crate) fn launch_conv(
    stream: &CudaStream,
    kernel: &CudaFunction,
    config: LaunchConfig,
    qkv: &mut CudaViewMut<'_, f32>,
    state: &mut CudaViewMut<'_, f32>,
    w: &CudaView<'_, f32>,
    (channels, tokens): (i32, i32),
) -> Result<(), CudaError> {
    let mut launch = builder(stream, kernel);
    launch
        .arg(qkv)
        .arg(state)
        .arg(w)
        .arg(&channels)
        .arg(&tokens);
    // SAFETY: arguments match either signature; qkv holds tokens x channels, state
    // (KERNEL - 1) x channels and w channels x KERNEL values; threads past channels return
    // (the token-split kernel's after its barrier, reading nothing).
    launched(stream, "cuLaunchKernel(conv_silu)", unsafe {
        launch.launch(config)
    })
}

/// `deltanet_prep_kernel(qkv, ba, a, dt_bias, beta, g, channels, k_heads, v_heads, dk, eps,
/// q_scale)`.
#[allow(clippy::too_many_arguments)]
pub(crate) fn launch_deltanet_prep(
    stream: &CudaStream,
    kernel: &CudaFunction,
    config: LaunchConfig,
    qkv: &mut CudaViewMut<'_, f32>,
    ba: &CudaView<'_, f32>,
    a: &CudaView<'_, f32>,
    dt_bias: &CudaView<'_, f32>,
    beta: &mut CudaViewMut<'_, f32>,
    g: &mut CudaViewMut<'_, f32>,
    dims: [i32; 4],
    (eps, q_scale): (f32, f32),
) -> Result<(), CudaError> {
    let mut launch = builder(stream, kernel);
    launch.arg(qkv).arg(ba).arg(a).arg(dt_bias).arg(beta).arg(g);
    for d in &dims {
        launch.arg(d);
    }
    launch.arg(&eps).arg(&q_scale);
    // SAFETY: arguments match the signature (channels, k_heads, v_heads, dk); per token
    // (grid.x) qkv holds channels, ba 2 x v_heads, beta and g v_heads values; a and dt_bias
    // hold v_heads.
    launched(stream, "cuLaunchKernel(deltanet_prep)", unsafe {
        launch.launch(config)
    })
}

/// `delta_rule_kernel<DK, COLS>` or `delta_chunked_kernel<DK, CHUNK>` (the same arguments:
/// qkv, beta, g, state, out, tokens, k_heads, v_heads, dv); with dynamic shared memory (the
/// chunked kernel's) after raising the kernel's limit to the launch's.
#[allow(clippy::too_many_arguments)]
pub(crate) fn launch_delta_rule(
    stream: &CudaStream,
    kernel: &CudaFunction,
    config: LaunchConfig,
    qkv: &CudaView<'_, f32>,
    beta: &CudaView<'_, f32>,
    g: &CudaView<'_, f32>,
    state: &mut CudaViewMut<'_, f32>,
    out: &mut CudaViewMut<'_, f32>,
    dims: [i32; 4],
) -> Result<(), CudaError> {
    if config.shared_mem_bytes > 0 {
        allow_shared(kernel, config)?;
    }
    let mut launch = builder(stream, kernel);
    launch.arg(qkv).arg(beta).arg(g).arg(state).arg(out);
    for d in &dims {
        launch.arg(d);
    }
    // SAFETY: arguments match either signature (tokens, k_heads, v_heads, dv); qkv holds
    // tokens x channels, beta and g tokens x v_heads, state v_heads x DK x dv, out tokens x
    // v_heads x dv; grid (v_heads, dv / 32) stays inside them (the chunked kernel reads and
    // writes no row past the last token), and the chunked kernel's dynamic shared memory is
    // its `delta_chunked_shared_floats` (the launcher), within the limit set above.
    launched(stream, "cuLaunchKernel(delta_rule)", unsafe {
        launch.launch(config)
    })
}

/// What a several-row DeltaNet step keeps for a rollback, as the launch passes it: the conv
/// records and either the state after each row (`Rows`) or the state before the step and the
/// rows' delta-rule inputs (`Replay`).
pub(crate) enum StepKeeps<'a, 'b> {
    Rows(&'a mut CudaViewMut<'b, f32>, &'a mut CudaViewMut<'b, f32>),
    Replay(
        &'a mut CudaViewMut<'b, f32>,
        &'a mut CudaViewMut<'b, f32>,
        &'a mut CudaViewMut<'b, f32>,
    ),
}

/// `deltanet_step_kernel<DK, KERNEL, G>(qkv, z, ba, conv_w, conv_state, a, dt_bias, norm_w,
/// state, out, conv_rec, state_rec, snapshot, replay_rows, od, oq, tokens, k_heads, v_heads,
/// eps, q_scale)`; inputs are (qkv, z, ba, conv_w, a, dt_bias, norm_w).
#[allow(clippy::type_complexity)]
#[allow(clippy::too_many_arguments)]
pub(crate) fn launch_deltanet_step(
    stream: &CudaStream,
    kernel: &CudaFunction,
    config: LaunchConfig,
    inputs: [&CudaView<'_, f32>; 7],
    (conv_state, state, out): (
        &mut CudaViewMut<'_, f32>,
        &mut CudaViewMut<'_, f32>,
        &mut CudaViewMut<'_, f32>,
    ),
    record: Option<StepKeeps<'_, '_>>,
    out_q8: Option<(&mut CudaViewMut<'_, f32>, &mut CudaViewMut<'_, i8>)>,
    dims: [i32; 3],
    (eps, q_scale): (f32, f32),
) -> Result<(), CudaError> {
    let [qkv, z, ba, conv_w, a, dt_bias, norm_w] = inputs;
    let mut launch = builder(stream, kernel);
    launch.arg(qkv).arg(z).arg(ba).arg(conv_w).arg(conv_state);
    launch.arg(a).arg(dt_bias).arg(norm_w).arg(state).arg(out);
    match record {
        Some(StepKeeps::Rows(conv_rec, state_rec)) => launch
            .arg(conv_rec)
            .arg(state_rec)
            .arg(&NO_POS)
            .arg(&NO_POS),
        Some(StepKeeps::Replay(conv_rec, snapshot, rows)) => {
            launch.arg(conv_rec).arg(&NO_POS).arg(snapshot).arg(rows)
        }
        None => launch.arg(&NO_POS).arg(&NO_POS).arg(&NO_POS).arg(&NO_POS),
    };
    match out_q8 {
        Some((od, oq)) => launch.arg(od).arg(oq),
        None => launch.arg(&NO_POS).arg(&NO_POS),
    };
    for d in &dims {
        launch.arg(d);
    }
    launch.arg(&eps).arg(&q_scale);
    // SAFETY: arguments match the signature (tokens, k_heads, v_heads); the op entry checked
    // every length against the tokens of the shape (qkv tokens x channels, z and out tokens
    // x v_heads x DK, ba tokens x 2 v_heads, conv weights and state over all channels, state
    // v_heads x DK x DK, norm weight DK; the records, when given, tokens - 1 rows of the conv
    // state and of the state, or of the replay inputs beside a snapshot of the state), DK,
    // KERNEL and G are the specialization (any G covers every row), and grid k_heads x block
    // (v_heads / k_heads) x DK threads (≤ 256, the kernel's bound, checked) covers exactly
    // the heads. Null record pointers are the kernel's "no record". The Q8_K output,
    // when given, holds tokens x k_heads scales and tokens x v_heads x DK codes, and the
    // block holds 256 threads (op entry).
    launched(stream, "cuLaunchKernel(deltanet_step)", unsafe {
        launch.launch(config)
    })
}

/// `gated_norm_kernel<WARPS>(o, z, w, rows, dv, eps)`.
#[allow(clippy::too_many_arguments)]
pub(crate) fn launch_gated_norm(
    stream: &CudaStream,
    kernel: &CudaFunction,
    config: LaunchConfig,
    o: &mut CudaViewMut<'_, f32>,
    z: &CudaView<'_, f32>,
    w: &CudaView<'_, f32>,
    (rows, dv): (i32, i32),
    eps: f32,
) -> Result<(), CudaError> {
    let mut launch = builder(stream, kernel);
    launch.arg(o).arg(z).arg(w).arg(&rows).arg(&dv).arg(&eps);
    // SAFETY: arguments match the signature; o and z hold rows x dv values, w dv; warps past
    // `rows` return.
    launched(stream, "cuLaunchKernel(gated_norm)", unsafe {
        launch.launch(config)
    })
}
