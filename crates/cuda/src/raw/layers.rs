//! Launches of the layer kernels (`elementwise.cu`, `matmul.cu`, `moe.cu`, `deltanet.cu`,
//! `attention.cu`). Each function pushes the arguments in the kernel's order and type; the
//! op entries in `layer_ops` checked every buffer length the grid implies, and the
//! launchers in `layer_launch` sized the grid and the dynamic shared memory.

use crate::error::CudaError;
use crate::profile;
use cudarc::driver::{
    CudaFunction, CudaStream, CudaView, CudaViewMut, DeviceRepr, LaunchArgs, LaunchConfig,
    PushKernelArg,
};

fn launched(
    stream: &CudaStream,
    call: &'static str,
    result: Result<
        Option<(cudarc::driver::CudaEvent, cudarc::driver::CudaEvent)>,
        cudarc::driver::DriverError,
    >,
) -> Result<(), CudaError> {
    profile::after(stream, call);
    result.map(|_| ()).map_err(CudaError::driver(call))
}

fn builder<'a>(stream: &'a CudaStream, kernel: &'a CudaFunction) -> LaunchArgs<'a> {
    profile::before(stream);
    stream.launch_builder(kernel)
}

/// The null device pointer kernels take for "no position in device memory".
static NO_POS: u64 = 0;

/// Pushes the `const u32* pos_dev` argument: the device scalar, or null.
fn push_pos<'a>(launch: &mut LaunchArgs<'a>, pos: Option<&'a CudaView<'_, u32>>) {
    match pos {
        Some(view) => launch.arg(view),
        None => launch.arg(&NO_POS),
    };
}

/// `embed_kernel<B>(table, tokens, x, rows, cols)`.
pub(crate) fn launch_embed(
    stream: &CudaStream,
    kernel: &CudaFunction,
    config: LaunchConfig,
    table: &CudaView<'_, u8>,
    tokens: &CudaView<'_, u32>,
    x: &mut CudaViewMut<'_, f32>,
    (rows, cols): (i32, i32),
) -> Result<(), CudaError> {
    let mut launch = builder(stream, kernel);
    launch.arg(table).arg(tokens).arg(x).arg(&rows).arg(&cols);
    // SAFETY: arguments match the signature; the op entry checked table = rows x cols whole
    // blocks and x = tokens x cols; ids past `rows` are zero-filled by the kernel.
    launched(stream, "cuLaunchKernel(embed)", unsafe {
        launch.launch(config)
    })
}

/// `rms_norm_kernel(x, w, out, cols, eps)`, one CTA per row.
#[allow(clippy::too_many_arguments)]
pub(crate) fn launch_rms_norm(
    stream: &CudaStream,
    kernel: &CudaFunction,
    config: LaunchConfig,
    x: &CudaView<'_, f32>,
    w: &CudaView<'_, f32>,
    out: &mut CudaViewMut<'_, f32>,
    cols: i32,
    eps: f32,
) -> Result<(), CudaError> {
    let mut launch = builder(stream, kernel);
    launch.arg(x).arg(w).arg(out).arg(&cols).arg(&eps);
    // SAFETY: arguments match the signature; x and out hold grid.x rows of `cols`, w `cols`.
    launched(stream, "cuLaunchKernel(rms_norm)", unsafe {
        launch.launch(config)
    })
}

/// `add_rms_norm_kernel(x, y, w, out, cols, eps)`.
#[allow(clippy::too_many_arguments)]
pub(crate) fn launch_add_rms_norm(
    stream: &CudaStream,
    kernel: &CudaFunction,
    config: LaunchConfig,
    x: &mut CudaViewMut<'_, f32>,
    y: &CudaView<'_, f32>,
    w: &CudaView<'_, f32>,
    out: &mut CudaViewMut<'_, f32>,
    cols: i32,
    eps: f32,
) -> Result<(), CudaError> {
    let mut launch = builder(stream, kernel);
    launch.arg(x).arg(y).arg(w).arg(out).arg(&cols).arg(&eps);
    // SAFETY: arguments match the signature; x, y and out hold grid.x rows of `cols`, w
    // `cols`; out is a separate buffer (a mutable borrow distinct from x's).
    launched(stream, "cuLaunchKernel(add_rms_norm)", unsafe {
        launch.launch(config)
    })
}

