//! The MTP block's input on the GPU (spec §4.2): embed the tokens, RMSNorm the embeddings
//! (`enorm`) and the hidden rows (`hnorm`) side by side (embedding half first, one launch)
//! and project with `eh_proj`. The block's decoder layer then runs through the ordinary
//! ops as layer `n_layer`.
//!
//! Runs eagerly, before the block's layer (which a small batch records as a graph, as the
//! trunk's); its buffers are kept between calls.

use redlite_cuda::{CudaSlice, CudaView, CudaViewMut, Device};

use crate::backend::cuda::weights::{DeviceMatrix, MtpWeights};
use crate::error::{EngineError, Result};

/// The input's intermediate rows, kept between calls (grown to the largest batch seen) so a
/// draft allocates nothing.
#[derive(Default)]
pub struct MtpBuffers(Option<Rows>);

struct Rows {
    rows: usize,
    /// `[rows][n_embd]`: the embeddings.
    embedded: CudaSlice<f32>,
    /// `[rows][2 n_embd]`: the two normed halves side by side.
    concat: CudaSlice<f32>,
}

impl MtpBuffers {
    /// The buffers' address (0 before the first call): part of a step graph's identity.
    pub fn address(&self, device: &Device) -> u64 {
        self.0.as_ref().map_or(0, |b| device.address(&b.concat))
    }

    /// The buffers, with room for `rows` rows of `e`.
    fn reserve(&mut self, device: &Device, rows: usize, e: usize) -> Result<&mut Rows> {
        if self.0.as_ref().is_none_or(|b| b.rows < rows) {
            self.0 = Some(Rows {
                rows,
                embedded: device.alloc_zeros(rows * e)?,
                concat: device.alloc_zeros(rows * 2 * e)?,
            });
        }
        self.0
            .as_mut()
            .ok_or_else(|| EngineError::Cuda("MTP input buffers were not allocated".into()))
    }
}

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
    buffers: &mut MtpBuffers,
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
    let Rows {
        embedded, concat, ..
    } = buffers.reserve(device, n, e)?;
    redlite_cuda::embed(device, &table.view(), ids, &mut embedded.slice_mut(..n * e))?;
    redlite_cuda::mtp_concat_norms(
        device,
        (&embedded.slice(..n * e), hidden),
        (&w.enorm.as_view(), &w.hnorm.as_view()),
        &mut concat.slice_mut(..n * 2 * e),
        eps,
    )?;
    redlite_cuda::matmul(device, &w.eh_proj.view(), &concat.slice(..n * 2 * e), out)?;
    Ok(())
}
