//! The expert products of a prompt per (token, slot) pair: each pair's down product written
//! on its own (a down launch with one expert per "token", weight 1), then [`moe_combine`]
//! sums a token's pairs with their routing weights in one fixed order. Launches may cover
//! any subset of the pairs (the others marked [`SKIP_PAIR`]), as an expert cache's waves do,
//! and the sums do not change.

use cudarc::driver::{CudaView, CudaViewMut};

use crate::device::Device;
use crate::error::{CudaError, CudaOp};
use crate::layer_launch::{config, to_i32};
use crate::layer_ops::tokens_fit;
use crate::ops::shape;
use crate::raw;
use crate::source::MOE_COMBINE_KERNEL;

/// The id that leaves a pair out of a launch (`moe.cu`'s `SKIP_PAIR`): no product computed,
/// nothing written. Other ids out of range give zeros.
pub const SKIP_PAIR: i32 = -2;

const COMBINE_THREADS: u32 = 256;

/// `out[t] = Σ_k weights[t][k] · y[t][k]` (k from 0 in order); `y`: `[tokens][used][rows]`.
pub fn moe_combine(
    device: &Device,
    y: &CudaView<'_, f32>,
    weights: &CudaView<'_, f32>,
    out: &mut CudaViewMut<'_, f32>,
    rows: usize,
) -> Result<(), CudaError> {
    let op = CudaOp::MoeDown;
    let tokens = out.len() / rows.max(1);
    tokens_fit(op, tokens)?;
    shape(op, "out length (tokens x rows)", tokens * rows, out.len())?;
    let used = weights.len() / tokens;
    shape(
        op,
        "weights length (tokens x used)",
        tokens * used,
        weights.len(),
    )?;
    shape(
        op,
        "y length (tokens x used x rows)",
        tokens * used * rows,
        y.len(),
    )?;
    let kernel = device.kernel(MOE_COMBINE_KERNEL)?;
    crate::profile::label(|| format!("moe_combine {rows} used{used}"));
    let grid = (rows.div_ceil(COMBINE_THREADS as usize), tokens, 1);
    raw::launch_moe_combine(
        device.stream(),
        kernel,
        config(grid, COMBINE_THREADS, 0),
        y,
        weights,
        out,
        (to_i32(rows), to_i32(used)),
    )
}