/// `add_kernel(x, y, n)`.
pub(crate) fn launch_add(
    stream: &CudaStream,
    kernel: &CudaFunction,
    config: LaunchConfig,
    x: &mut CudaViewMut<'_, f32>,
    y: &CudaView<'_, f32>,
    n: i32,
) -> Result<(), CudaError> {
    let mut launch = builder(stream, kernel);
    launch.arg(x).arg(y).arg(&n);
    // SAFETY: arguments match the signature; x and y hold n values; threads past n return.
    launched(stream, "cuLaunchKernel(add)", unsafe {
        launch.launch(config)
    })
}

/// `matmul_kernel<B, WARPS, X_SHARED>(weights, x, y, rows, cols)`, grid.y = tokens.
pub(crate) fn launch_matmul(
    stream: &CudaStream,
    kernel: &CudaFunction,
    config: LaunchConfig,
    weights: &CudaView<'_, u8>,
    x: &CudaView<'_, f32>,
    y: &mut CudaViewMut<'_, f32>,
    (rows, cols): (i32, i32),
) -> Result<(), CudaError> {
    let mut launch = builder(stream, kernel);
    launch.arg(weights).arg(x).arg(y).arg(&rows).arg(&cols);
    // SAFETY: arguments match the signature; weights hold rows x cols whole blocks, x holds
    // grid.y x cols and y grid.y x rows values; X_SHARED kernels get cols * 4 shared bytes.
    launched(stream, "cuLaunchKernel(matmul)", unsafe {
        launch.launch(config)
    })
}

/// `matmul_q8_tiles_kernel<B, WARPS, ROWS, NT>(weights, x, y, rows, cols, tokens)`.
pub(crate) fn launch_matmul_tiles(
    stream: &CudaStream,
    kernel: &CudaFunction,
    config: LaunchConfig,
    weights: &CudaView<'_, u8>,
    x: &CudaView<'_, f32>,
    y: &mut CudaViewMut<'_, f32>,
    (rows, cols, tokens): (i32, i32, i32),
) -> Result<(), CudaError> {
    let mut launch = builder(stream, kernel);
    launch
        .arg(weights)
        .arg(x)
        .arg(y)
        .arg(&rows)
        .arg(&cols)
        .arg(&tokens);
    // SAFETY: arguments match the signature; weights hold rows x cols whole blocks, x holds
    // tokens x cols and y tokens x rows values (op entry); grid.y = ceil(tokens / NT) and
    // the last tile reads and writes only its tokens; the shared bytes hold NT x cols codes
    // and their scales (launcher).
    launched(stream, "cuLaunchKernel(matmul_tiles)", unsafe {
        launch.launch(config)
    })
}

/// `moe_route_kernel(logits, shared_logit, ids, weights, shared_weight, n_expert, used)`.
#[allow(clippy::too_many_arguments)]
pub(crate) fn launch_moe_route(
    stream: &CudaStream,
    kernel: &CudaFunction,
    config: LaunchConfig,
    logits: &CudaView<'_, f32>,
    shared_logit: &CudaView<'_, f32>,
    ids: &mut CudaViewMut<'_, i32>,
    weights: &mut CudaViewMut<'_, f32>,
    shared_weight: &mut CudaViewMut<'_, f32>,
    (n_expert, used): (i32, i32),
) -> Result<(), CudaError> {
    let mut launch = builder(stream, kernel);
    launch
        .arg(logits)
        .arg(shared_logit)
        .arg(ids)
        .arg(weights)
        .arg(shared_weight)
        .arg(&n_expert)
        .arg(&used);
    // SAFETY: arguments match the signature; per token (grid.x) logits hold n_expert values,
    // ids/weights `used` (≤ n_expert) and shared_logit/shared_weight one; version 1 gets
    // n_expert * 4 bytes of dynamic shared memory, version 2 (registers) runs only when
    // n_expert ≤ 32 x its PER (the launcher).
    launched(stream, "cuLaunchKernel(moe_route)", unsafe {
        launch.launch(config)
    })
}

