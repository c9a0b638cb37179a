//! The GPU side of the expert cache (issue 8): the host copy of a layer's experts in
//! page-locked memory the kernels read over PCIe ([`MappedHost`]), the device tables of a
//! layer's slots ([`CacheTables`]), and the two ops that run between the router and the
//! expert products: [`expert_cache_lookup`] (which slot holds each chosen expert; the
//! [`CachePolicy`] picks the slots that take the misses) and [`expert_cache_fill`] (copies the missing
//! experts into their slots). Both only queue kernels: a decode step with a cache is still
//! one CUDA graph, and the expert products run unchanged on the slot stacks with slot ids,
//! so their results are bit for bit those of a resident stack.

use cudarc::driver::{CudaSlice, CudaView, CudaViewMut, PinnedHostSlice};

use crate::device::Device;
use crate::error::{CudaError, CudaOp};
use crate::layer_launch::{config, to_i32};
use crate::ops::{fits, shape};
use crate::raw;
use crate::source::{EXPERT_CACHE_FILL, EXPERT_CACHE_LOOKUP};

/// Bytes one CTA of the fill kernel copies.
pub(crate) const FILL_CHUNK: usize = 64 << 10;
/// Threads of a fill CTA.
const FILL_THREADS: u32 = 256;
/// Most threads of the one lookup CTA: experts per layer and slots are at most this.
pub const CACHE_MAX_EXPERTS: usize = 1024;

/// Page-locked host memory mapped into the device's address space: the fill kernel reads
/// it over PCIe with no copy engine and no host thread involved.
pub struct MappedHost {
    slice: PinnedHostSlice<u8>,
    address: u64,
    len: usize,
}

impl MappedHost {
    /// `bytes` of zeroed, page-locked, device-mapped host memory.
    pub fn new(device: &Device, bytes: usize) -> Result<MappedHost, CudaError> {
        let (slice, address) = raw::alloc_mapped(device.context(), bytes)?;
        Ok(MappedHost {
            slice,
            address,
            len: bytes,
        })
    }

    /// The bytes, for the host to fill (waits for device work that reads them).
    pub fn bytes_mut(&mut self) -> Result<&mut [u8], CudaError> {
        let all = self
            .slice
            .as_mut_slice()
            .map_err(CudaError::driver("cuEventSynchronize"))?;
        Ok(&mut all[..self.len])
    }

    pub fn len(&self) -> usize {
        self.len
    }

    /// Its address in the device's address space.
    pub(crate) fn address(&self) -> u64 {
        self.address
    }

    pub fn is_empty(&self) -> bool {
        self.len == 0
    }
}

/// Counters of one layer's cache since it was made.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct CacheCounts {
    /// Chosen experts (distinct per lookup) found in a slot.
    pub hits: u64,
    /// Chosen experts copied in.
    pub misses: u64,
    /// Lookups (one per MoE call that ran on the cache).
    pub lookups: u64,
    /// Lookups whose experts did not fit the slots (a bug if ever non-zero: callers split
    /// batches so they fit).
    pub overflows: u64,
    /// Nanoseconds the products of missing experts waited for their copies, from the
    /// lookup's end to the last miss's gate and up rows in (copies made inside the gate/up
    /// launch only: [`crate::moe_gate_up_cached`]).
    pub wait_ns: u64,
    /// Experts copied in by prefetches (lookups of [`LookupKind::Prefetch`]).
    pub prefetched: u64,
    /// Hits on experts a prefetch brought in (each counted once, at its first use).
    pub prefetch_hits: u64,
}

/// Which slots give way to missing experts. Either way the expert products read the same
/// bytes (only the slot holding them differs), so logits do not depend on the policy.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum CachePolicy {
    /// Least recently used: the slots last used longest ago.
    #[default]
    Lru,
    /// Least frequently used, with aging: per expert (cached or not), the lookups that needed
    /// it, every count halved at each `half_life`-th lookup; the slots whose experts have
    /// the fewest, ties to the least recently used. Aging lets the counts follow a change of
    /// topic (without it an expert hot long ago would keep its slot for as long as it took
    /// the new ones to catch up).
    Lfu { half_life: u32 },
}

impl CachePolicy {
    /// The LFU's default half-life in lookups (one per decode token and layer): long enough
    /// that the counts of a steady routing separate the hot experts (tens of uses), short
    /// enough to follow a new topic within about a thousand tokens.
    pub const LFU_HALF_LIFE: u32 = 1024;
    /// LFU with the default half-life.
    pub const LFU: CachePolicy = CachePolicy::Lfu {
        half_life: CachePolicy::LFU_HALF_LIFE,
    };
}

impl std::fmt::Display for CachePolicy {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            CachePolicy::Lru => f.write_str("LRU"),
            CachePolicy::Lfu { half_life } => write!(f, "LFU (half-life {half_life} lookups)"),
        }
    }
}

