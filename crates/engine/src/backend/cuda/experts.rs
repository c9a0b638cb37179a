//! The expert store of the CUDA backend (issue 8): where each MoE layer's routed experts
//! live. Resident: the three expert stacks uploaded whole. Cached: the layer's stacks on the
//! GPU hold `slots` experts (the slot stacks, which the expert products read exactly as they
//! read a resident stack, with slot ids in place of expert ids), the whole stacks stay in
//! page-locked host memory, and every MoE call looks its experts up first (misses copied
//! in by a kernel reading host memory over PCIe; the least frequently or, with
//! `REDLITE_CACHE_POLICY=lru`, least recently used slots give way). Same kernels, same
//! order of every sum: logits are bit for bit those of residency, under either policy.
//! On the CPU (`host_moe`): the MoE blocks computed by the CPU backend from the file.

use std::cell::RefCell;
use std::collections::HashMap;

use rayon::prelude::*;

use crate::error::{EngineError, Result};
use redlite_cuda::{
    expert_cache_fill, expert_cache_lookup, CacheCopies, CacheCounts, CachePolicy, CacheTables,
    CudaSlice, CudaView, CudaViewMut, Device, FillTarget, LookupKind, MappedHost, SKIP_PAIR,
};

/// Where the routed experts of every MoE layer live.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum ExpertResidency {
    /// Every expert on the GPU.
    #[default]
    Resident,
    /// `slots` experts of every MoE layer on the GPU (at least the router's top-k, fewer than
    /// the layer's experts), the rest copied in on demand; `policy` picks the slots that
    /// give way.
    Cache { slots: usize, policy: CachePolicy },
    /// Every routed expert stays in host memory (the file's mapping) and each MoE block runs
    /// on the CPU (`host_moe`): the GPU holds the rest of the model. `--experts cpu`, for a
    /// GPU too small even for a cache.
    Cpu,
}

/// The replacement policy `REDLITE_CACHE_POLICY` names: `lfu` (or unset: the default; least
/// frequently used, counts halved every [`CachePolicy::LFU_HALF_LIFE`] lookups) or `lru`.
/// Anything else is refused. LFU is the default by measurement (docs/PERF.md, seventh
/// session): on the H200 it decoded 2–4 % faster than LRU in all four cases measured
/// (uniform and skewed routing, 12- and 48-layer files) and copied ~24 % fewer bytes a token
/// under the skew; prompts moved within the runs' noise.
pub fn cache_policy_from_env() -> Result<CachePolicy> {
    match std::env::var("REDLITE_CACHE_POLICY").as_deref() {
        Err(_) | Ok("") | Ok("lfu") => Ok(CachePolicy::LFU),
        Ok("lru") => Ok(CachePolicy::Lru),
        Ok(other) => Err(EngineError::BadConfig(format!(
            "REDLITE_CACHE_POLICY={other}: expected lru or lfu"
        ))),
    }
}

/// The suffixes of a layer's expert stacks, in the order the fill kernel takes them.
pub const EXPERT_STACKS: [&str; 3] = [
    "ffn_gate_exps.weight",
    "ffn_up_exps.weight",
    "ffn_down_exps.weight",
];

/// The host copies made while the weights load (by tensor name), turned into per-layer
/// caches once every stack is in.
#[derive(Default)]
pub struct HostStacks {
    stacks: RefCell<HashMap<String, MappedHost>>,
}

impl HostStacks {
    /// Copies a whole stack into page-locked host memory and keeps it under `name`. The
    /// copy runs on every core: `bytes` is the file's mapping, and one thread faulting its
    /// pages in and copying them made loading a cached 45 GiB file take minutes.
    pub fn keep(&self, device: &Device, name: &str, bytes: &[u8]) -> Result<()> {
        const PIECE: usize = 16 << 20;
        let mut host = MappedHost::new(device, bytes.len())?;
        host.bytes_mut()?
            .par_chunks_mut(PIECE)
            .zip(bytes.par_chunks(PIECE))
            .for_each(|(to, from)| to.copy_from_slice(from));
        self.stacks.borrow_mut().insert(name.to_string(), host);
        Ok(())
    }

    fn take(&self, name: &str) -> Result<MappedHost> {
        self.stacks
            .borrow_mut()
            .remove(name)
            .ok_or_else(|| EngineError::MissingTensor { name: name.into() })
    }
}

/// Whether `name` is a routed-expert stack (which a cache keeps on the host).
pub fn is_expert_stack(name: &str) -> bool {
    EXPERT_STACKS.iter().any(|s| name.ends_with(s))
}

/// One MoE layer's cache: its tables on the device and the host copies of its stacks.
pub struct LayerCache {
    tables: CacheTables,
    host: [MappedHost; 3],
    gate_bytes: usize,
    down_bytes: usize,
}