/// `moe_gate_up_kernel<B, WARPS>(gate, up, ids, x, act, ff, cols, used, n_expert)`.
#[allow(clippy::too_many_arguments)]
pub(crate) fn launch_moe_gate_up(
    stream: &CudaStream,
    kernel: &CudaFunction,
    config: LaunchConfig,
    gate: &CudaView<'_, u8>,
    up: &CudaView<'_, u8>,
    ids: &CudaView<'_, i32>,
    x: &CudaView<'_, f32>,
    act: &mut CudaViewMut<'_, f32>,
    (ff, cols, used, n_expert): (i32, i32, i32, i32),
) -> Result<(), CudaError> {
    let mut launch = builder(stream, kernel);
    launch
        .arg(gate)
        .arg(up)
        .arg(ids)
        .arg(x)
        .arg(act)
        .arg(&ff)
        .arg(&cols)
        .arg(&used)
        .arg(&n_expert);
    // SAFETY: arguments match the signature; gate and up hold n_expert x ff rows of `cols`,
    // ids tokens x used (ids out of range are skipped by the kernel), x tokens x cols, act
    // tokens x used x ff; versions 1 and 2 get cols * 4 bytes of dynamic shared memory
    // (version 3 stages nothing).
    launched(stream, "cuLaunchKernel(moe_gate_up)", unsafe {
        launch.launch(config)
    })
}

/// `moe_down_kernel<B, WARPS>(down, ids, weights, act, out, rows, ff, used, n_expert, accumulate)`.
#[allow(clippy::too_many_arguments)]
pub(crate) fn launch_moe_down(
    stream: &CudaStream,
    kernel: &CudaFunction,
    config: LaunchConfig,
    down: &CudaView<'_, u8>,
    ids: &CudaView<'_, i32>,
    weights: &CudaView<'_, f32>,
    act: &CudaView<'_, f32>,
    out: &mut CudaViewMut<'_, f32>,
    (rows, ff, used, n_expert, accumulate): (i32, i32, i32, i32, i32),
) -> Result<(), CudaError> {
    let mut launch = builder(stream, kernel);
    launch
        .arg(down)
        .arg(ids)
        .arg(weights)
        .arg(act)
        .arg(out)
        .arg(&rows)
        .arg(&ff)
        .arg(&used)
        .arg(&n_expert)
        .arg(&accumulate);
    // SAFETY: arguments match the signature; down holds n_expert x rows rows of `ff`, ids and
    // weights tokens x used, act tokens x used x ff, out tokens x rows; versions 1 and 2
    // get used * ff * 4 bytes of dynamic shared memory (version 3 stages nothing).
    launched(stream, "cuLaunchKernel(moe_down)", unsafe {
        launch.launch(config)
    })
}

/// The shared expert's gate, up, SwiGLU output and ff, for the version-3 gate/up launch.
pub(crate) type SharedUpArgs<'a, 'b> = (
    &'a CudaView<'b, u8>,
    &'a CudaView<'b, u8>,
    &'a mut CudaViewMut<'b, f32>,
    usize,
);

/// The shared expert's down, weight per token, SwiGLU output and ff, for version-3 down.
pub(crate) type SharedDownArgs<'a, 'b> = (
    &'a CudaView<'b, u8>,
    &'a CudaView<'b, f32>,
    &'a CudaView<'b, f32>,
    usize,
);

/// Pushes the gate/up kernels' `shared_gate, shared_up, act_shared` (the shared expert's, or
/// null pointers) and returns their `shared_ff` (0 without), for the caller to push last.
fn push_shared_up<'a>(launch: &mut LaunchArgs<'a>, shared: Option<SharedUpArgs<'a, '_>>) -> i32 {
    let shared_ff = i32::try_from(shared.as_ref().map_or(0, |s| s.3)).unwrap_or(i32::MAX);
    match shared {
        Some((s_gate, s_up, s_act, _)) => {
            launch.arg(s_gate).arg(s_up).arg(s_act);
        }
        None => {
            launch.arg(&NO_POS).arg(&NO_POS).arg(&NO_POS);
        }
    }
    shared_ff
}

