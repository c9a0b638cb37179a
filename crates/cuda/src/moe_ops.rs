//! Op entries of the MoE kernels: routing, the expert gate/up (SwiGLU fused) and down (the
//! weighted sum fused) over stacks of experts, with the shared expert folded in where the
//! kernels allow; validate shapes and types, then hand over to `moe_launch`. Split from
//! `layer_ops` (same conventions: exact-length views, shapes outermost first).

use crate::device::Device;
use crate::error::{CudaError, CudaOp};
use crate::layer_launch::{self as launch, SHARED_MAX_BYTES};
use crate::layer_ops::{tokens_fit, MAX_GRID_YZ};
use crate::ops::{check_matrix, fits, shape, WeightMatrix};
use crate::q8_input::{q8_rows_fit, Q8Rows};
use cudarc::driver::{CudaView, CudaViewMut};

/// The shapes every expert gate/up launch relies on: `up` of `gate`'s type and shape, both
/// stacks of `n_expert` experts of `ff` rows; x `[tokens][cols]`, act `[tokens][used][ff]`.
pub(crate) fn check_gate_up(
    op: CudaOp,
    (gate, up): (&WeightMatrix<'_>, &WeightMatrix<'_>),
    (ff, n_expert): (usize, usize),
    (tokens, used): (usize, usize),
    (x_len, act_len): (usize, usize),
) -> Result<(), CudaError> {
    if up.ty != gate.ty {
        return Err(CudaError::UnsupportedType { op, ty: up.ty });
    }
    shape(op, "up rows", gate.rows, up.rows)?;
    shape(op, "up cols", gate.cols, up.cols)?;
    shape(op, "stack rows (experts x ff)", n_expert * ff, gate.rows)?;
    tokens_fit(op, tokens)?;
    shape(op, "x length (tokens x cols)", tokens * gate.cols, x_len)?;
    shape(
        op,
        "act length (tokens x used x ff)",
        tokens * used * ff,
        act_len,
    )
}

/// The experts and the picks per token of a routing of `tokens` tokens, from the lengths of
/// its `logits` (tokens x n_expert), `ids` and `weights` (tokens x used), checked: whole rows,
/// at most n_expert picks.
pub(crate) fn routing_sizes(
    op: CudaOp,
    tokens: usize,
    logits: usize,
    ids: usize,
    weights: usize,
) -> Result<(usize, usize), CudaError> {
    tokens_fit(op, tokens)?;
    let (n_expert, used) = (logits / tokens, ids / tokens);
    shape(
        op,
        "logits length (tokens x n_expert)",
        tokens * n_expert,
        logits,
    )?;
    shape(op, "ids length (tokens x used)", tokens * used, ids)?;
    shape(op, "weights length", ids, weights)?;
    fits(op, "experts used", used as u64, n_expert as u64)?;
    Ok((n_expert, used))
}

/// MoE routing per token: softmax of `logits` (tokens x n_expert), the `used` best experts
/// in descending order into `ids`, their renormalized probabilities into `weights` (both
/// tokens x used), and `shared_weight[t] = sigmoid(shared_logit[t])`.
pub fn moe_route(
    device: &Device,
    logits: &CudaView<'_, f32>,
    shared_logit: &CudaView<'_, f32>,
    ids: &mut CudaViewMut<'_, i32>,
    weights: &mut CudaViewMut<'_, f32>,
    shared_weight: &mut CudaViewMut<'_, f32>,
) -> Result<(), CudaError> {
    let op = CudaOp::MoeRoute;
    let tokens = shared_logit.len();
    let (n_expert, used) = routing_sizes(op, tokens, logits.len(), ids.len(), weights.len())?;
    shape(op, "shared_weight length", tokens, shared_weight.len())?;
    fits(
        op,
        "experts (shared memory bytes)",
        (n_expert * 4) as u64,
        SHARED_MAX_BYTES as u64,
    )?;
    launch::moe_route(
        device,
        logits,
        shared_logit,
        ids,
        weights,
        shared_weight,
        (tokens, n_expert, used),
    )
}