impl LayerCache {
    /// The cache of block `layer` (`n_expert` experts, `slots` of them on the GPU, replaced
    /// by `policy`), from the host copies `stacks` made while loading.
    pub fn new(
        device: &Device,
        n_expert: usize,
        layer: usize,
        (slots, policy): (usize, CachePolicy),
        stacks: &HostStacks,
    ) -> Result<LayerCache> {
        let name = |s: &str| format!("blk.{layer}.{s}");
        let host = [
            stacks.take(&name(EXPERT_STACKS[0]))?,
            stacks.take(&name(EXPERT_STACKS[1]))?,
            stacks.take(&name(EXPERT_STACKS[2]))?,
        ];
        let per_expert = |h: &MappedHost| h.len() / n_expert.max(1);
        Ok(LayerCache {
            tables: CacheTables::new(device, n_expert, slots, policy)?,
            gate_bytes: per_expert(&host[0]),
            down_bytes: per_expert(&host[2]),
            host,
        })
    }

    pub fn slots(&self) -> usize {
        self.tables.slots()
    }

    pub fn counts(&self, device: &Device) -> Result<CacheCounts> {
        Ok(self.tables.counts(device)?)
    }

    /// Bytes one miss copies (gate, up and down of one expert).
    pub fn expert_bytes(&self) -> u64 {
        (2 * self.gate_bytes + self.down_bytes) as u64
    }

    /// Which slot holds each expert (-1: none); for tests.
    pub fn slot_of(&self, device: &Device) -> Result<Vec<i32>> {
        Ok(self.tables.slot_of(device)?)
    }

    /// Looks `ids` up, copies the misses into `stacks` (gate, up, down slot stacks) and
    /// leaves each pair's slot in `slot_ids`. `fills` holds at least 2 x min(pairs, slots).
    pub fn bring_in(
        &mut self,
        device: &Device,
        ids: &CudaView<'_, i32>,
        slot_ids: &mut CudaViewMut<'_, i32>,
        (fills, fill_count): (&mut CudaSlice<i32>, &mut CudaSlice<i32>),
        stacks: [&CudaSlice<u8>; 3],
    ) -> Result<()> {
        self.look_up(device, ids, slot_ids, (fills, fill_count))?;
        device.mark("expert cache copies");
        self.fill(device, ids.len(), (fills, fill_count), stacks)
    }

    /// Looks `ids` up: each pair's slot into `slot_ids`, the misses to copy into `fills`
    /// (their first [`LayerCache::fills_len`] values) and `fill_count`, for
    /// [`LayerCache::copies`] or the fill of [`LayerCache::bring_in`].
    pub fn look_up(
        &mut self,
        device: &Device,
        ids: &CudaView<'_, i32>,
        slot_ids: &mut CudaViewMut<'_, i32>,
        (fills, fill_count): (&mut CudaSlice<i32>, &mut CudaSlice<i32>),
    ) -> Result<()> {
        device.mark("expert cache lookup");
        self.look_up_for(
            device,
            ids,
            (slot_ids, fills, fill_count),
            LookupKind::Chosen,
        )
    }

    fn look_up_for(
        &mut self,
        device: &Device,
        ids: &CudaView<'_, i32>,
        out: LookupOut<'_, '_>,
        kind: LookupKind,
    ) -> Result<()> {
        let (slot_ids, fills, fill_count) = out;
        let mut fills = fills.slice_mut(..self.fills_len(ids.len()));
        let mut count = fill_count.slice_mut(..1);
        let out = (slot_ids, &mut fills, &mut count);
        expert_cache_lookup(device, &mut self.tables, ids, out, kind)?;
        Ok(())
    }

    /// Copies the misses a lookup of `pairs` pairs listed in `fills` into `stacks`.
    fn fill(
        &self,
        device: &Device,
        pairs: usize,
        (fills, fill_count): (&CudaSlice<i32>, &CudaSlice<i32>),
        stacks: [&CudaSlice<u8>; 3],
    ) -> Result<()> {
        let target = fill_target(&self.host, (self.gate_bytes, self.down_bytes), stacks);
        let fills = fills.slice(..self.fills_len(pairs));
        let n_expert = self.tables.n_expert();
        expert_cache_fill(device, &fills, &fill_count.slice(..1), target, n_expert)?;
        Ok(())
    }

    /// Brings in ahead the experts of `ids` (a prediction of a later call's: `prefetch.rs`)
    /// that are not cached: a lookup of [`LookupKind::Prefetch`], then the fill.
    pub fn prefetch(
        &mut self,
        device: &Device,
        ids: &CudaView<'_, i32>,
        out: LookupOut<'_, '_>,
        stacks: [&CudaSlice<u8>; 3],
    ) -> Result<()> {
        let pairs = ids.len();
        let (slot_ids, fills, fill_count) = out;
        self.look_up_for(
            device,
            ids,
            (slot_ids, fills, fill_count),
            LookupKind::Prefetch,
        )?;
        self.fill(device, pairs, (fills, fill_count), stacks)
    }