/// `moe_gate_up_v3_kernel<B, WARPS>(gate, up, ids, x, act, ff, cols, used, n_expert,
/// shared_gate, shared_up, act_shared, shared_ff)`, and `moe_gate_up_q8_kernel<B, WARPS, LANES>`
/// of the same signature; null shared pointers without `shared`.
#[allow(clippy::type_complexity)]
pub(crate) fn launch_moe_gate_up_v3(
    stream: &CudaStream,
    kernel: &CudaFunction,
    config: LaunchConfig,
    (gate, up, ids, x): (
        &CudaView<'_, u8>,
        &CudaView<'_, u8>,
        &CudaView<'_, i32>,
        &CudaView<'_, f32>,
    ),
    act: &mut CudaViewMut<'_, f32>,
    (ff, cols, used, n_expert): (i32, i32, i32, i32),
    shared: Option<SharedUpArgs<'_, '_>>,
) -> Result<(), CudaError> {
    let mut launch = builder(stream, kernel);
    launch.arg(gate).arg(up).arg(ids).arg(x).arg(act);
    launch.arg(&ff).arg(&cols).arg(&used).arg(&n_expert);
    let shared_ff = push_shared_up(&mut launch, shared);
    launch.arg(&shared_ff);
    // SAFETY: arguments match the signature; gate and up hold n_expert x ff rows of `cols`,
    // ids tokens x used (ids out of range are skipped by the kernel), x tokens x cols, act
    // tokens x used x ff (op entry). Grid.y is used + 1 only with `shared`, whose gate and
    // up hold shared_ff rows of `cols` in the same block type and act_shared tokens x
    // shared_ff (op entry); without it grid.y = used and the null pointers are never read.
    launched(stream, "cuLaunchKernel(moe_gate_up_v3)", unsafe {
        launch.launch(config)
    })
}

/// `moe_gate_up_q8_grouped_kernel<B, WARPS, LANES, NT>(gate, up, tile_expert, tile_pairs, x,
/// act, ff, cols, used, shared_gate, shared_up, act_shared, shared_ff)`; null shared pointers
/// without `shared`.
#[allow(clippy::type_complexity)]
pub(crate) fn launch_moe_gate_up_grouped(
    stream: &CudaStream,
    kernel: &CudaFunction,
    config: LaunchConfig,
    (gate, up, experts, pairs, x): (
        &CudaView<'_, u8>,
        &CudaView<'_, u8>,
        &CudaView<'_, i32>,
        &CudaView<'_, i32>,
        &CudaView<'_, f32>,
    ),
    act: &mut CudaViewMut<'_, f32>,
    (ff, cols, used): (i32, i32, i32),
    shared: Option<SharedUpArgs<'_, '_>>,
) -> Result<(), CudaError> {
    let mut launch = builder(stream, kernel);
    launch
        .arg(gate)
        .arg(up)
        .arg(experts)
        .arg(pairs)
        .arg(x)
        .arg(act);
    launch.arg(&ff).arg(&cols).arg(&used);
    let shared_ff = push_shared_up(&mut launch, shared);
    launch.arg(&shared_ff);
    // SAFETY: arguments match the signature. The tiles come from `ExpertTiles::new`: every
    // expert is below the stack's count (gate and up hold n_expert x ff rows of `cols`) or
    // -1 with `shared` (shared_ff rows, act_shared tokens x shared_ff), every pair below
    // tokens x used (act holds tokens x used x ff, x tokens x cols), GROUP_TILE per tile
    // (grid.y = tiles); the op entry checked the lengths. Without `shared` no tile is -1,
    // so the null pointers are never read.
    launched(stream, "cuLaunchKernel(moe_gate_up_grouped)", unsafe {
        launch.launch(config)
    })
}

/// `moe_down_v3_kernel<B, WARPS>(down, ids, weights, act, out, rows, ff, used, n_expert,
/// accumulate, shared_down, shared_weight, act_shared, shared_ff)`, and
/// `moe_down_q8_kernel<B, WARPS, LANES>` of the same signature; null shared pointers without
/// `shared`.
#[allow(clippy::type_complexity)]
pub(crate) fn launch_moe_down_v3(
    stream: &CudaStream,
    kernel: &CudaFunction,
    config: LaunchConfig,
    (down, ids, weights, act): (
        &CudaView<'_, u8>,
        &CudaView<'_, i32>,
        &CudaView<'_, f32>,
        &CudaView<'_, f32>,
    ),
    out: &mut CudaViewMut<'_, f32>,
    (rows, ff, used, n_expert, accumulate): (i32, i32, i32, i32, i32),
    shared: Option<SharedDownArgs<'_, '_>>,
) -> Result<(), CudaError> {
    let mut launch = builder(stream, kernel);
    launch.arg(down).arg(ids).arg(weights).arg(act).arg(out);
    launch
        .arg(&rows)
        .arg(&ff)
        .arg(&used)
        .arg(&n_expert)
        .arg(&accumulate);
    let shared_ff = i32::try_from(shared.as_ref().map_or(0, |s| s.3)).unwrap_or(i32::MAX);
    match shared {
        Some((s_down, s_weight, s_act, _)) => {
            launch.arg(s_down).arg(s_weight).arg(s_act);
        }
        None => {
            launch.arg(&NO_POS).arg(&NO_POS).arg(&NO_POS);
        }
    }
    launch.arg(&shared_ff);
    // SAFETY: arguments match the signature; down holds n_expert x rows rows of `ff`, ids and
    // weights tokens x used, act tokens x used x ff, out tokens x rows (op entry); with
    // `shared`, its down holds rows rows of shared_ff in the same block type, its weight
    // tokens values and act_shared tokens x shared_ff (op entry); without it the kernel
    // never reads the null pointers (shared_down == null adds no items).
    launched(stream, "cuLaunchKernel(moe_down_v3)", unsafe {
        launch.launch(config)
    })
}

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

