//! Launchers: size the grid and pick the kernel specialization for a validated shape.

use crate::device::Device;
use crate::error::CudaError;
use crate::raw;
use crate::source::{dequantize_kernel, matvec_kernel, WeightKind, MATVEC_WARPS};
use cudarc::driver::{CudaView, CudaViewMut, LaunchConfig};

const DEQUANTIZE_THREADS: u32 = 256;

/// x is staged in shared memory when it fits the default 48 KiB dynamic limit (no opt-in
/// attribute needed); larger x is read from global memory through L1.
const X_SHARED_MAX_BYTES: usize = 48 * 1024;

/// One thread per item; `total_items` > 0 and its grid fits (checked by the op entry).
pub(crate) fn dequantize(
    device: &Device,
    kind: WeightKind,
    weights: &CudaView<'_, u8>,
    out: &mut CudaViewMut<'_, f32>,
    total_items: u64,
) -> Result<(), CudaError> {
    let kernel = device.kernel(&dequantize_kernel(kind))?;
    let blocks = total_items.div_ceil(u64::from(DEQUANTIZE_THREADS));
    let config = LaunchConfig {
        grid_dim: (u32::try_from(blocks).unwrap_or(u32::MAX), 1, 1),
        block_dim: (DEQUANTIZE_THREADS, 1, 1),
        shared_mem_bytes: 0,
    };
    let total_items = i64::try_from(total_items).unwrap_or(i64::MAX);
    raw::launch_dequantize(device.stream(), kernel, config, weights, out, total_items)
}

/// The grid of [`matvec`]: one warp per row, `MATVEC_WARPS` rows per CTA.
pub(crate) fn matvec_grid(rows: usize) -> u64 {
    (rows as u64).div_ceil(u64::from(MATVEC_WARPS))
}

/// One warp per row; `rows` > 0, both fit i32 (checked by the op entry).
pub(crate) fn matvec(
    device: &Device,
    kind: WeightKind,
    weights: &CudaView<'_, u8>,
    x: &CudaView<'_, f32>,
    y: &mut CudaViewMut<'_, f32>,
    (rows, cols): (usize, usize),
) -> Result<(), CudaError> {
    let x_bytes = cols * size_of::<f32>();
    let x_shared = x_bytes <= X_SHARED_MAX_BYTES;
    let kernel = device.kernel(&matvec_kernel(kind, x_shared))?;
    let config = LaunchConfig {
        grid_dim: (u32::try_from(matvec_grid(rows)).unwrap_or(u32::MAX), 1, 1),
        block_dim: (MATVEC_WARPS * 32, 1, 1),
        shared_mem_bytes: if x_shared { x_bytes as u32 } else { 0 },
    };
    let shape = (
        i32::try_from(rows).unwrap_or(i32::MAX),
        i32::try_from(cols).unwrap_or(i32::MAX),
    );
    raw::launch_matvec(device.stream(), kernel, config, weights, x, y, shape)
}
