//! Page-locked host memory the host reads (`HostStage`): the one unsafe call it needs.

use crate::error::CudaError;
use cudarc::driver::{CudaContext, PinnedHostSlice};
use std::sync::Arc;

/// `len` floats of page-locked host memory, cached for the host's reads (no flags: cudarc's
/// default is write-combined memory, which the host reads uncached, many times slower).
pub(crate) fn alloc_host_floats(
    context: &Arc<CudaContext>,
    len: usize,
) -> Result<PinnedHostSlice<f32>, CudaError> {
    // SAFETY: every bit pattern is a valid f32, and cuMemHostAlloc hands out fresh pages,
    // which the kernel zero-fills when it pins them, so the contents are initialized.
    unsafe { context.alloc_pinned_with_flags::<f32>(len.max(1), 0) }
        .map_err(CudaError::driver("cuMemHostAlloc"))
}
