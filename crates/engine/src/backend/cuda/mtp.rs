//! The MTP block's input on the GPU (spec §4.2): embed the tokens, RMSNorm the embeddings
//! (`enorm`) and the hidden rows (`hnorm`), lay them side by side (embedding half first)
//! and project with `eh_proj`. The block's decoder layer then runs through the ordinary
//! ops as layer `n_layer`.
//!
//! Runs eagerly, outside the recorded decode graphs. Its buffers are allocated per call
//! (a few rows per step); folding them into `Scratch` is a later optimisation.

use redlite_cuda::{CudaSlice, CudaView, CudaViewMut, Device};

use crate::backend::cuda::weights::{DeviceMatrix, MtpWeights};
use crate::error::{EngineError, Result};

/// `out[t] = eh_proj · [enorm(table[tokens[t]]) ; hnorm(hidden[t])]`; `ids` holds the
/// tokens on the device, `hidden` and `out` are `[tokens][n_embd]`.
#[allow(clippy::too_many_arguments)]
pub fn input(
    device: &Device,
    w: &MtpWeights,
    table: &DeviceMatrix,
    eps: f32,
    ids: &CudaView<'_, u32>,
    hidden: &CudaView<'_, f32>,
    out: &mut CudaViewMut<'_, f32>,
) -> Result<()> {
    let n = ids.len();
    let e = w.enorm.len();
    if hidden.len() != n * e || out.len() != n * e {
        return Err(EngineError::BadConfig(format!(
            "MTP input: {n} tokens need hidden and output rows of {e}, found {} and {} values",
            hidden.len(),
            out.len()
        )));
    }
    let mut embedded: CudaSlice<f32> = device.alloc_zeros(n * e)?;
    let mut normed_e: CudaSlice<f32> = device.alloc_zeros(n * e)?;
    let mut normed_h: CudaSlice<f32> = device.alloc_zeros(n * e)?;
    let mut concat: CudaSlice<f32> = device.alloc_zeros(n * 2 * e)?;
    redlite_cuda::embed(device, &table.view(), ids, &mut embedded.as_view_mut())?;
    redlite_cuda::rms_norm(
        device,
        &embedded.as_view(),
        &w.enorm.as_view(),
        &mut normed_e.as_view_mut(),
        eps,
    )?;
    redlite_cuda::rms_norm(
        device,
        hidden,
        &w.hnorm.as_view(),
        &mut normed_h.as_view_mut(),
        eps,
    )?;
    for t in 0..n {
        let row = t * 2 * e;
        copy(
            device,
            &normed_e.slice(t * e..(t + 1) * e),
            &mut concat.slice_mut(row..row + e),
        )?;
        copy(
            device,
            &normed_h.slice(t * e..(t + 1) * e),
            &mut concat.slice_mut(row + e..row + 2 * e),
        )?;
    }
    redlite_cuda::matmul(device, &w.eh_proj.view(), &concat.as_view(), out)?;
    Ok(())
}

/// Device-to-device copy, queued on the stream.
fn copy(device: &Device, src: &CudaView<'_, f32>, dst: &mut CudaViewMut<'_, f32>) -> Result<()> {
    device
        .stream()
        .memcpy_dtod(src, dst)
        .map_err(|e| EngineError::Cuda(format!("MTP input copy: {e}")))
}
