//! One decode token's routed gate/up on an expert cache with the cache's copies in the same
//! launch (`moe_cached.cu`, issue 8). [`expert_cache_fill`] copies a token's missing experts
//! before the expert products start, so a layer waits for its copies over PCIe and then
//! computes every expert; here the copies are CTAs of the gate/up launch, and the experts
//! already in their slots compute while the missing ones arrive. Each product CTA is
//! `moe_gate_up_q8_kernel`'s (the same body): the same bits as the fill and the plain
//! launch. `REDLITE_CACHE_OVERLAP=0` keeps the fill kernel.

use std::sync::OnceLock;

use cudarc::driver::{CudaView, CudaViewMut};

use crate::device::Device;
use crate::error::{CudaError, CudaOp};
use crate::expert_cache::{check_fills, CacheTables, FillTarget, FILL_CHUNK};
use crate::layer_launch::{to_i32, CachedCopies};
use crate::moe_launch::gate_up_is_q8;
use crate::moe_ops::{gate_up, SharedGateUp};
use crate::ops::WeightMatrix;
use crate::q8_input::Q8Rows;
use crate::raw;

/// The copies a [`moe_gate_up_cached`] launch makes: the fills the lookup on `tables` wrote
/// (`fills`: `2 x max_fills`, expert and slot; `fill_count`) into `target`, whose gate and up
/// slot stacks are the launch's `gate` and `up`.
pub struct CacheCopies<'a, 'b> {
    pub tables: &'a mut CacheTables,
    pub fills: &'a CudaView<'b, i32>,
    pub fill_count: &'a CudaView<'b, i32>,
    pub target: FillTarget<'a>,
}

/// Whether [`moe_gate_up_cached`] takes `gate` for a batch of `tokens`: one token, stacks the
/// q8 gate/up kernel reads, and `REDLITE_CACHE_OVERLAP` not 0.
pub fn moe_gate_up_cached_takes(gate: &WeightMatrix<'_>, tokens: usize) -> bool {
    static ON: OnceLock<bool> = OnceLock::new();
    let on = *ON.get_or_init(|| std::env::var("REDLITE_CACHE_OVERLAP").as_deref() != Ok("0"));
    on && tokens == 1 && gate_up_is_q8(gate.ty, gate.dots)
}

/// [`crate::moe_gate_up`] of one token on the slot stacks `gate`, `up` with slot ids
/// `slot_ids` (the lookup's), which also copies the lookup's misses (gate, up and down) into
/// their slots: the hits' products run while the misses' bytes come over PCIe, and a CTA
/// of a missing expert waits for its rows. The down product after it reads the copied down
/// rows as after [`crate::expert_cache_fill`].
#[allow(clippy::too_many_arguments)]
pub fn moe_gate_up_cached(
    device: &Device,
    (gate, up): (&WeightMatrix<'_>, &WeightMatrix<'_>),
    ff: usize,
    slot_ids: &CudaView<'_, i32>,
    (x, q8): (&CudaView<'_, f32>, Option<&Q8Rows<'_>>),
    act: &mut CudaViewMut<'_, f32>,
    shared: Option<SharedGateUp<'_, '_>>,
    copies: CacheCopies<'_, '_>,
) -> Result<(), CudaError> {
    let op = CudaOp::ExpertCache;
    let tokens = x.len() / gate.cols.max(1);
    if !moe_gate_up_cached_takes(gate, tokens) {
        return Err(CudaError::UnsupportedType { op, ty: gate.ty });
    }
    let CacheCopies {
        tables,
        fills,
        fill_count,
        target,
    } = copies;
    let n_expert = tables.n_expert();
    let copy = check_fills(device, op, fills, fill_count, &target, n_expert)?;
    // The copy CTAs write the stacks the product CTAs read.
    let same = |slots: &cudarc::driver::CudaSlice<u8>, m: &WeightMatrix<'_>| {
        device.address(slots) == device.address(&m.bytes) && slots.len() == m.bytes.len()
    };
    if !same(target.slots[0], gate) || !same(target.slots[1], up) {
        return Err(CudaError::Shape {
            op,
            what: "slot stacks (the gate/up stacks of the launch)",
            expected: target.slots[0].len(),
            found: gate.bytes.len(),
        });
    }
    let max_fills = fills.len() / 2;
    let args = raw::CachedCopyArgs {
        fills,
        fill_count,
        host: target.host.map(|h| h.address()),
        down: target.slots[2],
        sizes: (
            target.gate_bytes as i64,
            target.down_bytes as i64,
            FILL_CHUNK as i64,
        ),
        wide: i32::from(copy.wide),
        counts: (
            to_i32(max_fills),
            to_i32(copy.gate_chunks),
            to_i32(copy.down_chunks),
        ),
        ticket: &mut tables.ticket,
        ready: &mut tables.ready,
        stats: &mut tables.stats,
    };
    let copies = CachedCopies {
        args,
        chunks: (copy.gate_chunks, copy.down_chunks),
    };
    gate_up(
        device,
        (gate, up),
        ff,
        slot_ids,
        (x, q8),
        act,
        shared,
        Some(copies),
    )
}
