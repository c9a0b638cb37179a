//! One decode token's router and routing in one launch (`router_topk_kernel`, `moe_route.cu`):
//! the F32 router's rows and the shared expert's gate row stored after them reduced a row per
//! CTA as the split-K matmul does, and the last CTA to finish routing as `moe_route` does, so
//! the bits are those of the split-K launch and the routing. `REDLITE_ROUTER_TOPK=0` keeps the
//! separate launches. Files whose gate row is apart from the router (an F32 router and an F16
//! gate, as the real files have) take the split-K router and then the routing with the gate
//! row (`route_gate.rs`): the fused router with the row apart, and with the post-mixer norm
//! before it, measured slower on the H200 (eighteenth session, docs/PERF.md) and were removed.

use std::sync::OnceLock;

use cudarc::driver::{CudaView, CudaViewMut};

use crate::device::Device;
use crate::error::{CudaError, CudaOp};
use crate::layer_launch::{config, to_i32};
use crate::matmul_launch::{matvec_v1, split_k};
use crate::ops::{check_matrix, shape, WeightMatrix};
use crate::raw;
use crate::source::{self, MATMUL_SPLITK_WARPS, ROUTE_V2_PER_LANE};
use redlite_gguf::GgmlType;

/// Whether [`router_topk`] takes `router` (the experts' rows, then the shared expert's gate
/// row) for one token: the switch is on, the products of a decode step are split-K (whose
/// sums the kernel repeats), the rows are F32 in groups of 4 (the split-K matmul's `F32x4`
/// layout) and the experts fit the routing's registers.
pub fn router_topk_takes(router: &WeightMatrix<'_>) -> bool {
    static ON: OnceLock<bool> = OnceLock::new();
    let on = *ON.get_or_init(|| std::env::var("REDLITE_ROUTER_TOPK").as_deref() != Ok("0"));
    let n_expert = router.rows.saturating_sub(1);
    on && split_k()
        && !matvec_v1()
        && router.ty == GgmlType::F32
        && router.cols.is_multiple_of(4)
        && (1..=32 * ROUTE_V2_PER_LANE).contains(&n_expert)
}

/// `logits = router · x` (n_expert + 1 values, the last the shared gate's: `router` holds
/// the experts' rows, then the gate row), then the routing of `moe_route` for this one token.
/// `ticket`: one zeroed i32 the kernel leaves zeroed.
#[allow(clippy::too_many_arguments)]
pub fn router_topk(
    device: &Device,
    router: &WeightMatrix<'_>,
    x: &CudaView<'_, f32>,
    logits: &mut CudaViewMut<'_, f32>,
    ticket: &mut CudaViewMut<'_, i32>,
    ids: &mut CudaViewMut<'_, i32>,
    weights: &mut CudaViewMut<'_, f32>,
    shared_weight: &mut CudaViewMut<'_, f32>,
) -> Result<(), CudaError> {
    let op = CudaOp::MoeRoute;
    shape(op, "x length (cols)", router.cols, x.len())?;
    check_matrix(device, op, router)?;
    if !router_topk_takes(router) {
        return Err(CudaError::UnsupportedType { op, ty: router.ty });
    }
    let (n_expert, used) = (router.rows - 1, ids.len());
    shape(
        op,
        "logits length (n_expert + 1)",
        n_expert + 1,
        logits.len(),
    )?;
    shape(op, "ticket length", 1, ticket.len())?;
    shape(op, "weights length", used, weights.len())?;
    shape(op, "shared_weight length", 1, shared_weight.len())?;
    if used == 0 || used > n_expert {
        return Err(CudaError::Shape {
            op,
            what: "experts used (1 to n_expert)",
            expected: n_expert,
            found: used,
        });
    }
    let kernel = device.kernel(&source::router_topk_kernel())?;
    crate::profile::label(|| format!("router_topk {}x{}", n_expert + 1, router.cols));
    let cfg = config((n_expert + 1, 1, 1), MATMUL_SPLITK_WARPS * 32, 0);
    let dims = (to_i32(router.cols), to_i32(n_expert), to_i32(used));
    raw::launch_router_topk(
        device.stream(),
        kernel,
        cfg,
        (&router.bytes, x),
        logits,
        ticket,
        (ids, weights, shared_weight),
        dims,
    )
}
