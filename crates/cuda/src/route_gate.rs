//! The routing of a batch of decode size with the shared expert's gate row in the same
//! launch (`moe_route_gate_kernel`, `moe_route.cu`): the row's dot, summed as the split-K
//! matmul sums it, runs beside the routing instead of as a one-CTA launch of its own before
//! it, so the bits are those of `matmul` then `moe_route`. `REDLITE_ROUTE_GATE=0` keeps the
//! two launches.

use std::sync::OnceLock;

use cudarc::driver::{CudaView, CudaViewMut};
use redlite_gguf::GgmlType;

use crate::device::Device;
use crate::error::{CudaError, CudaOp};
use crate::layer_launch::{config, to_i32};
use crate::matmul_launch::{matvec_v1, split_k};
use crate::moe_ops::routing_sizes;
use crate::ops::{check_matrix, shape, WeightMatrix};
use crate::raw;
use crate::source::{
    self, MATMUL_SPLITK_WARPS, ONE_TOKEN_KERNELS_MAX_TOKENS, ROUTE_V2_PER_LANE, WIDE_F16, WIDE_F32,
};

/// The wide block `matmul` reads `gate` with on its split-K path, where [`moe_route_gate`]
/// takes it for `tokens` tokens routing among `n_expert`: the switches are on, the batch has
/// decode size (whose products are split-K, a token per CTA), the gate is one F32 or F16
/// row in whole wide blocks and the experts fit the routing's registers.
fn gate_block(gate: &WeightMatrix<'_>, tokens: usize, n_expert: usize) -> Option<&'static str> {
    static ON: OnceLock<bool> = OnceLock::new();
    static V1: OnceLock<bool> = OnceLock::new();
    let on = *ON.get_or_init(|| std::env::var("REDLITE_ROUTE_GATE").as_deref() != Ok("0"));
    let v1 = *V1.get_or_init(|| std::env::var("REDLITE_ROUTE_V1").as_deref() == Ok("1"));
    if !on || v1 || !split_k() || matvec_v1() || gate.rows != 1 {
        return None;
    }
    if !(1..=ONE_TOKEN_KERNELS_MAX_TOKENS).contains(&tokens)
        || n_expert == 0
        || n_expert > 32 * ROUTE_V2_PER_LANE
    {
        return None;
    }
    wide_float_block(gate)
}

/// The wide block the split-K matmul reads a float matrix with (F32 or F16 rows in whole
/// wide blocks, not quantized by its dots), or `None`.
fn wide_float_block(m: &WeightMatrix<'_>) -> Option<&'static str> {
    if m.dots.quantizes(m.ty) {
        return None;
    }
    match m.ty {
        GgmlType::F32 if m.cols.is_multiple_of(WIDE_F32.1) => Some(WIDE_F32.0),
        GgmlType::F16 if m.cols.is_multiple_of(WIDE_F16.1) => Some(WIDE_F16.0),
        _ => None,
    }
}

/// Whether [`moe_route_gate`] takes this gate row for `tokens` tokens among `n_expert`.
pub fn moe_route_gate_takes(gate: &WeightMatrix<'_>, tokens: usize, n_expert: usize) -> bool {
    gate_block(gate, tokens, n_expert).is_some()
}

/// `moe_route` of `logits` (tokens x n_expert) with `shared_logit = gate · x[t]` computed in
/// the same launch: `ids`, `weights` (tokens x used) and `shared_weight` (tokens).
#[allow(clippy::too_many_arguments)]
pub fn moe_route_gate(
    device: &Device,
    logits: &CudaView<'_, f32>,
    gate: &WeightMatrix<'_>,
    x: &CudaView<'_, f32>,
    ids: &mut CudaViewMut<'_, i32>,
    weights: &mut CudaViewMut<'_, f32>,
    shared_weight: &mut CudaViewMut<'_, f32>,
) -> Result<(), CudaError> {
    let op = CudaOp::MoeRoute;
    check_matrix(device, op, gate)?;
    let tokens = shared_weight.len();
    let (n_expert, used) = routing_sizes(op, tokens, logits.len(), ids.len(), weights.len())?;
    let Some(block) = gate_block(gate, tokens, n_expert) else {
        return Err(CudaError::UnsupportedType { op, ty: gate.ty });
    };
    shape(op, "x length (tokens x cols)", tokens * gate.cols, x.len())?;
    let kernel = device.kernel(&source::route_gate_kernel(block))?;
    crate::profile::label(|| format!("route+gate {n_expert} {}x{}", gate.rows, gate.cols));
    let cfg = config((tokens, 1, 1), (1 + MATMUL_SPLITK_WARPS) * 32, 0);
    let dims = (to_i32(gate.cols), to_i32(n_expert), to_i32(used));
    raw::launch_moe_route_gate(
        device.stream(),
        kernel,
        cfg,
        (logits, &gate.bytes, x),
        ids,
        weights,
        shared_weight,
        dims,
    )
}
