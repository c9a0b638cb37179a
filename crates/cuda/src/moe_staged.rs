//! Whether a one-token expert down launch takes the staged kernel (`moe_staged.cu`,
//! `REDLITE_DOWN_STAGED=4|8`), and its shared memory.

use crate::device::Device;
use crate::layer_launch::{q8_shared_bytes, SHARED_MAX_BYTES};
use crate::source::{self, WeightKind};
use cudarc::driver::CudaView;
use std::cell::Cell;

/// Terms (routed experts and the shared one) the staged kernel holds ids for
/// (`DOWN_STAGED_TERMS`).
const STAGED_TERMS: usize = 16;

/// What a staged launch needs from the host.
pub(crate) struct Staged {
    pub kernel: String,
    pub warps: u32,
    pub shared_bytes: usize,
}

/// The staged down for an EARLY launch of `kind` (`lanes` lanes a row, `items` items a lane:
/// one is built, for the types of `staged_down_built`), if the switch asks for it and the copies can be 16-byte chunks: a CTA's rows of an expert
/// (and of the shared expert) a multiple of 16 bytes from 16-byte aligned bases, whole CTAs,
/// at most `STAGED_TERMS` terms and the default shared memory limit. `None`: the preloading
/// kernel.
#[allow(clippy::too_many_arguments)]
pub(crate) fn staged_down(
    device: &Device,
    kind: WeightKind,
    (lanes, items): (usize, usize),
    down: &CudaView<'_, u8>,
    shared_down: Option<&CudaView<'_, u8>>,
    (rows, ff, used): (usize, usize, usize),
    shared_ff: usize,
) -> Option<Staged> {
    let warps = STAGED_HERE
        .get()
        .unwrap_or_else(source::down_staged_warps)
        .filter(|_| items == 1 && source::staged_down_built(kind.ty))?;
    let rows_per_cta = warps as usize * 32 / lanes;
    let row_bytes = ff / kind.ty.block_values() * kind.ty.block_bytes();
    let shared_row_bytes = shared_ff / kind.ty.block_values() * kind.ty.block_bytes();
    let slab = rows_per_cta * row_bytes;
    let shared_slab = rows_per_cta * shared_row_bytes;
    let aligned = |address: u64| address.is_multiple_of(16);
    let fits = rows.is_multiple_of(rows_per_cta)
        && slab.is_multiple_of(16)
        && shared_slab.is_multiple_of(16)
        && (rows * row_bytes).is_multiple_of(16)
        && aligned(device.address(down))
        && shared_down.is_none_or(|s| aligned(device.address(s)))
        && used + usize::from(shared_down.is_some()) <= STAGED_TERMS;
    let values = used * ff + if shared_down.is_some() { shared_ff } else { 0 };
    let shared_bytes = q8_shared_bytes(values) + used * slab + shared_slab;
    (fits && shared_bytes <= SHARED_MAX_BYTES).then(|| Staged {
        kernel: source::moe_down_q8_staged_kernel(kind, lanes, items, warps),
        warps,
        shared_bytes,
    })
}

thread_local! {
    /// This thread's choice over the environment's (`with_staged`).
    static STAGED_HERE: Cell<Option<Option<u32>>> = const { Cell::new(None) };
}

/// Runs `f` with the staged down on CTAs of `warps` warps (4 or 8), or off (`None`), for
/// launches from this thread whatever the environment says: the kernel tests compare it
/// with the preloading down bit for bit in one process.
#[doc(hidden)]
pub fn with_staged<R>(warps: Option<u32>, f: impl FnOnce() -> R) -> R {
    struct Restore(Option<Option<u32>>);
    impl Drop for Restore {
        fn drop(&mut self) {
            STAGED_HERE.set(self.0);
        }
    }
    let _restore = Restore(STAGED_HERE.replace(Some(warps)));
    f()
}
