//! The expert cache's prefetch (issue 8, `REDLITE_CACHE_PREFETCH=1`): while a decode token's
//! MoE block computes, the next block's router applied to this block's input predicts the
//! next block's experts, and those not in its cache are copied in on the device's side
//! stream, beside this block's experts and the next block's mixer, instead of on the
//! critical path of the next block. It pays where the prediction is mostly right: a
//! trained model's residual stream changes little from one block to the next, but on the
//! random weights of a synthetic file half the prefetched experts are used and decode is
//! 7.6 % slower (docs/PERF.md, eleventh session), hence off by default. A wrong guess costs
//! PCIe bytes and a slot, never a result: the next block's own lookup still finds or copies
//! every expert it chooses, so logits are the bits of residency either way.
//!
//! Ordering: the side work starts after everything queued so far (the input `h` is ready);
//! the main stream waits for the side's router product before anything can overwrite `h`
//! (the end of this block's MoE, [`Prefetch::finish`]) and for the copies before the next
//! block's lookup (`Device::join_side` at the start of every MoE block). In between the side
//! stream only touches the next block's cache and these buffers.

use std::sync::OnceLock;

use redlite_cuda::{matmul, moe_route, CudaSlice, CudaView, Device, WeightMatrix};

use crate::backend::cuda::experts::LayerCache;
use crate::backend::cuda::weights::MoeWeights;
use crate::error::Result;
use crate::model::config::HybridConfig;

/// Whether decode steps prefetch the next block's experts by default
/// (`REDLITE_CACHE_PREFETCH=1`; `CudaBackend::set_prefetch` decides per backend).
pub fn prefetch_on() -> bool {
    static ON: OnceLock<bool> = OnceLock::new();
    *ON.get_or_init(|| std::env::var("REDLITE_CACHE_PREFETCH").as_deref() == Ok("1"))
}

/// The side stream's buffers (one token's router logits and routing, the prefetch's lookup
/// and copies); a few KiB, inside the plan's headroom.
pub struct PrefetchBuffers {
    logits: CudaSlice<f32>,
    /// The shared expert's gate logit the routing kernel also takes (unused here).
    shared_logit: CudaSlice<f32>,
    shared_weight: CudaSlice<f32>,
    ids: CudaSlice<i32>,
    weights: CudaSlice<f32>,
    slot_ids: CudaSlice<i32>,
    fills: CudaSlice<i32>,
    fill_count: CudaSlice<i32>,
}

impl PrefetchBuffers {
    pub fn new(device: &Device, c: &HybridConfig) -> Result<PrefetchBuffers> {
        let used = c.n_expert_used;
        Ok(PrefetchBuffers {
            logits: device.alloc_zeros(c.n_expert)?,
            shared_logit: device.alloc_zeros(1)?,
            shared_weight: device.alloc_zeros(1)?,
            ids: device.alloc_zeros(used)?,
            weights: device.alloc_zeros(used)?,
            slot_ids: device.alloc_zeros(used)?,
            fills: device.alloc_zeros(2 * used)?,
            fill_count: device.alloc_zeros(1)?,
        })
    }
}

/// The next MoE block: its router, its cache and its slot stacks (gate, up, down).
pub struct NextBlock<'a> {
    pub router: WeightMatrix<'a>,
    pub cache: &'a mut LayerCache,
    pub stacks: [&'a CudaSlice<u8>; 3],
}

impl<'a> NextBlock<'a> {
    /// The next block of weights `w` and cache `cache`.
    pub fn of(w: &'a MoeWeights, cache: &'a mut LayerCache) -> NextBlock<'a> {
        NextBlock {
            router: w.router.view(),
            cache,
            stacks: [w.gate_exps.bytes(), w.up_exps.bytes(), w.down_exps.bytes()],
        }
    }
}

/// A prefetch under way on the side stream.
#[must_use = "the main stream must wait for the side's read of h (Prefetch::finish)"]
pub struct Prefetch;

impl Prefetch {
    /// Queues on the side stream: the next block's router on `h` (this block's one normed
    /// token), its top-k, then the lookup and copies of those experts in its cache.
    pub fn start(
        device: &Device,
        next: NextBlock<'_>,
        b: &mut PrefetchBuffers,
        h: &CudaView<'_, f32>,
    ) -> Result<Prefetch> {
        device.on_side(|| -> Result<()> {
            matmul(device, &next.router, h, &mut b.logits.slice_mut(..))?;
            moe_route(
                device,
                &b.logits.slice(..),
                &b.shared_logit.slice(..),
                &mut b.ids.slice_mut(..),
                &mut b.weights.slice_mut(..),
                &mut b.shared_weight.slice_mut(..),
            )?;
            device.mark_side()?;
            next.cache.prefetch(
                device,
                &b.ids.slice(..),
                (
                    &mut b.slot_ids.slice_mut(..),
                    &mut b.fills,
                    &mut b.fill_count,
                ),
                next.stacks,
            )
        })?;
        Ok(Prefetch)
    }

    /// The main stream waits for the side's read of `h` (call before `h` can be written).
    pub fn finish(self, device: &Device) -> Result<()> {
        Ok(device.wait_side()?)
    }
}

/// Block `layer`'s cache and, where prefetching applies (`prefetching`, and the next block
/// of the main stack has a cache), the next block's for [`NextBlock`]: `caches` is indexed
/// by block (the MTP block, at `n_layer`, is never a "next").
pub fn split_caches(
    caches: &mut [Option<LayerCache>],
    (layer, n_layer): (usize, usize),
    prefetching: bool,
) -> (Option<&mut LayerCache>, Option<&mut LayerCache>) {
    let Some((here, later)) = caches.get_mut(layer..).and_then(|c| c.split_first_mut()) else {
        return (None, None);
    };
    let next = later
        .first_mut()
        .and_then(|c| c.as_mut())
        .filter(|_| layer + 1 < n_layer && prefetching);
    (here.as_mut(), next)
}
