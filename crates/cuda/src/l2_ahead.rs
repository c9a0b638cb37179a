//! Weights asked of L2 one block ahead of the kernels that read them (`REDLITE_L2_AHEAD=1`,
//! the engine's choice). A decode step's kernels wait on their weights' first DRAM round
//! trip at every kernel boundary: each asks L2 for its own rows only under the previous
//! kernel's tail (programmatic dependent launch), often a short one (a one-CTA norm before
//! a 9.4 MB product). A block's MoE reads little (its router, 10 of 512 experts) while DRAM
//! idles, so the next block's non-expert weights (~19 MB for a DeltaNet block of the 80B
//! model, within L2's 50 MB) can be asked for then, on a parallel branch of the decode
//! graph. A hint only: the kernels read the same bytes whether the lines arrive or not.

use std::mem::size_of;

use cudarc::driver::{CudaSlice, DevicePtr};

use crate::device::Device;
use crate::error::CudaError;
use crate::layer_launch::{config, to_i32};
use crate::raw;
use crate::source::L2_PREFETCH_KERNEL;

/// CTAs and threads of a prefetch launch: enough threads that each asks for a few dozen
/// lines of a block's ~150,000, few enough CTAs to leave the main branch its
/// multiprocessors.
const PREFETCH_CTAS: usize = 32;
const PREFETCH_THREADS: u32 = 256;

/// Byte ranges of device buffers, uploaded once, for [`l2_prefetch`]. The buffers must
/// outlive it (the engine keeps both with the weights).
pub struct L2Ranges {
    pairs: CudaSlice<u64>,
    count: usize,
}

/// Collects the ranges of an [`L2Ranges`].
#[derive(Default)]
pub struct L2RangesBuilder {
    pairs: Vec<u64>,
}

impl L2RangesBuilder {
    /// The first `most` bytes of `buffer` (all of it with `None`).
    pub fn add<T>(&mut self, device: &Device, buffer: &CudaSlice<T>, most: Option<u64>) {
        let len = (buffer.len() * size_of::<T>()) as u64;
        let len = most.map_or(len, |most| most.min(len));
        if len == 0 {
            return;
        }
        let (address, _sync) = buffer.device_ptr(device.stream());
        self.pairs.extend([address, len]);
    }

    /// The ranges on the device; `None` when there are none.
    pub fn build(self, device: &Device) -> Result<Option<L2Ranges>, CudaError> {
        if self.pairs.is_empty() {
            return Ok(None);
        }
        Ok(Some(L2Ranges {
            pairs: device.upload(&self.pairs)?,
            count: self.pairs.len() / 2,
        }))
    }
}

/// Queues a kernel that asks L2 for `ranges` on the device's current stream (the engine
/// queues it on [`Device::on_ahead`]'s branch). A plain launch, without programmatic
/// dependent launch: the kernel reads no other kernel's output, and on its branch it follows
/// an event, not a kernel.
pub fn l2_prefetch(device: &Device, ranges: &L2Ranges) -> Result<(), CudaError> {
    let kernel = device.kernel(L2_PREFETCH_KERNEL)?;
    let cfg = config((PREFETCH_CTAS, 1, 1), PREFETCH_THREADS, 0);
    let overlap = raw::overlap_on();
    raw::overlap_launches(false);
    let launched = raw::launch_l2_prefetch(
        device.stream(),
        kernel,
        cfg,
        &ranges.pairs.as_view(),
        to_i32(ranges.count),
    );
    raw::overlap_launches(overlap);
    launched
}