/// `conv_silu_kernel<KERNEL>(qkv, state, w, channels, tokens)`.
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
    // SAFETY: arguments match the signature; qkv holds tokens x channels, state
    // (KERNEL - 1) x channels and w channels x KERNEL values; threads past channels return.
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

/// `delta_rule_kernel<DK, COLS>(qkv, beta, g, state, out, tokens, k_heads, v_heads, dv)`.
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
    let mut launch = builder(stream, kernel);
    launch.arg(qkv).arg(beta).arg(g).arg(state).arg(out);
    for d in &dims {
        launch.arg(d);
    }
    // SAFETY: arguments match the signature (tokens, k_heads, v_heads, dv); qkv holds tokens
    // x channels, beta and g tokens x v_heads, state v_heads x DK x dv, out tokens x v_heads
    // x dv; grid (v_heads, dv / COLS) stays inside them.
    launched(stream, "cuLaunchKernel(delta_rule)", unsafe {
        launch.launch(config)
    })
}

/// `deltanet_step_kernel<DK, KERNEL>(qkv, z, ba, conv_w, conv_state, a, dt_bias, norm_w,
/// state, out, k_heads, v_heads, eps, q_scale)`; inputs are (qkv, z, ba, conv_w, a, dt_bias,
/// norm_w).
#[allow(clippy::type_complexity)]
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
    dims: [i32; 2],
    (eps, q_scale): (f32, f32),
) -> Result<(), CudaError> {
    let [qkv, z, ba, conv_w, a, dt_bias, norm_w] = inputs;
    let mut launch = builder(stream, kernel);
    launch.arg(qkv).arg(z).arg(ba).arg(conv_w).arg(conv_state);
    launch.arg(a).arg(dt_bias).arg(norm_w).arg(state).arg(out);
    for d in &dims {
        launch.arg(d);
    }
    launch.arg(&eps).arg(&q_scale);
    // SAFETY: arguments match the signature (k_heads, v_heads); the op entry checked every
    // length against one token of the shape (qkv, conv weights and state over all channels,
    // z and out v_heads x DK, ba 2 v_heads, state v_heads x DK x DK, norm weight DK), DK and
    // KERNEL are the specialization, and grid k_heads x block (v_heads / k_heads) x DK
    // threads (≤ 256, the kernel's bound, checked) covers exactly the heads.
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

/// The f32 arguments of `attn_prep_kernel` after its integer ones.
pub(crate) struct RopeArgs {
    pub rope_base: f32,
    pub eps: f32,
}

/// `attn_prep_kernel<KV>(qg, k, v, q_norm, k_norm, q, k_cache, v_cache, pos_dev, pos0,
/// heads, kv_heads, hd, rope_dim, rope_base, eps)`; `pos` (a u32 in device memory, read by
/// the kernel in place of pos0) is for one-token batches whose position the caller checked.
#[allow(clippy::too_many_arguments)]
pub(crate) fn launch_attn_prep<T: DeviceRepr>(
    stream: &CudaStream,
    kernel: &CudaFunction,
    config: LaunchConfig,
    inputs: [&CudaView<'_, f32>; 5],
    q: &mut CudaViewMut<'_, f32>,
    k_cache: &mut CudaViewMut<'_, T>,
    v_cache: &mut CudaViewMut<'_, T>,
    pos: Option<&CudaView<'_, u32>>,
    dims: [i32; 5],
    rope: RopeArgs,
) -> Result<(), CudaError> {
    let mut launch = builder(stream, kernel);
    for input in inputs {
        launch.arg(input);
    }
    launch.arg(q).arg(k_cache).arg(v_cache);
    push_pos(&mut launch, pos);
    for d in &dims {
        launch.arg(d);
    }
    launch.arg(&rope.rope_base).arg(&rope.eps);
    // SAFETY: arguments match the signature (inputs qg, k, v, q_norm, k_norm; dims pos0,
    // heads, kv_heads, hd, rope_dim); the op entry checked every input for grid.x tokens and
    // that the caches hold positions pos0 + tokens; T is the kernel's KV type; the CTA has
    // hd * 4 bytes of dynamic shared memory.
    launched(stream, "cuLaunchKernel(attn_prep)", unsafe {
        launch.launch(config)
    })
}

/// `attention_kernel<KV, VPL, WARPS>(q, qg, k_cache, v_cache, o, pos_dev, pos0, heads,
/// kv_heads, scale)`.
#[allow(clippy::too_many_arguments)]
pub(crate) fn launch_attention<T: DeviceRepr>(
    stream: &CudaStream,
    kernel: &CudaFunction,
    config: LaunchConfig,
    q: &CudaView<'_, f32>,
    qg: &CudaView<'_, f32>,
    k_cache: &CudaView<'_, T>,
    v_cache: &CudaView<'_, T>,
    o: &mut CudaViewMut<'_, f32>,
    pos: Option<&CudaView<'_, u32>>,
    dims: [i32; 3],
    scale: f32,
) -> Result<(), CudaError> {
    let mut launch = builder(stream, kernel);
    launch.arg(q).arg(qg).arg(k_cache).arg(v_cache).arg(o);
    push_pos(&mut launch, pos);
    for d in &dims {
        launch.arg(d);
    }
    launch.arg(&scale);
    // SAFETY: arguments match the signature (dims pos0, heads, kv_heads); q and o hold tokens
    // x heads x hd, qg twice that; the caches hold pos0 + tokens positions of kv_heads x hd
    // (hd = 32 VPL, the kernel's specialization); T is the kernel's KV type.
    launched(stream, "cuLaunchKernel(attention)", unsafe {
        launch.launch(config)
    })
}

/// `attention_split_kernel<KV, VPL, WARPS>(q, k_cache, v_cache, partials, pos_dev, pos0,
/// heads, kv_heads, chunk, min_chunk, scale)`.
#[allow(clippy::too_many_arguments)]
pub(crate) fn launch_attention_split<T: DeviceRepr>(
    stream: &CudaStream,
    kernel: &CudaFunction,
    config: LaunchConfig,
    (q, k_cache, v_cache): (&CudaView<'_, f32>, &CudaView<'_, T>, &CudaView<'_, T>),
    partials: &mut CudaViewMut<'_, f32>,
    pos: Option<&CudaView<'_, u32>>,
    dims: [i32; 5],
    scale: f32,
) -> Result<(), CudaError> {
    let mut launch = builder(stream, kernel);
    launch.arg(q).arg(k_cache).arg(v_cache).arg(partials);
    push_pos(&mut launch, pos);
    for d in &dims {
        launch.arg(d);
    }
    launch.arg(&scale);
    // SAFETY: arguments match the signature (dims pos0, heads, kv_heads, chunk, min_chunk);
    // q holds tokens x heads x hd, the caches pos0 + tokens positions of kv_heads x hd
    // (hd = 32 VPL, the kernel's specialization; the op entry checked them, and for a
    // device position the caller checked it against the capacity); the launcher sized
    // grid.z (splits) so that partials holds tokens x heads x splits x (hd + 2) floats and
    // splits x chunk covers pos0 + tokens positions (chunk 0: the kernel derives it so that
    // it does); T is the kernel's KV type.
    launched(stream, "cuLaunchKernel(attention_split)", unsafe {
        launch.launch(config)
    })
}

/// `attention_combine_kernel(partials, qg, o, heads, hd, splits)`.
pub(crate) fn launch_attention_combine(
    stream: &CudaStream,
    kernel: &CudaFunction,
    config: LaunchConfig,
    partials: &CudaView<'_, f32>,
    qg: &CudaView<'_, f32>,
    o: &mut CudaViewMut<'_, f32>,
    dims: [i32; 3],
) -> Result<(), CudaError> {
    let mut launch = builder(stream, kernel);
    launch.arg(partials).arg(qg).arg(o);
    for d in &dims {
        launch.arg(d);
    }
    // SAFETY: arguments match the signature (dims heads, hd, splits); partials holds grid.x
    // tokens x heads x splits x (hd + 2) floats written by the split kernel before it on the
    // stream; qg holds tokens x heads x 2 hd and o tokens x heads x hd (op entry).
    launched(stream, "cuLaunchKernel(attention_combine)", unsafe {
        launch.launch(config)
    })
}
