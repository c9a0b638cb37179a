//! The expert cache's unsafe calls: page-locked host memory mapped into the device's
//! address space, and the launches of `expert_cache.cu`.

use super::launcher::Launch;
use super::layers::{builder, launched};
use crate::error::CudaError;
use cudarc::driver::{
    sys, CudaContext, CudaFunction, CudaSlice, CudaStream, CudaView, CudaViewMut, LaunchConfig,
    PinnedHostSlice, PushKernelArg,
};
use std::sync::Arc;

/// `bytes` of page-locked host memory that kernels can read (`CU_MEMHOSTALLOC_DEVICEMAP`),
/// and its address in the device's address space.
pub(crate) fn alloc_mapped(
    context: &Arc<CudaContext>,
    bytes: usize,
) -> Result<(PinnedHostSlice<u8>, u64), CudaError> {
    // SAFETY: cuMemHostAlloc hands out fresh pages, which the kernel zero-fills when it
    // pins them, so the u8 contents are initialized (zeros) before anyone reads them.
    let mut slice = unsafe {
        context.alloc_pinned_with_flags::<u8>(
            bytes.max(1),
            sys::CU_MEMHOSTALLOC_DEVICEMAP | sys::CU_MEMHOSTALLOC_PORTABLE,
        )
    }
    .map_err(CudaError::driver("cuMemHostAlloc"))?;
    let host = slice
        .as_mut_ptr()
        .map_err(CudaError::driver("cuEventSynchronize"))?;
    let mut address: sys::CUdeviceptr = 0;
    // SAFETY: `host` is the base of a live DEVICEMAP allocation of this context (bound to
    // the thread by the allocation above); `address` is valid for writes; flags must be 0.
    unsafe { sys::cuMemHostGetDevicePointer_v2(&mut address, host.cast(), 0) }
        .result()
        .map_err(CudaError::driver("cuMemHostGetDevicePointer"))?;
    Ok((slice, address))
}

/// The tables of one layer's cache (`expert_cache.cu` describes them).
pub(crate) struct TableArgs<'a> {
    pub slot_of: &'a mut CudaSlice<i32>,
    pub expert_of: &'a mut CudaSlice<i32>,
    pub stamp: &'a mut CudaSlice<u32>,
    pub uses: &'a mut CudaSlice<u32>,
    pub clock: &'a mut CudaSlice<u32>,
    pub stats: &'a mut CudaSlice<u64>,
    pub ready: &'a mut CudaSlice<u32>,
    pub prefetched: &'a mut CudaSlice<u32>,
}

/// The replacement policy's arguments: `lfu` (0: LRU, 1: LFU) and the LFU's half-life.
pub(crate) type PolicyArgs = (i32, u32);

/// `expert_cache_lookup_kernel(ids, pairs, n_expert, slots, slot_of, expert_of, stamp,
/// uses, clock, slot_ids, fills, fill_count, stats, lfu, half_life, ready, ready_len,
/// prefetched, prefetch)`, with ready_len the fills' capacity.
#[allow(clippy::too_many_arguments)]
pub(crate) fn launch_expert_cache_lookup(
    stream: &CudaStream,
    kernel: &CudaFunction,
    config: LaunchConfig,
    ids: &CudaView<'_, i32>,
    tables: TableArgs<'_>,
    slot_ids: &mut CudaViewMut<'_, i32>,
    fills: &mut CudaViewMut<'_, i32>,
    fill_count: &mut CudaViewMut<'_, i32>,
    (pairs, n_expert, slots): (i32, i32, i32),
    (lfu, half_life): PolicyArgs,
    prefetch: i32,
) -> Result<(), CudaError> {
    let mut launch = builder(stream, kernel);
    launch
        .arg(ids)
        .arg(&pairs)
        .arg(&n_expert)
        .arg(&slots)
        .arg(tables.slot_of)
        .arg(tables.expert_of)
        .arg(tables.stamp)
        .arg(tables.uses)
        .arg(tables.clock)
        .arg(slot_ids)
        .arg(fills)
        .arg(fill_count)
        .arg(tables.stats)
        .arg(&lfu)
        .arg(&half_life);
    let ready_len = pairs.min(slots);
    launch.arg(tables.ready).arg(&ready_len);
    launch.arg(tables.prefetched).arg(&prefetch);
    // SAFETY: arguments match the signature; one CTA of at least max(n_expert, slots) and at
    // most 1024 threads (the op entry); ids and slot_ids hold `pairs`, slot_of and uses
    // n_expert, expert_of, stamp and prefetched `slots`, ready slots + 1 (the kernel zeroes
    // ready_len + 1 ≤ slots + 1 of them), fills 2 x min(pairs, slots), clock one, stats
    // eight values; half_life is at least 1 (the tables' constructor).
    launched(stream, "cuLaunchKernel(expert_cache_lookup)", unsafe {
        launch.launch(config)
    })
}

