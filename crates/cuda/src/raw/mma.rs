//! Launches of the int8 tensor-core kernels (`mma.cu`) and the uninitialized scratch they
//! write before reading.

use super::layers::{allow_shared, builder, launched, NO_POS};
use crate::error::CudaError;
use cudarc::driver::{
    CudaFunction, CudaSlice, CudaStream, CudaView, CudaViewMut, DeviceRepr, LaunchConfig,
    PushKernelArg,
};
use std::sync::Arc;

/// A device buffer of `len` elements whose contents the next kernel overwrites whole before
/// anything reads them (the quantized activations, the per-pair down outputs).
pub(crate) fn scratch<T: DeviceRepr>(
    stream: &Arc<CudaStream>,
    len: usize,
) -> Result<CudaSlice<T>, CudaError> {
    // SAFETY: the callers launch a kernel that writes every element before any read (the
    // quantize kernel writes every block's codes and scale; the grouped down product writes
    // every pair's row, each pair being in exactly one tile).
    unsafe { stream.alloc(len.max(1)) }.map_err(CudaError::driver("cuMemAlloc"))
}

/// `mma_quantize_kernel(x, d, q, blocks)`.
pub(crate) fn launch_mma_quantize(
    stream: &CudaStream,
    kernel: &CudaFunction,
    config: LaunchConfig,
    x: &CudaView<'_, f32>,
    d: &mut CudaSlice<f32>,
    q: &mut CudaSlice<i8>,
    blocks: i32,
) -> Result<(), CudaError> {
    let mut launch = builder(stream, kernel);
    launch.arg(x).arg(d).arg(q).arg(&blocks);
    // SAFETY: arguments match the signature; x holds blocks x 256 values, d `blocks` and q
    // blocks x 256 (launcher); each CTA touches only its 16 blocks, the last CTA fewer.
    launched(stream, "cuLaunchKernel(mma_quantize)", unsafe {
        launch.launch(config)
    })
}

/// The weights of one `mma_matmul_kernel` launch: the first (gate, or the only) matrix, the
/// up matrix of a gate/up launch, and the bytes of one expert's rows (0 for a dense one).
pub(crate) type MmaWeights<'a, 'b> = (&'a CudaView<'b, u8>, Option<&'a CudaView<'b, u8>>, i64);

/// The grouping of an expert launch: tile_info (3 per tile), the pairs and the divisor that
/// turns a pair into its input row; `None` for a dense launch.
pub(crate) type MmaGroups<'a, 'b> = Option<(&'a CudaView<'b, i32>, &'a CudaView<'b, i32>, i32)>;

/// `mma_matmul_kernel<B, WM, WN, FM, FN, MATS>(w0, w1, expert_bytes, tile_info, pairs, in_div,
/// xq, xd, y, rows, cols, tokens)`, after raising the kernel's dynamic shared memory limit to
/// the launch's.
#[allow(clippy::too_many_arguments)]
pub(crate) fn launch_mma_matmul(
    stream: &CudaStream,
    kernel: &CudaFunction,
    config: LaunchConfig,
    (w0, w1, expert_bytes): MmaWeights<'_, '_>,
    groups: MmaGroups<'_, '_>,
    (xq, xd): (&CudaSlice<i8>, &CudaSlice<f32>),
    y: &mut CudaViewMut<'_, f32>,
    (rows, cols, tokens): (i32, i32, i32),
) -> Result<(), CudaError> {
    allow_shared(kernel, config)?;
    let in_div = groups.map_or(1, |g| g.2);
    let mut launch = builder(stream, kernel);
    launch.arg(w0);
    match w1 {
        Some(w1) => launch.arg(w1),
        None => launch.arg(&NO_POS),
    };
    launch.arg(&expert_bytes);
    match groups {
        Some((info, pairs, _)) => launch.arg(info).arg(pairs),
        None => launch.arg(&NO_POS).arg(&NO_POS),
    };
    launch
        .arg(&in_div)
        .arg(xq)
        .arg(xd)
        .arg(y)
        .arg(&rows)
        .arg(&cols)
        .arg(&tokens);
    // SAFETY: arguments match the signature. Dense: w0 holds rows x cols whole blocks, xq/xd
    // tokens x cols codes and their Q8_K scales, y tokens x rows; grid.y = ceil(tokens / NT)
    // and the last tile reads and writes only its tokens. Experts: every tile's expert is in
    // the stack (w0, and w1 when given, hold experts x rows rows of expert_bytes / rows bytes),
    // its pairs are < tokens x used = the rows of y, and pair / in_div < the rows of xq (the
    // op entries). The dynamic shared memory is the kernel's `mma_shared_bytes` for its shape
    // (the launcher), within the limit set above.
    launched(stream, "cuLaunchKernel(mma_matmul)", unsafe {
        launch.launch(config)
    })
}

/// `mma_combine_kernel(y, weights, ids, out, rows, used, n_expert, accumulate)`.
pub(crate) fn launch_mma_combine(
    stream: &CudaStream,
    kernel: &CudaFunction,
    config: LaunchConfig,
    (y, weights, ids): (
        &CudaView<'_, f32>,
        &CudaView<'_, f32>,
        Option<&CudaView<'_, i32>>,
    ),
    out: &mut CudaViewMut<'_, f32>,
    (rows, used, n_expert, accumulate): (i32, i32, i32, i32),
) -> Result<(), CudaError> {
    let mut launch = builder(stream, kernel);
    launch.arg(y).arg(weights);
    match ids {
        Some(ids) => launch.arg(ids),
        None => launch.arg(&NO_POS),
    };
    launch
        .arg(out)
        .arg(&rows)
        .arg(&used)
        .arg(&n_expert)
        .arg(&accumulate);
    // SAFETY: arguments match the signature; y holds tokens x used x rows values, weights
    // (and ids when given) tokens x used and out tokens x rows, tokens = grid.y (op entry and
    // launcher).
    launched(stream, "cuLaunchKernel(mma_combine)", unsafe {
        launch.launch(config)
    })
}

/// `mma_group_kernel(ids, n_pairs, n_expert, tile_info, tile_bound, pairs)`.
pub(crate) fn launch_mma_group(
    stream: &CudaStream,
    kernel: &CudaFunction,
    config: LaunchConfig,
    ids: &CudaSlice<i32>,
    (info, pairs): (&mut CudaSlice<i32>, &mut CudaSlice<i32>),
    (n_pairs, n_expert, tile_bound, tile): (i32, i32, i32, i32),
) -> Result<(), CudaError> {
    let mut launch = builder(stream, kernel);
    launch
        .arg(ids)
        .arg(&n_pairs)
        .arg(&n_expert)
        .arg(info)
        .arg(&tile_bound)
        .arg(pairs)
        .arg(&tile);
    // SAFETY: arguments match the signature; ids and pairs hold n_pairs values, info 3 x
    // tile_bound, and tile_bound is at least the tiles of `tile` pairs the pairs can fill (a
    // partial tile per expert at most: the op entry); tile ≥ 1; one CTA with 3 x n_expert ints of dynamic shared memory.
    launched(stream, "cuLaunchKernel(mma_group)", unsafe {
        launch.launch(config)
    })
}