    /// The values of `fills` a lookup of `pairs` pairs writes: an expert and a slot per
    /// possible miss.
    pub fn fills_len(&self, pairs: usize) -> usize {
        2 * pairs.min(self.slots())
    }

    /// The copies of the last lookup's misses for `redlite_cuda::moe_gate_up_cached`, which
    /// makes them in the gate/up launch; `fills` as [`LayerCache::fills_len`] says.
    pub fn copies<'a, 'b>(
        &'a mut self,
        (fills, fill_count): (&'a CudaView<'b, i32>, &'a CudaView<'b, i32>),
        stacks: [&'a CudaSlice<u8>; 3],
    ) -> CacheCopies<'a, 'b> {
        CacheCopies {
            target: fill_target(&self.host, (self.gate_bytes, self.down_bytes), stacks),
            tables: &mut self.tables,
            fills,
            fill_count,
        }
    }
}

/// A lookup's outputs: each pair's slot, the misses to copy (expert, slot) and their count.
type LookupOut<'a, 'b> = (
    &'a mut CudaViewMut<'b, i32>,
    &'a mut CudaSlice<i32>,
    &'a mut CudaSlice<i32>,
);

/// Where a layer's misses are copied from (`host`) and to (`stacks`: gate, up, down slot
/// stacks), with each expert's gate (= up) and down bytes.
fn fill_target<'a>(
    host: &'a [MappedHost; 3],
    (gate_bytes, down_bytes): (usize, usize),
    stacks: [&'a CudaSlice<u8>; 3],
) -> FillTarget<'a> {
    FillTarget {
        host: [&host[0], &host[1], &host[2]],
        slots: stacks,
        gate_bytes,
        down_bytes,
    }
}

/// The waves that bring a prompt's experts through a cache of `slots`: each wave's ids
/// (`ids`, `[tokens][used]`, with the pairs of other waves' experts marked [`SKIP_PAIR`]),
/// every chosen expert in exactly one wave, at most `slots` experts per wave. The experts
/// already cached (`slot_of[e] >= 0`) go first, so they are used before anything evicts
/// them; ids out of range stay as they are in every wave (their products are zeros).
pub fn plan_waves(ids: &[i32], slot_of: &[i32], slots: usize) -> Vec<Vec<i32>> {
    let n_expert = slot_of.len();
    let valid = |e: i32| usize::try_from(e).is_ok_and(|e| e < n_expert);
    let mut needed: Vec<i32> = ids.iter().copied().filter(|&e| valid(e)).collect();
    needed.sort_unstable();
    needed.dedup();
    let cached = |e: &i32| slot_of[*e as usize] >= 0;
    let order: Vec<i32> = needed
        .iter()
        .copied()
        .filter(cached)
        .chain(needed.iter().copied().filter(|e| !cached(e)))
        .collect();
    let mut wave_of = vec![usize::MAX; n_expert];
    for (i, &e) in order.iter().enumerate() {
        wave_of[e as usize] = i / slots.max(1);
    }
    let waves = order.len().div_ceil(slots.max(1)).max(1);
    (0..waves)
        .map(|w| {
            ids.iter()
                .map(|&e| match valid(e) && wave_of[e as usize] != w {
                    true => SKIP_PAIR,
                    false => e,
                })
                .collect()
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn waves_cover_each_pair_once_with_cached_experts_first() {
        // 2 experts per token, 8 experts, 3 slots; experts 5 and 1 are cached.
        let ids = [0, 1, 1, 2, 3, 5, 5, 0, 9, 6];
        let mut slot_of = vec![-1; 8];
        slot_of[5] = 0;
        slot_of[1] = 2;
        let waves = plan_waves(&ids, &slot_of, 3);
        // Order: 1, 5 (cached), then 0, 2, 3, 6: waves {1, 5, 0}, {2, 3, 6}.
        assert_eq!(waves.len(), 2);
        let s = SKIP_PAIR;
        assert_eq!(waves[0], vec![0, 1, 1, s, s, 5, 5, 0, 9, s]);
        assert_eq!(waves[1], vec![s, s, s, 2, 3, s, s, s, 9, 6]);
        for (p, &e) in ids.iter().enumerate() {
            let kept = waves.iter().filter(|w| w[p] == e).count();
            assert!(
                kept == 1 || e == 9,
                "pair {p} (expert {e}) kept in {kept} waves"
            );
        }
    }

    #[test]
    fn one_wave_when_everything_fits() {
        let waves = plan_waves(&[2, 3, 3, 2], &[-1; 4], 2);
        assert_eq!(waves, vec![vec![2, 3, 3, 2]]);
        assert_eq!(plan_waves(&[], &[-1; 4], 2), vec![Vec::<i32>::new()]);
    }
}
