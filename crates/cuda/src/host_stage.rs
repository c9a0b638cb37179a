//! Page-locked host memory for what the host reads back after every decode step (the
//! logits of a token: 151,936 floats, 608 KB, for Qwen3-Next). A copy into pageable memory
//! goes through the driver's own staging buffer, a DMA and a host copy in pieces, each
//! waited for; into page-locked memory it is one DMA at the link's rate, then one host copy
//! into the caller's buffer.

use cudarc::driver::{CudaView, PinnedHostSlice};

use crate::device::Device;
use crate::error::CudaError;
use crate::raw;

/// A page-locked buffer, grown to the largest copy it has taken.
#[derive(Default)]
pub struct HostStage {
    floats: Option<PinnedHostSlice<f32>>,
}

impl HostStage {
    pub fn new() -> HostStage {
        HostStage::default()
    }

    /// Appends `src` to `out` through the page-locked buffer; waits for the work queued on
    /// the device's stream before the copy.
    pub fn append_to_host(
        &mut self,
        device: &Device,
        src: &CudaView<'_, f32>,
        out: &mut Vec<f32>,
    ) -> Result<(), CudaError> {
        let n = src.len();
        if self.floats.as_ref().map_or(0, |f| f.len()) < n {
            // Dropped first: the old buffer's pages are unpinned before new ones are pinned.
            self.floats = None;
            self.floats = Some(raw::alloc_host_floats(device.context(), n)?);
        }
        let Some(floats) = self.floats.as_mut() else {
            return Ok(());
        };
        let host = floats
            .as_mut_slice()
            .map_err(CudaError::driver("cuEventSynchronize"))?;
        // Into the first n floats only: a copy into the whole buffer would read as many
        // floats from `src`, past its end once the buffer has grown larger.
        let stream = device.stream();
        stream
            .memcpy_dtoh(src, &mut host[..n])
            .map_err(CudaError::driver("cuMemcpyDtoHAsync"))?;
        // The stream's wait spins (the context's default scheduling) where the buffer's own
        // event would block the thread and wake it late.
        stream
            .synchronize()
            .map_err(CudaError::driver("cuStreamSynchronize"))?;
        out.extend_from_slice(&host[..n]);
        Ok(())
    }
}
