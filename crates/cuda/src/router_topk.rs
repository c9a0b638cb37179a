//! One decode token's router and routing in one launch (`router_topk_kernel`, `moe_route.cu`):
//! the F32 router's rows and the shared expert's gate row (stored after them, or a row of its
//! own: the F16 row of the real files) reduced a row per CTA as the split-K matmul does, and
//! the last CTA to finish routing as `moe_route` does, so the bits are those of the split-K
//! launches and the routing (`moe_route_gate` included). `REDLITE_ROUTER_TOPK=0` keeps the
//! separate launches. [`router_topk_norm`] also runs the post-mixer add + norm before them
//! in the same launch (`router_topk_norm_kernel`), the bits of `add_rms_norm_quantized`.

use std::sync::OnceLock;

use cudarc::driver::{CudaView, CudaViewMut};

use crate::device::Device;
use crate::error::{CudaError, CudaOp};
use crate::layer_launch::{config, to_i32};
use crate::matmul_launch::{matvec_v1, split_k};
use crate::ops::{check_matrix, shape, WeightMatrix};
use crate::q8_input::Q8RowsMut;
use crate::raw;
use crate::route_gate::wide_float_block;
use crate::source::{
    self, MATMUL_SPLITK_WARPS, ROUTER_NORM_CHUNKS, ROUTER_NORM_THREADS, ROUTE_V2_PER_LANE, WIDE_F32,
};
use crate::switch::Switch;
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
    let router = rows.router();
    shape(CudaOp::MoeRoute, "x length (cols)", router.cols, x.len())?;
    let lengths = [
        logits.len(),
        ticket.len(),
        ids.len(),
        weights.len(),
        shared_weight.len(),
    ];
    let (gate_block, gate_w) = checked_rows(device, &rows, router_topk_takes(&rows), lengths)?;
    let (n_expert, used) = (rows.n_expert(), ids.len());
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

/// The post-mixer add + norm [`router_topk_norm`] runs first: `x += y`, then `h = x / rms(x)
/// * w` and its Q8_K codes, as [`crate::add_rms_norm_quantized`] does (one token).
pub struct PostNorm<'v, 'a> {
    pub x: &'v mut CudaViewMut<'a, f32>,
    pub y: &'v CudaView<'a, f32>,
    pub w: &'v CudaView<'a, f32>,
    pub h: &'v mut CudaViewMut<'a, f32>,
    pub h_q8: &'v mut Q8RowsMut<'a>,
    pub eps: f32,
}

/// `REDLITE_ROUTER_NORM=1` (written without a GPU, sixteenth session; off until measured):
/// one decode token's post-mixer norm inside the router's launch.
pub static ROUTER_NORM: Switch = Switch::new("REDLITE_ROUTER_NORM", false);

/// Whether [`ROUTER_NORM`] is on.
pub fn router_norm_on() -> bool {
    ROUTER_NORM.on()
}

/// Whether [`router_topk_norm`] takes `rows` with a norm of `cols` values: [`router_topk`]
/// does, and the row is whole Q8_K blocks short enough for the norm kernel's vector path,
/// with a CTA per block at least. The switch is the caller's ([`router_norm_on`]).
pub fn router_topk_norm_takes(rows: &RouterRows<'_, '_>, cols: usize) -> bool {
    router_topk_takes(rows)
        && rows.router().cols == cols
        && cols.is_multiple_of(256)
        && cols / 4 <= ROUTER_NORM_CHUNKS * ROUTER_NORM_THREADS
        && rows.n_expert() + 1 >= cols / 256
}