fn expert_stack(
    device: &Device,
    op: CudaOp,
    matrix: &WeightMatrix<'_>,
    rows_per_expert: usize,
) -> Result<(crate::WeightKind, usize), CudaError> {
    let (kind, _) = check_matrix(device, op, matrix)?;
    let n_expert = matrix.rows / rows_per_expert.max(1);
    shape(
        op,
        "stack rows (experts x rows per expert)",
        n_expert * rows_per_expert,
        matrix.rows,
    )?;
    Ok((kind, n_expert))
}

/// `act[t][k] = silu(gate_e · x[t]) ⊙ (up_e · x[t])` for `e = ids[t][k]`: gate and up are
/// stacks of experts of `ff` rows (the same block type); x is tokens x cols, ids tokens x
/// used, act tokens x used x ff. An id outside the stack gives zeros. `q8`: x also
/// quantized to Q8_K (`rms_norm_quantized`), read by the q8 kernel instead of quantizing x
/// in each CTA (the same bits).
#[allow(clippy::too_many_arguments)]
pub fn moe_gate_up(
    device: &Device,
    gate: &WeightMatrix<'_>,
    up: &WeightMatrix<'_>,
    ff: usize,
    ids: &CudaView<'_, i32>,
    (x, q8): (&CudaView<'_, f32>, Option<&Q8Rows<'_>>),
    act: &mut CudaViewMut<'_, f32>,
    shared: Option<SharedGateUp<'_, '_>>,
) -> Result<(), CudaError> {
    gate_up(device, (gate, up), ff, ids, (x, q8), act, shared, None)
}

/// [`moe_gate_up`], with an expert cache's copies in the launch when `copies` is given
/// (`crate::moe_gate_up_cached`, which checked them).
#[allow(clippy::too_many_arguments)]
pub(crate) fn gate_up(
    device: &Device,
    (gate, up): (&WeightMatrix<'_>, &WeightMatrix<'_>),
    ff: usize,
    ids: &CudaView<'_, i32>,
    (x, q8): (&CudaView<'_, f32>, Option<&Q8Rows<'_>>),
    act: &mut CudaViewMut<'_, f32>,
    shared: Option<SharedGateUp<'_, '_>>,
    copies: Option<launch::CachedCopies<'_, '_>>,
) -> Result<(), CudaError> {
    let op = CudaOp::MoeGateUp;
    let (kind, n_expert) = expert_stack(device, op, gate, ff)?;
    check_matrix(device, op, up)?;
    let cols = gate.cols;
    let tokens = x.len() / cols.max(1);
    tokens_fit(op, tokens)?;
    let used = ids.len() / tokens;
    fits(op, "experts per token", used as u64, MAX_GRID_YZ)?;
    shape(op, "ids length (tokens x used)", tokens * used, ids.len())?;
    let lengths = (x.len(), act.len());
    check_gate_up(op, (gate, up), (ff, n_expert), (tokens, used), lengths)?;
    fits(
        op,
        "cols (shared memory bytes)",
        (cols * 4) as u64,
        SHARED_MAX_BYTES as u64,
    )?;
    let shared = match shared {
        None => None,
        Some((s_gate, s_up, s_act)) => {
            folds_shared(op, gate, s_gate)?;
            folds_shared(op, gate, s_up)?;
            shape(op, "shared up rows", s_gate.rows, s_up.rows)?;
            shape(
                op,
                "shared act length (tokens x shared ff)",
                tokens * s_gate.rows,
                s_act.len(),
            )?;
            fits(op, "experts per token + 1", used as u64 + 1, MAX_GRID_YZ)?;
            Some((&s_gate.bytes, &s_up.bytes, s_act, s_gate.rows))
        }
    };
    if used == 0 || ff == 0 {
        return Ok(());
    }
    let q8 = q8_rows_fit(op, q8, tokens, cols)?;
    launch::moe_gate_up(
        device,
        kind,
        gate.dots,
        &gate.bytes,
        &up.bytes,
        ids,
        (x, q8),
        act,
        (ff, cols),
        (tokens, used, n_expert),
        shared,
        copies,
    )
}

