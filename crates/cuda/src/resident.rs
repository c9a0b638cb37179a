//! How many CTAs of a launch the GPU holds at once, for the kernels shaped by it (persistent
//! warps, a first wave that asks L2 for the later waves' rows).

use std::collections::HashMap;
use std::sync::{Mutex, OnceLock};

use cudarc::driver::{CudaFunction, LaunchConfig};

use crate::device::Device;
use crate::error::CudaError;

/// CTAs of `cfg`'s shape the GPU holds at once (its multiprocessors times the occupancy
/// the driver computes from the kernel's registers and shared memory), asked once per kernel
/// and shared-memory size.
pub(crate) fn resident_ctas(
    device: &Device,
    name: &str,
    kernel: &CudaFunction,
    cfg: &LaunchConfig,
) -> Result<u32, CudaError> {
    static PER_SM: OnceLock<Mutex<HashMap<(String, u32), u32>>> = OnceLock::new();
    let key = (name.to_string(), cfg.shared_mem_bytes);
    let known = PER_SM
        .get_or_init(Default::default)
        .lock()
        .ok()
        .and_then(|map| map.get(&key).copied());
    let per_sm = match known {
        Some(n) => n,
        None => {
            let n = kernel
                .occupancy_max_active_blocks_per_multiprocessor(
                    cfg.block_dim.0,
                    cfg.shared_mem_bytes as usize,
                    None,
                )
                .map_err(CudaError::driver(
                    "cuOccupancyMaxActiveBlocksPerMultiprocessor",
                ))?;
            if let Ok(mut map) = PER_SM.get_or_init(Default::default).lock() {
                map.insert(key, n);
            }
            n
        }
    };
    Ok((per_sm * device.multiprocessors()).max(1))
}
