//! Many device-to-device copies in one launch (`copy_spans_kernel`, `elementwise.cu`): an MTP
//! rollback puts every DeltaNet layer's conv window and recurrent state back from the row a
//! verification recorded, 72 buffers for Qwen3-Next, where a copy call each costs the host
//! a few microseconds and the GPU a gap between copies.

use cudarc::driver::{CudaSlice, CudaView, CudaViewMut};

use crate::device::Device;
use crate::error::{CudaError, CudaOp};
use crate::layer_launch::config;
use crate::raw;
use crate::source::COPY_SPANS_KERNEL;

/// Threads of a CTA, and CTAs a span: a recurrent state (512 Ki floats) takes 8 float4
/// strides a thread.
const THREADS: u32 = 256;
const CTAS_PER_SPAN: usize = 64;

/// Copies each source into its destination (equal lengths), queued, in one launch. `table`:
/// device scratch of at least three values a copy, rewritten from the borrowed buffers'
/// addresses (a host copy queued before the launch).
pub fn copy_spans(
    device: &Device,
    copies: &mut [(CudaView<'_, f32>, CudaViewMut<'_, f32>)],
    table: &mut CudaSlice<u64>,
) -> Result<(), CudaError> {
    if copies.is_empty() {
        return Ok(());
    }
    if table.len() < 3 * copies.len() {
        return Err(CudaError::Shape {
            op: CudaOp::CopySpans,
            what: "table values (three a copy)",
            expected: 3 * copies.len(),
            found: table.len(),
        });
    }
    let mut spans = Vec::with_capacity(3 * copies.len());
    for (src, dst) in copies.iter() {
        if src.len() != dst.len() {
            return Err(CudaError::Shape {
                op: CudaOp::CopySpans,
                what: "destination floats (the source's)",
                expected: src.len(),
                found: dst.len(),
            });
        }
        spans.extend([device.address(src), device.address(dst), src.len() as u64]);
    }
    let n = copies.len();
    device.copy_to_device(&spans, &mut table.slice_mut(..3 * n))?;
    let kernel = device.kernel(COPY_SPANS_KERNEL)?;
    let cfg = config((CTAS_PER_SPAN, n, 1), THREADS, 0);
    raw::launch_copy_spans(device.stream(), kernel, cfg, &table.slice(..3 * n))
}