/// The shared expert's gate and up (`[shared_ff][cols]`) and its SwiGLU output
/// (`[tokens][shared_ff]`), computed in the routed experts' launch.
pub type SharedGateUp<'a, 'b> = (
    &'a WeightMatrix<'b>,
    &'a WeightMatrix<'b>,
    &'a mut CudaViewMut<'b, f32>,
);

/// The shared expert's down (`[rows][shared_ff]`), its weight per token (`[tokens]`) and
/// its SwiGLU output (`[tokens][shared_ff]`), summed in the routed experts' launch.
pub type SharedDown<'a, 'b> = (
    &'a WeightMatrix<'b>,
    &'a CudaView<'b, f32>,
    &'a CudaView<'b, f32>,
);

/// Whether the routed experts' launches can take the shared expert `shared` along: the
/// version-3 or q8 kernels, the same block type, activation format and row length as
/// `routed`.
pub fn moe_folds_shared(routed: &WeightMatrix<'_>, shared: &WeightMatrix<'_>) -> bool {
    launch::moe_folds(routed.ty, routed.dots)
        && routed.ty == shared.ty
        && routed.dots == shared.dots
        && routed.cols == shared.cols
}

fn folds_shared(
    op: CudaOp,
    routed: &WeightMatrix<'_>,
    shared: &WeightMatrix<'_>,
) -> Result<(), CudaError> {
    if !moe_folds_shared(routed, shared) {
        return Err(CudaError::UnsupportedType { op, ty: shared.ty });
    }
    Ok(())
}

/// `out[t] (+)= Σ_k weights[t][k] · down_e · act[t][k]` for `e = ids[t][k]`: down is a stack of
/// experts of `rows` rows of ff values; act is tokens x used x ff, out tokens x rows. With
/// `accumulate` the sum is added to `out`, else it replaces it. `weights_fixed`: nothing
/// launched since the routing writes `ids` or the down rows (resident experts, not a cache
/// that the gate/up launch fills), so under PDL the kernel may load them before its wait.
#[allow(clippy::too_many_arguments)]
pub fn moe_down(
    device: &Device,
    down: &WeightMatrix<'_>,
    rows: usize,
    ids: &CudaView<'_, i32>,
    weights: &CudaView<'_, f32>,
    act: &CudaView<'_, f32>,
    out: &mut CudaViewMut<'_, f32>,
    accumulate: bool,
    shared: Option<SharedDown<'_, '_>>,
    weights_fixed: bool,
) -> Result<(), CudaError> {
    let op = CudaOp::MoeDown;
    let (kind, n_expert) = expert_stack(device, op, down, rows)?;
    let ff = down.cols;
    let tokens = out.len() / rows.max(1);
    tokens_fit(op, tokens)?;
    shape(op, "out length (tokens x rows)", tokens * rows, out.len())?;
    let used = ids.len() / tokens;
    shape(op, "ids length (tokens x used)", tokens * used, ids.len())?;
    shape(op, "weights length", ids.len(), weights.len())?;
    shape(
        op,
        "act length (tokens x used x ff)",
        tokens * used * ff,
        act.len(),
    )?;
    fits(
        op,
        "used x ff (shared memory bytes)",
        (used * ff * 4) as u64,
        SHARED_MAX_BYTES as u64,
    )?;
    let shared = match shared {
        None => None,
        Some((s_down, s_weight, s_act)) => {
            folds_shared(op, down, s_down)?;
            shape(op, "shared down rows", rows, s_down.rows)?;
            shape(op, "shared weight length", tokens, s_weight.len())?;
            shape(
                op,
                "shared act length (tokens x shared ff)",
                tokens * s_down.cols,
                s_act.len(),
            )?;
            Some((&s_down.bytes, s_weight, s_act, s_down.cols))
        }
    };
    launch::moe_down(
        device,
        kind,
        down.dots,
        &down.bytes,
        ids,
        weights,
        act,
        out,
        (rows, ff, accumulate),
        (tokens, used, n_expert),
        shared,
        weights_fixed,
    )
}