/// The device tables of one layer's cache of `slots` experts out of `n_expert`.
pub struct CacheTables {
    n_expert: usize,
    slots: usize,
    policy: CachePolicy,
    slot_of: CudaSlice<i32>,
    expert_of: CudaSlice<i32>,
    stamp: CudaSlice<u32>,
    uses: CudaSlice<u32>,
    clock: CudaSlice<u32>,
    pub(crate) stats: CudaSlice<u64>,
    /// 1 for a slot a prefetch filled and no lookup has used since.
    prefetched: CudaSlice<u32>,
    /// The copies-in-the-gate/up launch's counters (`moe_cached.cu`): its CTAs' ticket
    /// (zero between launches), each fill's gate and up chunks written and then the fills
    /// complete (zeroed by the lookup before it).
    pub(crate) ticket: CudaSlice<u32>,
    pub(crate) ready: CudaSlice<u32>,
}

impl CacheTables {
    /// An empty cache replacing slots by `policy`: every slot free, every expert absent.
    pub fn new(
        device: &Device,
        n_expert: usize,
        slots: usize,
        policy: CachePolicy,
    ) -> Result<CacheTables, CudaError> {
        let op = CudaOp::ExpertCache;
        fits(
            op,
            "experts per layer",
            n_expert as u64,
            CACHE_MAX_EXPERTS as u64,
        )?;
        fits(op, "slots", slots as u64, n_expert as u64)?;
        if slots == 0 {
            return Err(CudaError::Shape {
                op,
                what: "slots (at least 1)",
                expected: 1,
                found: 0,
            });
        }
        if policy == (CachePolicy::Lfu { half_life: 0 }) {
            return Err(CudaError::Shape {
                op,
                what: "LFU half-life in lookups (at least 1)",
                expected: 1,
                found: 0,
            });
        }
        Ok(CacheTables {
            n_expert,
            slots,
            policy,
            slot_of: device.upload(&vec![-1i32; n_expert])?,
            expert_of: device.upload(&vec![-1i32; slots])?,
            stamp: device.alloc_zeros(slots)?,
            uses: device.alloc_zeros(n_expert)?,
            clock: device.alloc_zeros(1)?,
            stats: device.alloc_zeros(8)?,
            prefetched: device.alloc_zeros(slots)?,
            ticket: device.alloc_zeros(1)?,
            ready: device.alloc_zeros(slots + 1)?,
        })
    }

    pub fn slots(&self) -> usize {
        self.slots
    }

    pub fn n_expert(&self) -> usize {
        self.n_expert
    }

    pub fn policy(&self) -> CachePolicy {
        self.policy
    }

    /// The counters so far (waits for the queued work).
    pub fn counts(&self, device: &Device) -> Result<CacheCounts, CudaError> {
        let v = device.download(&self.stats)?;
        Ok(CacheCounts {
            hits: v[0],
            misses: v[1],
            lookups: v[2],
            overflows: v[3],
            wait_ns: v[4],
            prefetched: v[6],
            prefetch_hits: v[7],
        })
    }

    /// Which slot holds each expert (-1: none), for tests (waits for the queued work).
    pub fn slot_of(&self, device: &Device) -> Result<Vec<i32>, CudaError> {
        device.download(&self.slot_of)
    }
}

/// What a lookup is for.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum LookupKind {
    /// The experts a call chose (counted as hits and misses, and as uses by the LFU).
    Chosen,
    /// Experts a later call is likely to need (the next layer's router applied to this
    /// layer's input), for [`expert_cache_fill`] to bring in ahead: the same choice of slots,
    /// but no hit, miss, lookup or use is counted; the slots the last lookup used are kept,
    /// and [`CacheCounts`] counts the experts prefetched and, later, the hits on them.
    Prefetch,
}

/// Looks up the experts of `ids` (`[pairs]`, the router's choice, or a prediction: `kind`)
/// in the cache: `slot_ids` gets each pair's slot, `fills` (`2 x min(pairs, slots)`: expert,
/// slot) and `fill_count` the experts to copy in. The distinct experts of `ids` must fit the
/// slots (callers split larger batches); if they do not, the overflow counter says so and
/// the pairs left out get slot -1 (zeros from the expert products). It also zeroes the
/// fills' progress counters that [`crate::moe_gate_up_cached`] counts in.
pub fn expert_cache_lookup(
    device: &Device,
    tables: &mut CacheTables,
    ids: &CudaView<'_, i32>,
    (slot_ids, fills, fill_count): (
        &mut CudaViewMut<'_, i32>,
        &mut CudaViewMut<'_, i32>,
        &mut CudaViewMut<'_, i32>,
    ),
    kind: LookupKind,
) -> Result<(), CudaError> {
    let op = CudaOp::ExpertCache;
    let pairs = ids.len();
    shape(op, "slot ids length (pairs)", pairs, slot_ids.len())?;
    shape(
        op,
        "fills length (2 x min(pairs, slots))",
        2 * pairs.min(tables.slots),
        fills.len(),
    )?;
    shape(op, "fill count length", 1, fill_count.len())?;
    fits(op, "pairs", pairs as u64, i32::MAX as u64)?;
    if pairs == 0 {
        return Ok(());
    }
    let threads = tables.n_expert.max(tables.slots).div_ceil(32) * 32;
    let kernel = device.kernel(EXPERT_CACHE_LOOKUP)?;
    crate::profile::label(|| format!("expert_cache_lookup pairs{pairs} slots{}", tables.slots));
    let args = raw::TableArgs {
        slot_of: &mut tables.slot_of,
        expert_of: &mut tables.expert_of,
        stamp: &mut tables.stamp,
        uses: &mut tables.uses,
        clock: &mut tables.clock,
        stats: &mut tables.stats,
        ready: &mut tables.ready,
        prefetched: &mut tables.prefetched,
    };
    let dims = (to_i32(pairs), to_i32(tables.n_expert), to_i32(tables.slots));
    let policy = match tables.policy {
        CachePolicy::Lru => (0, 1),
        CachePolicy::Lfu { half_life } => (1, half_life),
    };
    raw::launch_expert_cache_lookup(
        device.stream(),
        kernel,
        config((1, 1, 1), threads as u32, 0),
        ids,
        args,
        slot_ids,
        fills,
        fill_count,
        dims,
        policy,
        i32::from(kind == LookupKind::Prefetch),
    )
}

