//! One decode token's router and routing in one launch (`router_topk_kernel`, `moe_route.cu`):
//! the F32 router with the shared expert's gate row stored after it, reduced a row per CTA as
//! the split-K matmul does, and the last CTA to finish routing as `moe_route` does, so the
//! bits are those of the two launches. `REDLITE_ROUTER_TOPK=0` keeps the two launches.

use std::sync::OnceLock;

use cudarc::driver::{CudaView, CudaViewMut};

use crate::device::Device;
use crate::error::{CudaError, CudaOp};
use crate::layer_launch::{config, to_i32};
use crate::ops::{check_matrix, shape, WeightMatrix};
use crate::raw;
use crate::source::{self, MATMUL_SPLITK_WARPS, ROUTE_V2_PER_LANE};
use redlite_gguf::GgmlType;

/// Whether [`router_topk`] takes `router` (rows = experts + the shared gate row) for one
/// token: the switch is on, the rows are F32 in groups of 4 (the split-K matmul's `F32x4`
/// layout) and the experts fit the routing's registers.
pub fn router_topk_takes(router: &WeightMatrix<'_>) -> bool {
    static ON: OnceLock<bool> = OnceLock::new();
    let on = *ON.get_or_init(|| std::env::var("REDLITE_ROUTER_TOPK").as_deref() != Ok("0"));
    on && router.ty == GgmlType::F32
        && router.cols.is_multiple_of(4)
        && router.rows >= 2
        && router.rows - 1 <= 32 * ROUTE_V2_PER_LANE
}

/// `logits = router · x` (n_expert + 1 values, the last the shared gate's), then the
/// routing of `moe_route` for this one token. `ticket`: one zeroed i32 the kernel leaves
/// zeroed.
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
    check_matrix(device, op, router)?;
    if !router_topk_takes(router) {
        return Err(CudaError::UnsupportedType { op, ty: router.ty });
    }
    let n_expert = router.rows - 1;
    let used = ids.len();
    shape(op, "x length (cols)", router.cols, x.len())?;
    shape(
        op,
        "logits length (n_expert + 1)",
        router.rows,
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
    crate::profile::label(|| format!("router_topk {}x{}", router.rows, router.cols));
    let cfg = config((router.rows, 1, 1), MATMUL_SPLITK_WARPS * 32, 0);
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
