//! Activations quantized to Q8_K once, by the norm that writes them, for every q8 product
//! that reads them. The q8 kernels otherwise quantize their input into shared memory in
//! every CTA: the same few blocks of codes made hundreds of times per launch, a prologue
//! every weight load waits behind. On the H200, skipping all those prologues (a probe that
//! stages zero codes, `REDLITE_PROBE_Q8_NO_QUANTIZE=1`) made decode 13.7 % faster. The codes
//! are the ones each CTA would make (`quantize_q8k_blocks` on the same values), so every
//! product keeps its bits.

use crate::device::Device;
use crate::error::{CudaError, CudaOp};
use crate::layer_launch::{config, to_i32, ROW_THREADS};
use crate::layer_ops::rms_norm_shapes;
use crate::ops::shape;
use crate::raw::{self, NormRows};
use cudarc::driver::{CudaView, CudaViewMut};

/// Values per Q8_K block: one f32 scale per this many codes.
pub const Q8_BLOCK_VALUES: usize = 256;

/// Rows of activations in Q8_K: `scales` holds cols / 256 scales per row, `codes` cols
/// int8 codes per row, row after row.
pub struct Q8Rows<'a> {
    pub scales: CudaView<'a, f32>,
    pub codes: CudaView<'a, i8>,
}

/// The views of a [`Q8Rows`] as the launchers take them (scales, codes).
pub(crate) type Q8Views<'a, 'b> = (&'a CudaView<'b, f32>, &'a CudaView<'b, i8>);

/// Where a norm writes its rows in Q8_K (the layout of [`Q8Rows`]).
pub struct Q8RowsMut<'a> {
    pub scales: CudaViewMut<'a, f32>,
    pub codes: CudaViewMut<'a, i8>,
}

/// The launch arguments of `q8` for `tokens` rows of `cols` values, after checking that it
/// holds exactly those rows.
pub(crate) fn q8_rows_fit<'a, 'b>(
    op: CudaOp,
    q8: Option<&'a Q8Rows<'b>>,
    tokens: usize,
    cols: usize,
) -> Result<Option<Q8Views<'a, 'b>>, CudaError> {
    let Some(q8) = q8 else {
        return Ok(None);
    };
    q8_shape(op, (q8.scales.len(), q8.codes.len()), tokens, cols)?;
    Ok(Some((&q8.scales, &q8.codes)))
}

fn q8_shape(
    op: CudaOp,
    (scales, codes): (usize, usize),
    tokens: usize,
    cols: usize,
) -> Result<(), CudaError> {
    shape(op, "Q8_K row (cols % 256)", 0, cols % Q8_BLOCK_VALUES)?;
    shape(
        op,
        "Q8_K scales (tokens x cols / 256)",
        tokens * cols / Q8_BLOCK_VALUES,
        scales,
    )?;
    shape(op, "Q8_K codes (tokens x cols)", tokens * cols, codes)
}

/// [`crate::rms_norm`], each row's output also quantized to Q8_K into `q8` (rows of
/// `w.len()` values, a multiple of 256).
pub fn rms_norm_quantized(
    device: &Device,
    x: &CudaView<'_, f32>,
    w: &CudaView<'_, f32>,
    out: &mut CudaViewMut<'_, f32>,
    q8: &mut Q8RowsMut<'_>,
    eps: f32,
) -> Result<(), CudaError> {
    norm_quantized(device, NormRows::Plain(x), w, out, q8, eps)
}

/// [`crate::add_rms_norm`], each row's output also quantized to Q8_K into `q8`.
pub fn add_rms_norm_quantized(
    device: &Device,
    x: &mut CudaViewMut<'_, f32>,
    y: &CudaView<'_, f32>,
    w: &CudaView<'_, f32>,
    out: &mut CudaViewMut<'_, f32>,
    q8: &mut Q8RowsMut<'_>,
    eps: f32,
) -> Result<(), CudaError> {
    shape(CudaOp::RmsNorm, "y length", x.len(), y.len())?;
    norm_quantized(device, NormRows::Add(x, y), w, out, q8, eps)
}

fn norm_quantized(
    device: &Device,
    rows: NormRows<'_, '_>,
    w: &CudaView<'_, f32>,
    out: &mut CudaViewMut<'_, f32>,
    q8: &mut Q8RowsMut<'_>,
    eps: f32,
) -> Result<(), CudaError> {
    let (x_len, kernel) = match &rows {
        NormRows::Plain(x) => (x.len(), "rms_norm_q8_kernel"),
        NormRows::Add(x, _) => (x.len(), "add_rms_norm_q8_kernel"),
    };
    if !rms_norm_shapes(x_len, w.len(), out.len())? {
        return Ok(());
    }
    let cols = w.len();
    let n = x_len / cols;
    q8_shape(CudaOp::RmsNorm, (q8.scales.len(), q8.codes.len()), n, cols)?;
    let kernel = device.kernel(kernel)?;
    let cfg = config((n, 1, 1), ROW_THREADS, cols * size_of::<f32>());
    let q8 = (&mut q8.scales, &mut q8.codes);
    raw::launch_norm_q8(
        device.stream(),
        kernel,
        cfg,
        rows,
        w,
        out,
        q8,
        to_i32(cols),
        eps,
    )
}