/// The byte sizes of one expert's gate (= up) and down rows, and the copy chunk per CTA.
pub(crate) type FillSizes = (i64, i64, i64);

/// `expert_cache_fill_kernel(fills, fill_count, host_gate, host_up, host_down, gate, up,
/// down, gate_bytes, down_bytes, chunk, wide)`.
#[allow(clippy::too_many_arguments)]
pub(crate) fn launch_expert_cache_fill(
    stream: &CudaStream,
    kernel: &CudaFunction,
    config: LaunchConfig,
    fills: &CudaView<'_, i32>,
    fill_count: &CudaView<'_, i32>,
    host: &[u64; 3],
    slots: [&CudaSlice<u8>; 3],
    (gate_bytes, down_bytes, chunk): FillSizes,
    wide: i32,
) -> Result<(), CudaError> {
    let [gate, up, down] = slots;
    let mut launch = builder(stream, kernel);
    launch
        .arg(fills)
        .arg(fill_count)
        .arg(&host[0])
        .arg(&host[1])
        .arg(&host[2])
        .arg(gate)
        .arg(up)
        .arg(down)
        .arg(&gate_bytes)
        .arg(&down_bytes)
        .arg(&chunk)
        .arg(&wide);
    // SAFETY: arguments match the signature (the slot stacks are written through shared
    // references: device memory the host never reads, written only by this kernel on the
    // device's one stream, whose owner serializes the calls); the host addresses are live mapped allocations
    // of n_expert experts each, the slot buffers hold `slots` experts, and the fills (written
    // by the lookup kernel) name experts and slots in range; grid.y is at most the fills'
    // capacity, and CTAs past `*fill_count` return; `wide` only when every size and base is
    // a multiple of 16 (the op entry).
    launched(stream, "cuLaunchKernel(expert_cache_fill)", unsafe {
        launch.launch(config)
    })
}

/// The misses' copies done by `moe_gate_up_q8_cached_kernel` (`moe_cached.cu`): the lookup's
/// fills and count, the host copies (device addresses), the down slot stack, the sizes, the
/// CTAs per tensor and the launch's counters.
pub(crate) struct CachedCopyArgs<'a, 'b> {
    pub fills: &'a CudaView<'b, i32>,
    pub fill_count: &'a CudaView<'b, i32>,
    pub host: [u64; 3],
    pub down: &'a CudaSlice<u8>,
    pub sizes: FillSizes,
    pub wide: i32,
    /// max_fills, gate_chunks, down_chunks.
    pub counts: (i32, i32, i32),
    pub ticket: &'a mut CudaSlice<u32>,
    pub ready: &'a mut CudaSlice<u32>,
    pub stats: &'a mut CudaSlice<u64>,
}

/// Pushes the copies' arguments of `moe_gate_up_q8_cached_kernel` after the gate/up ones
/// (`launch_moe_gate_up_v3`): fills, fill_count, host_gate, host_up, host_down, down,
/// gate_bytes, down_bytes, chunk, wide, max_fills, gate_chunks, down_chunks, ticket, ready,
/// stats, grid_x, grid_y.
pub(crate) fn push_cached_copies<'a>(
    launch: &mut Launch<'a>,
    copies: &'a mut CachedCopyArgs<'_, '_>,
    grid: &'a (i32, i32),
) {
    launch
        .arg(copies.fills)
        .arg(copies.fill_count)
        .arg(&copies.host[0])
        .arg(&copies.host[1])
        .arg(&copies.host[2])
        .arg(copies.down)
        .arg(&copies.sizes.0)
        .arg(&copies.sizes.1)
        .arg(&copies.sizes.2)
        .arg(&copies.wide)
        .arg(&copies.counts.0)
        .arg(&copies.counts.1)
        .arg(&copies.counts.2)
        .arg(&mut *copies.ticket)
        .arg(&mut *copies.ready)
        .arg(&mut *copies.stats)
        .arg(&grid.0)
        .arg(&grid.1);
}
