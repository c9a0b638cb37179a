//! Launches of the MoE kernels (`moe.cu`): routing, and the expert gate/up and down in their
//! versions (with the shared expert folded in, and grouped by expert). Split from `layers.rs`;
//! the same helpers and contracts.

use super::expert_cache::{push_cached_copies, CachedCopyArgs};
use super::launcher::Launch;
use super::layers::{builder, launched, push_q8, Q8Arg, NO_POS};
use crate::error::CudaError;
use cudarc::driver::{
    CudaFunction, CudaStream, CudaView, CudaViewMut, LaunchConfig, PushKernelArg,
};

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

/// `moe_route_gate_kernel(logits, gate_w, x, ids, weights, shared_weight, cols, n_expert,
/// used)`, one CTA per token.
#[allow(clippy::too_many_arguments)]
pub(crate) fn launch_moe_route_gate(
    stream: &CudaStream,
    kernel: &CudaFunction,
    config: LaunchConfig,
    (logits, gate_w, x): (&CudaView<'_, f32>, &CudaView<'_, u8>, &CudaView<'_, f32>),
    ids: &mut CudaViewMut<'_, i32>,
    weights: &mut CudaViewMut<'_, f32>,
    shared_weight: &mut CudaViewMut<'_, f32>,
    (cols, n_expert, used): (i32, i32, i32),
) -> Result<(), CudaError> {
    let mut launch = builder(stream, kernel);
    launch.arg(logits).arg(gate_w).arg(x);
    launch.arg(ids).arg(weights).arg(shared_weight);
    launch.arg(&cols).arg(&n_expert).arg(&used);
    // SAFETY: arguments match the signature; per token (grid.x) logits hold n_expert values,
    // x cols, ids/weights `used` (≤ n_expert) and shared_weight one; the gate row holds cols
    // values in the kernel's block type and n_expert ≤ 32 x its PER (the op entry).
    launched(stream, "cuLaunchKernel(moe_route_gate)", unsafe {
        launch.launch(config)
    })
}

/// `router_topk_kernel(w, x, logits, ticket, ids, weights, shared_weight, cols, n_expert,
/// used)`, one CTA per router row (the gate row the last).
#[allow(clippy::too_many_arguments)]
pub(crate) fn launch_router_topk(
    stream: &CudaStream,
    kernel: &CudaFunction,
    config: LaunchConfig,
    (w, x): (&CudaView<'_, u8>, &CudaView<'_, f32>),
    logits: &mut CudaViewMut<'_, f32>,
    ticket: &mut CudaViewMut<'_, i32>,
    (ids, weights, shared_weight): (
        &mut CudaViewMut<'_, i32>,
        &mut CudaViewMut<'_, f32>,
        &mut CudaViewMut<'_, f32>,
    ),
    (cols, n_expert, used): (i32, i32, i32),
) -> Result<(), CudaError> {
    let mut launch = builder(stream, kernel);
    launch
        .arg(w)
        .arg(x)
        .arg(logits)
        .arg(ticket)
        .arg(ids)
        .arg(weights)
        .arg(shared_weight)
        .arg(&cols)
        .arg(&n_expert)
        .arg(&used);
    // SAFETY: arguments match the signature; w holds n_expert + 1 F32 rows of cols (a
    // multiple of 4, 16-byte aligned rows: the experts', then the gate's), x cols values,
    // logits n_expert + 1 (= grid.x), ticket one (zero between launches), ids/weights `used`
    // (≤ n_expert ≤ 32 x PER), shared_weight one.
    launched(stream, "cuLaunchKernel(router_topk)", unsafe {
        launch.launch(config)
    })
}

/// `moe_route_skew_kernel(logits, ids, tokens, n_expert, used, seed, stride, offset, decay)`,
/// one thread per token.
#[allow(clippy::too_many_arguments)]
pub(crate) fn launch_moe_route_skew(
    stream: &CudaStream,
    kernel: &CudaFunction,
    config: LaunchConfig,
    logits: &CudaView<'_, f32>,
    ids: &mut CudaViewMut<'_, i32>,
    (tokens, n_expert, used): (i32, i32, i32),
    (seed, stride, offset): (u32, u32, u32),
    decay: f32,
) -> Result<(), CudaError> {
    let mut launch = builder(stream, kernel);
    launch
        .arg(logits)
        .arg(ids)
        .arg(&tokens)
        .arg(&n_expert)
        .arg(&used)
        .arg(&seed)
        .arg(&stride)
        .arg(&offset)
        .arg(&decay);
    // SAFETY: arguments match the signature; logits hold tokens x n_expert values (n_expert
    // >= 1), ids tokens x used (used <= n_expert, so the search for a free rank ends), and
    // the grid covers `tokens` threads (the rest return).
    launched(stream, "cuLaunchKernel(moe_route_skew)", unsafe {
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
fn push_shared_up<'a>(launch: &mut Launch<'a>, shared: Option<SharedUpArgs<'a, '_>>) -> i32 {
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
/// shared_gate, shared_up, act_shared, shared_ff)`, and `moe_gate_up_q8_kernel<B, WARPS, LANES,
/// ROWS>` of the same signature with `gd, gq` after x (`Q8Arg::Absent` for version 3); null
/// shared pointers without `shared`.
#[allow(clippy::type_complexity, clippy::too_many_arguments)]
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
    q8: Q8Arg<'_, '_>,
    act: &mut CudaViewMut<'_, f32>,
    (ff, cols, used, n_expert): (i32, i32, i32, i32),
    shared: Option<SharedUpArgs<'_, '_>>,
    copies: Option<(CachedCopyArgs<'_, '_>, (i32, i32))>,
) -> Result<(), CudaError> {
    let mut launch = builder(stream, kernel);
    launch.arg(gate).arg(up).arg(ids).arg(x);
    push_q8(&mut launch, q8);
    launch.arg(act);
    launch.arg(&ff).arg(&cols).arg(&used).arg(&n_expert);
    let shared_ff = push_shared_up(&mut launch, shared);
    launch.arg(&shared_ff);
    let mut copies = copies;
    if let Some((copies, grid)) = copies.as_mut() {
        push_cached_copies(&mut launch, copies, grid);
    }
    // SAFETY: arguments match the signature; gate and up hold n_expert x ff rows of `cols`,
    // ids tokens x used (ids out of range are skipped by the kernel), x tokens x cols, act
    // tokens x used x ff (op entry). Grid.y is used + 1 only with `shared`, whose gate and
    // up hold shared_ff rows of `cols` in the same block type and act_shared tokens x
    // shared_ff (op entry); without it grid.y = used and the null pointers are never read.
    // With `copies` (moe_gate_up_q8_cached_kernel, one token): the copies' arguments are
    // expert_cache_fill_kernel's, checked the same way (`check_fills`): live mapped host
    // allocations of n_expert experts, slot stacks (gate and up above, written through
    // shared borrows as the fill kernel does: the device's one stream serializes a layer's
    // calls) of at least max_fills experts, fills of 2 x max_fills entries from the lookup;
    // grid.x is max_fills x (2 x gate_chunks + down_chunks) + grid_x x grid_y CTAs, as the
    // kernel recomputes for its tickets; the ticket is zero (its last CTA resets it) and
    // ready[max_fills] zeroed by the lookup queued before.
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

/// `moe_combine_kernel(y, weights, out, rows, used)`.
pub(crate) fn launch_moe_combine(
    stream: &CudaStream,
    kernel: &CudaFunction,
    config: LaunchConfig,
    y: &CudaView<'_, f32>,
    weights: &CudaView<'_, f32>,
    out: &mut CudaViewMut<'_, f32>,
    (rows, used): (i32, i32),
) -> Result<(), CudaError> {
    let mut launch = builder(stream, kernel);
    launch.arg(y).arg(weights).arg(out).arg(&rows).arg(&used);
    // SAFETY: arguments match the signature; for grid.y tokens, y holds tokens x used x rows
    // values, weights tokens x used and out tokens x rows (the op entry); threads past `rows`
    // return.
    launched(stream, "cuLaunchKernel(moe_combine)", unsafe {
        launch.launch(config)
    })
}
