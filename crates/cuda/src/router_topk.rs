//! One decode token's router and routing in one launch (`router_topk_kernel`, `moe_route.cu`):
//! the F32 router's rows and the shared expert's gate row (stored after them, or a row of its
//! own: the F16 row of the real files) reduced a row per CTA as the split-K matmul does, and
//! the last CTA to finish routing as `moe_route` does, so the bits are those of the split-K
//! launches and the routing (`moe_route_gate` included). `REDLITE_ROUTER_TOPK=0` keeps the
//! separate launches.

use std::sync::OnceLock;

use cudarc::driver::{CudaView, CudaViewMut};

use crate::device::Device;
use crate::error::{CudaError, CudaOp};
use crate::layer_launch::{config, to_i32};
use crate::matmul_launch::{matvec_v1, split_k};
use crate::ops::{check_matrix, shape, WeightMatrix};
use crate::raw;
use crate::route_gate::wide_float_block;
use crate::source::{self, MATMUL_SPLITK_WARPS, ROUTE_V2_PER_LANE, WIDE_F32};
use redlite_gguf::GgmlType;

/// The rows [`router_topk`] reduces: the F32 router with the shared expert's gate row stored
/// after its experts' rows (`Merged`), or the router and the gate row apart.
#[derive(Clone, Copy)]
pub enum RouterRows<'m, 'a> {
    Merged(&'m WeightMatrix<'a>),
    Apart {
        router: &'m WeightMatrix<'a>,
        gate: &'m WeightMatrix<'a>,
    },
}

impl RouterRows<'_, '_> {
    fn router(&self) -> &WeightMatrix<'_> {
        match self {
            RouterRows::Merged(m) => m,
            RouterRows::Apart { router, .. } => router,
        }
    }

    /// The experts (router rows without the gate row).
    fn n_expert(&self) -> usize {
        match self {
            RouterRows::Merged(m) => m.rows.saturating_sub(1),
            RouterRows::Apart { router, .. } => router.rows,
        }
    }

    /// The gate row's block in the kernel (the split-K matmul's for its type), or `None`
    /// where the kernel has none for it.
    fn gate_block(&self) -> Option<&'static str> {
        match self {
            RouterRows::Merged(_) => Some(WIDE_F32.0),
            RouterRows::Apart { router, gate } => {
                (gate.rows == 1 && gate.cols == router.cols).then_some(())?;
                wide_float_block(gate)
            }
        }
    }
}

/// Whether [`router_topk`] takes `rows` for one token: the switch is on, the products of a
/// decode step are split-K (whose sums the kernel repeats), the router rows are F32 in groups
/// of 4 (the split-K matmul's `F32x4` layout), the gate row is F32 or F16 in whole wide blocks
/// and the experts fit the routing's registers.
pub fn router_topk_takes(rows: &RouterRows<'_, '_>) -> bool {
    static ON: OnceLock<bool> = OnceLock::new();
    let on = *ON.get_or_init(|| std::env::var("REDLITE_ROUTER_TOPK").as_deref() != Ok("0"));
    let router = rows.router();
    let n_expert = rows.n_expert();
    on && split_k()
        && !matvec_v1()
        && router.ty == GgmlType::F32
        && router.cols.is_multiple_of(4)
        && (1..=32 * ROUTE_V2_PER_LANE).contains(&n_expert)
        && rows.gate_block().is_some()
}

/// `logits = router · x` (n_expert + 1 values, the last the shared gate's), then the
/// routing of `moe_route` for this one token. `ticket`: one zeroed i32 the kernel leaves
/// zeroed.
#[allow(clippy::too_many_arguments)]
pub fn router_topk(
    device: &Device,
    rows: RouterRows<'_, '_>,
    x: &CudaView<'_, f32>,
    logits: &mut CudaViewMut<'_, f32>,
    ticket: &mut CudaViewMut<'_, i32>,
    ids: &mut CudaViewMut<'_, i32>,
    weights: &mut CudaViewMut<'_, f32>,
    shared_weight: &mut CudaViewMut<'_, f32>,
) -> Result<(), CudaError> {
    let op = CudaOp::MoeRoute;
    let router = rows.router();
    check_matrix(device, op, router)?;
    if let RouterRows::Apart { gate, .. } = rows {
        check_matrix(device, op, gate)?;
    }
    let (true, Some(gate_block)) = (router_topk_takes(&rows), rows.gate_block()) else {
        return Err(CudaError::UnsupportedType { op, ty: router.ty });
    };
    let n_expert = rows.n_expert();
    let used = ids.len();
    shape(op, "x length (cols)", router.cols, x.len())?;
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
    // The merged gate row: the router's last row, F32 as its others.
    let row_bytes = router.cols * size_of::<f32>();
    let gate_w = match rows {
        RouterRows::Merged(m) => m.bytes.slice(n_expert * row_bytes..),
        RouterRows::Apart { gate, .. } => gate.bytes.slice(..),
    };
    let kernel = device.kernel(&source::router_topk_kernel(gate_block))?;
    crate::profile::label(|| format!("router_topk {}x{}", n_expert + 1, router.cols));
    let cfg = config((n_expert + 1, 1, 1), MATMUL_SPLITK_WARPS * 32, 0);
    let dims = (to_i32(router.cols), to_i32(n_expert), to_i32(used));
    raw::launch_router_topk(
        device.stream(),
        kernel,
        cfg,
        (&router.bytes, &gate_w, x),
        logits,
        ticket,
        (ids, weights, shared_weight),
        dims,
    )
}