/// One layer's experts on both sides: the host copies (every expert) and the slot stacks on
/// the device (`slots` experts), gate, up and down; `gate_bytes` per expert of gate and of
/// up, `down_bytes` of down. The slot stacks are written by the fill kernel although
/// borrowed shared: the expert products read them as weights (shared borrows), and the
/// caller serializes lookups of a layer (one stream, one lock).
pub struct FillTarget<'a> {
    pub host: [&'a MappedHost; 3],
    pub slots: [&'a CudaSlice<u8>; 3],
    pub gate_bytes: usize,
    pub down_bytes: usize,
}

/// Copies the experts [`expert_cache_lookup`] listed in `fills` from host memory into their
/// slots; `max_fills` is the fills' capacity (`fills.len() / 2`): the grid is sized for it
/// and the CTAs past `*fill_count` return, so the launch can be recorded in a graph.
pub fn expert_cache_fill(
    device: &Device,
    fills: &CudaView<'_, i32>,
    fill_count: &CudaView<'_, i32>,
    target: FillTarget<'_>,
    n_expert: usize,
) -> Result<(), CudaError> {
    let op = CudaOp::ExpertCache;
    let max_fills = fills.len() / 2;
    let copy = check_fills(device, op, fills, fill_count, &target, n_expert)?;
    if max_fills == 0 {
        return Ok(());
    }
    let chunks = copy.gate_chunks.max(copy.down_chunks);
    let kernel = device.kernel(EXPERT_CACHE_FILL)?;
    crate::profile::label(|| format!("expert_cache_fill fills{max_fills} chunks{chunks}"));
    let host = target.host.map(|h| h.address);
    let byte_sizes = (
        target.gate_bytes as i64,
        target.down_bytes as i64,
        FILL_CHUNK as i64,
    );
    raw::launch_expert_cache_fill(
        device.stream(),
        kernel,
        config((chunks, max_fills, 3), FILL_THREADS, 0),
        fills,
        fill_count,
        &host,
        target.slots,
        byte_sizes,
        i32::from(copy.wide),
    )
}

/// How the misses' copies of a fill list are cut: CTAs of [`FILL_CHUNK`] bytes per tensor
/// (gate and up, down), and whether 16-byte loads may be used.
pub(crate) struct FillCopy {
    pub gate_chunks: usize,
    pub down_chunks: usize,
    pub wide: bool,
}

/// Checks the copies of `fills` (`2 x max_fills`: expert, slot) into `target`, a layer of
/// `n_expert` experts: host copies of the whole stacks, slot stacks of at least `max_fills`
/// experts; one count.
pub(crate) fn check_fills(
    device: &Device,
    op: CudaOp,
    fills: &CudaView<'_, i32>,
    fill_count: &CudaView<'_, i32>,
    target: &FillTarget<'_>,
    n_expert: usize,
) -> Result<FillCopy, CudaError> {
    let max_fills = fills.len() / 2;
    let sizes = [target.gate_bytes, target.gate_bytes, target.down_bytes];
    for (i, what) in ["gate", "up", "down"].iter().enumerate() {
        shape(op, what, n_expert * sizes[i], target.host[i].len())?;
        fits(
            op,
            "fills (at most the slots)",
            max_fills as u64,
            (target.slots[i].len() / sizes[i].max(1)) as u64,
        )?;
    }
    shape(op, "fill count length", 1, fill_count.len())?;
    let wide = sizes.iter().all(|b| b % 16 == 0)
        && target
            .slots
            .iter()
            .all(|s| device.address(*s).is_multiple_of(16));
    Ok(FillCopy {
        gate_chunks: target.gate_bytes.div_ceil(FILL_CHUNK),
        down_chunks: target.down_bytes.div_ceil(FILL_CHUNK),
        wide,
    })
}