/// One decode token's post-mixer add + norm (`norm`), then [`router_topk`] on the normed
/// row, in one launch: the bits of [`crate::add_rms_norm_quantized`] then [`router_topk`].
#[allow(clippy::too_many_arguments)]
pub fn router_topk_norm(
    device: &Device,
    rows: RouterRows<'_, '_>,
    norm: PostNorm<'_, '_>,
    logits: &mut CudaViewMut<'_, f32>,
    ticket: &mut CudaViewMut<'_, i32>,
    ids: &mut CudaViewMut<'_, i32>,
    weights: &mut CudaViewMut<'_, f32>,
    shared_weight: &mut CudaViewMut<'_, f32>,
) -> Result<(), CudaError> {
    let op = CudaOp::MoeRoute;
    let router = rows.router();
    let cols = router.cols;
    let lengths = [
        logits.len(),
        ticket.len(),
        ids.len(),
        weights.len(),
        shared_weight.len(),
    ];
    let takes = router_topk_norm_takes(&rows, cols);
    let (gate_block, gate_w) = checked_rows(device, &rows, takes, lengths)?;
    let (n_expert, used) = (rows.n_expert(), ids.len());
    for (what, len) in [
        ("x length (cols)", norm.x.len()),
        ("y length (cols)", norm.y.len()),
        ("norm weight length (cols)", norm.w.len()),
        ("h length (cols)", norm.h.len()),
        ("h codes length (cols)", norm.h_q8.codes.len()),
    ] {
        shape(op, what, cols, len)?;
    }
    shape(op, "h scales length", cols / 256, norm.h_q8.scales.len())?;
    // The norm kernel's vector path, whose sums the kernel repeats, reads 16-byte chunks.
    for (what, address) in [
        ("x", device.address(&*norm.x)),
        ("y", device.address(norm.y)),
        ("norm weight", device.address(norm.w)),
        ("h", device.address(&*norm.h)),
    ] {
        if !address.is_multiple_of(16) {
            return Err(CudaError::Misaligned {
                op,
                what,
                address,
                alignment: 16,
            });
        }
    }
    let row_bytes = cols * size_of::<f32>();
    let kernel = device.kernel(&source::router_topk_norm_kernel(gate_block))?;
    crate::profile::label(|| format!("router_topk_norm {}x{cols}", n_expert + 1));
    let cfg = config((n_expert + 1, 1, 1), MATMUL_SPLITK_WARPS * 32, row_bytes);
    raw::launch_router_topk_norm(
        device.stream(),
        kernel,
        cfg,
        (&router.bytes, &gate_w),
        (norm.x, norm.y, norm.w),
        (norm.h, &mut norm.h_q8.scales, &mut norm.h_q8.codes),
        logits,
        ticket,
        (ids, weights, shared_weight),
        (to_i32(cols), to_i32(n_expert), to_i32(used), norm.eps),
    )
}

/// What both launches check: the matrices of `rows`, that the launch `takes` them (with the
/// kernel's gate block), and the routing outputs' lengths (logits n_expert + 1, ticket 1, ids
/// and weights `used` of 1 to n_expert, the shared weight 1); returns the gate block and the
/// gate row's bytes (the merged router's last row, or the row apart).
fn checked_rows<'m>(
    device: &Device,
    rows: &RouterRows<'m, '_>,
    takes: bool,
    [logits, ticket, used, weights, shared_weight]: [usize; 5],
) -> Result<(&'static str, CudaView<'m, u8>), CudaError> {
    let op = CudaOp::MoeRoute;
    let router = rows.router();
    check_matrix(device, op, router)?;
    if let RouterRows::Apart { gate, .. } = rows {
        check_matrix(device, op, gate)?;
    }
    let (true, Some(gate_block)) = (takes, rows.gate_block()) else {
        return Err(CudaError::UnsupportedType { op, ty: router.ty });
    };
    let n_expert = rows.n_expert();
    shape(op, "logits length (n_expert + 1)", n_expert + 1, logits)?;
    shape(op, "ticket length", 1, ticket)?;
    shape(op, "weights length", used, weights)?;
    shape(op, "shared_weight length", 1, shared_weight)?;
    if used == 0 || used > n_expert {
        return Err(CudaError::Shape {
            op,
            what: "experts used (1 to n_expert)",
            expected: n_expert,
            found: used,
        });
    }
    let row_bytes = router.cols * size_of::<f32>();
    let gate_w = match *rows {
        RouterRows::Merged(m) => m.bytes.slice(n_expert * row_bytes..),
        RouterRows::Apart { gate, .. } => gate.bytes.slice(..),
    };
    Ok((gate_block, gate_w))
}
