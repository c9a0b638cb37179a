//! The MoE block on the GPU (spec §3.4), mirroring `cpu::moe`: router logits, then softmax,
//! top-k and renormalization on the GPU (`moe_route.rs`); the selected experts' gate/up with
//! SwiGLU fused; their down projections with the weighted sum fused; the shared expert
//! through the same kernels (a stack of one expert) with its sigmoid gate as the weight,
//! accumulated.
//! Seven launches per layer, no host round trip; five when the shared expert rides along in
//! the routed experts' gate/up and down launches, which needs the version-3 expert kernels
//! (`REDLITE_MOE_V3=1`, not the default: slower on the H200) and the same block types and
//! row lengths; `REDLITE_MOE_FOLD_SHARED=0` keeps it separate then.
//! Batches of decode size (up to `ONE_TOKEN_KERNELS_MAX_TOKENS` tokens: serving slots
//! decoding together, MTP verifications) take the one-token kernels. Prompts take the path
//! of `moe_pairs` (down products per pair, then their
//! weighted sum; the int8 tensor-core products where they cover the types, grouped by
//! expert on the device) unless `REDLITE_MOE_PAIR_DOWN=0`; then, with
//! `REDLITE_MOE_GROUPED=1` and q8 dots, the grouped gate/up: the router's ids come to the
//! host, the pairs are grouped by expert, and each expert's rows are read once per tile of
//! pairs (same logits, bit for bit). Off: on the H200 it measured 3 % slower at pp512
//! (docs/PERF.md), the per-pair launch already reads repeated rows from L2.
//! With an expert cache (`experts`), the products run on the layer's slot stacks with slot
//! ids, after a lookup; the misses are copied in by the gate/up launch of one token (while
//! the cached experts compute) or else by a fill before it. A batch of decode size on a
//! cache takes the one-token kernels as a resident one does (a token at a time where its
//! experts may not fit the slots), so its rows are the bits of residency. Benchmarks of the
//! cache may replace the router's choice by draws from a skewed law
//! (`REDLITE_BENCH_ROUTE_SKEW`, [`LayerSkew`]).

use std::sync::OnceLock;

use redlite_cuda::{
    mma_takes, moe_down, moe_down_mma, moe_folds_shared, moe_gate_up, moe_gate_up_cached,
    moe_gate_up_cached_takes, moe_gate_up_grouped, moe_gate_up_mma, moe_route_skew, CacheCopies,
    CudaSlice, CudaView, CudaViewMut, Device, ExpertTiles, MmaGroups, PrefillKernels, Q8Rows,
    RouteSkew, SharedGateUp, ONE_TOKEN_KERNELS_MAX_TOKENS, Q8_BLOCK_VALUES,
};

use crate::backend::cuda::experts::LayerCache;
use crate::backend::cuda::moe_pairs::{self, pair_down, PairBuffers};
use crate::backend::cuda::moe_route::route;
use crate::backend::cuda::prefetch::{NextBlock, Prefetch, PrefetchBuffers};
use crate::backend::cuda::scratch::Scratch;
use crate::backend::cuda::weights::MoeWeights;
use crate::error::Result;
use crate::model::config::HybridConfig;

/// Benchmark only (`REDLITE_BENCH_ROUTE_SKEW`): block `layer`'s experts drawn from `skew`
/// instead of the router's choice (its weights kept); not the model's output.
#[derive(Clone, Copy, Debug)]
pub struct LayerSkew {
    pub skew: RouteSkew,
    pub layer: usize,
}

/// `h`: `[T][n_embd]` (normed input) → `out`: `[T][n_embd]`. With `cache`, the layer's
/// expert stacks in `w` are its slot stacks: the chosen experts are looked up (and copied
/// in) first and the products read slots; a prompt's experts come through in waves
/// (`moe_pairs`). With `skew`, the chosen experts are replaced before anything reads them.
/// With `next` (one token, `REDLITE_CACHE_PREFETCH=1`), the next block's likely experts are
/// brought into its cache on the side stream meanwhile (`prefetch.rs`).
#[allow(clippy::too_many_arguments)]
pub fn forward(
    device: &Device,
    c: &HybridConfig,
    w: &MoeWeights,
    (cache, skew): (Option<&mut LayerCache>, Option<LayerSkew>),
    next: Option<(NextBlock<'_>, &mut PrefetchBuffers)>,
    s: &mut Scratch,
    (h, h_q8): (&CudaView<'_, f32>, Option<&Q8Rows<'_>>),
    out: &mut CudaViewMut<'_, f32>,
) -> Result<()> {
    // The previous block's prefetch into this block's cache ends before its lookup.
    device.join_side()?;
    let prefetch = match next {
        Some((next, buffers)) if h.len() == c.n_embd => {
            Some(Prefetch::start(device, next, buffers, h)?)
        }
        _ => None,
    };
    block(device, c, w, (cache, skew), s, (h, h_q8), out)?;
    if let Some(prefetch) = prefetch {
        prefetch.finish(device)?;
    }
    Ok(())
}

/// [`forward`] without the prefetch.
#[allow(clippy::too_many_arguments)]
fn block(
    device: &Device,
    c: &HybridConfig,
    w: &MoeWeights,
    (mut cache, skew): (Option<&mut LayerCache>, Option<LayerSkew>),
    s: &mut Scratch,
    (h, h_q8): (&CudaView<'_, f32>, Option<&Q8Rows<'_>>),
    out: &mut CudaViewMut<'_, f32>,
) -> Result<()> {
    let e = c.n_embd;
    let t = h.len() / e;
    let used = c.n_expert_used;
    route(device, c, w, s, h, t)?;
    let mut ids = s.ids.slice_mut(..t * used);
    let weights = s.weights.slice_mut(..t * used);
    let shared_weight = s.shared_weight.slice_mut(..t);
    if let Some(bench) = skew {
        // Every routing path above leaves token t's logits at router[t * n_expert..].
        let logits = s.router.slice(..t * c.n_expert);
        moe_route_skew(
            device,
            bench.skew,
            bench.layer,
            &logits,
            &mut ids,
            c.n_expert,
        )?;
    }
    // A batch of decode size takes the one-token kernels below, each row then the bits of a
    // one-token step (and no host round trip: it may be recorded as a graph); with a cache,
    // in one go where its pairs fit the slots, else a token at a time.
    let small = t <= ONE_TOKEN_KERNELS_MAX_TOKENS;
    if !small && (cache.is_some() || pair_down()) {
        let buffers = PairBuffers {
            act: &mut s.act,
            wave_ids: &mut s.wave_ids,
            slot_ids: &mut s.slot_ids,
            fills: &mut s.fills,
            fill_count: &mut s.fill_count,
            pair_out: &mut s.pair_out,
            ones: &s.ones,
        };
        let chosen = (&ids.as_view(), &weights.as_view());
        moe_pairs::routed(device, c, w, cache, buffers, chosen, h, out)?;
        let mut act_shared = s.act_shared.slice_mut(..t * c.shared_ff);
        let zero_ids = s.zero_ids.slice(..t);
        return shared_expert(
            device,
            c,
            w,
            (&zero_ids, &mut act_shared),
            &shared_weight.as_view(),
            (h, h_q8),
            out,
        );
    }
    let at_once = match &cache {
        Some(cache) if cache.slots() < t * used => 1,
        _ => t,
    };
    let (e, blocks) = (c.n_embd, c.n_embd / Q8_BLOCK_VALUES);
    for first in (0..t).step_by(at_once) {
        let rows = first..first + at_once;
        let scratch = ExpertScratch {
            act: &mut s.act,
            act_shared: &mut s.act_shared,
            slot_ids: &mut s.slot_ids,
            fills: &mut s.fills,
            fill_count: &mut s.fill_count,
            zero_ids: &s.zero_ids,
        };
        let chosen = (
            &ids.slice(rows.start * used..rows.end * used),
            &weights.slice(rows.start * used..rows.end * used),
            &shared_weight.slice(rows.clone()),
        );
        let h_rows = h.slice(rows.start * e..rows.end * e);
        let q8_rows = h_q8.map(|q| Q8Rows {
            scales: q.scales.slice(rows.start * blocks..rows.end * blocks),
            codes: q.codes.slice(rows.start * e..rows.end * e),
        });
        let mut out_rows = out.slice_mut(rows.start * e..rows.end * e);
        experts(
            device,
            c,
            w,
            cache.as_deref_mut(),
            scratch,
            chosen,
            (&h_rows, q8_rows.as_ref()),
            &mut out_rows,
        )?;
    }
    Ok(())
}

/// The scratch buffers of [`experts`] (fields of `Scratch`).
struct ExpertScratch<'s> {
    act: &'s mut CudaSlice<f32>,
    act_shared: &'s mut CudaSlice<f32>,
    slot_ids: &'s mut CudaSlice<i32>,
    fills: &'s mut CudaSlice<i32>,
    fill_count: &'s mut CudaSlice<i32>,
    zero_ids: &'s CudaSlice<i32>,
}

/// The routed and shared experts of the tokens of `h` (all of them fitting a cache's slots)
/// through the one-token kernels (the fused down), or, for a resident prompt with
/// `REDLITE_MOE_PAIR_DOWN=0`, the fused down of a batch.
#[allow(clippy::too_many_arguments)]
fn experts(
    device: &Device,
    c: &HybridConfig,
    w: &MoeWeights,
    cache: Option<&mut LayerCache>,
    s: ExpertScratch<'_>,
    (ids, weights, shared_weight): (&CudaView<'_, i32>, &CudaView<'_, f32>, &CudaView<'_, f32>),
    (h, h_q8): (&CudaView<'_, f32>, Option<&Q8Rows<'_>>),
    out: &mut CudaViewMut<'_, f32>,
) -> Result<()> {
    let t = h.len() / c.n_embd;
    let used = c.n_expert_used;
    let small = t <= ONE_TOKEN_KERNELS_MAX_TOKENS;
    let stacks = [w.gate_exps.bytes(), w.up_exps.bytes(), w.down_exps.bytes()];
    let resident = cache.is_none();
    // With a cache, the misses are copied in the gate/up launch where it can (the hits
    // compute meanwhile), else by the fill before it.
    let mut copying = None;
    let chosen = match cache {
        Some(cache) => {
            let mut slot_ids = s.slot_ids.slice_mut(..t * used);
            if moe_gate_up_cached_takes(&w.gate_exps.view(), t) {
                cache.look_up(
                    device,
                    ids,
                    &mut slot_ids,
                    (&mut *s.fills, &mut *s.fill_count),
                )?;
                copying = Some(cache);
            } else {
                cache.bring_in(
                    device,
                    ids,
                    &mut slot_ids,
                    (&mut *s.fills, &mut *s.fill_count),
                    stacks,
                )?;
            }
            s.slot_ids.slice(..t * used)
        }
        None => ids.slice(..),
    };
    let fills = copying
        .as_ref()
        .map(|cache| s.fills.slice(..cache.fills_len(t * used)));
    let fill_count = s.fill_count.slice(..1);
    let copies = copying
        .zip(fills.as_ref())
        .map(|(cache, fills)| cache.copies((fills, &fill_count), stacks));
    let grouped = t > 1 && !small && grouped(w);
    let fold = fold_shared(w, small && !grouped);
    let part = Part {
        device,
        c,
        w,
        grouped,
        fold,
        resident,
    };
    let mut act = s.act.slice_mut(..t * used * c.expert_ff);
    let mut act_shared = s.act_shared.slice_mut(..t * c.shared_ff);
    let zero_ids = s.zero_ids.slice(..t);
    part.run(
        (&chosen, copies),
        weights,
        (shared_weight, &zero_ids),
        (h, h_q8),
        (&mut act, &mut act_shared),
        out,
    )?;
    if fold != Fold::None {
        return Ok(());
    }
    shared_expert(
        device,
        c,
        w,
        (&zero_ids, &mut act_shared),
        shared_weight,
        (h, h_q8),
        out,
    )
}

/// The shared expert accumulated into `out`, weighted by its sigmoid gate: through the int8
/// tensor cores when they cover it (a stack of one expert holding every token), else the
/// matvecs.
fn shared_expert(
    device: &Device,
    c: &HybridConfig,
    w: &MoeWeights,
    (zero_ids, act_shared): (&CudaView<'_, i32>, &mut CudaViewMut<'_, f32>),
    shared_weight: &CudaView<'_, f32>,
    (h, h_q8): (&CudaView<'_, f32>, Option<&Q8Rows<'_>>),
    out: &mut CudaViewMut<'_, f32>,
) -> Result<()> {
    device.mark("shared expert");
    let t = zero_ids.len();
    let (gate, up, down) = (
        w.shared_gate.view(),
        w.shared_up.view(),
        w.shared_down.view(),
    );
    let mma = PrefillKernels::from_env() == PrefillKernels::Mma
        && t > ONE_TOKEN_KERNELS_MAX_TOKENS
        && [&gate, &up, &down].iter().all(|m| mma_takes(device, m, t));
    if mma {
        let dense = MmaGroups::dense(device, t)?;
        moe_gate_up_mma(device, &gate, &up, c.shared_ff, &dense, h, act_shared)?;
        moe_down_mma(
            device,
            &down,
            c.n_embd,
            &dense,
            shared_weight,
            &act_shared.as_view(),
            out,
            true,
        )?;
        return Ok(());
    }
    moe_gate_up(
        device,
        &w.shared_gate.view(),
        &w.shared_up.view(),
        c.shared_ff,
        zero_ids,
        (h, h_q8),
        act_shared,
        None,
    )?;
    moe_down(
        device,
        &w.shared_down.view(),
        c.n_embd,
        zero_ids,
        shared_weight,
        &act_shared.as_view(),
        out,
        true,
        None,
        true,
    )?;
    Ok(())
}

/// The routed experts of a batch (and the shared expert when it rides along), the down
/// products summed inside their launch.
struct Part<'a> {
    device: &'a Device,
    c: &'a HybridConfig,
    w: &'a MoeWeights,
    /// Gate/up grouped by expert (the router's ids come to the host).
    grouped: bool,
    /// How much of the shared expert rides in the routed launches.
    fold: Fold,
    /// The experts are resident (no cache copies into the down's rows during the step).
    resident: bool,
}

/// The shared expert in the routed launches: not at all (it runs on its own after them),
/// gate/up only (its down, of another block type than the routed one, runs on its own), or
/// both.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Fold {
    None,
    GateUp,
    All,
}

impl<'a> Part<'a> {
    /// `ids`: the pairs' experts (or slots), with the cache's copies to make in the gate/up
    /// launch; `act`: the routed and shared activations.
    fn run<'v>(
        &self,
        (ids, copies): (&CudaView<'_, i32>, Option<CacheCopies<'_, '_>>),
        weights: &CudaView<'_, f32>,
        (shared_weight, zero_ids): (&CudaView<'_, f32>, &CudaView<'_, i32>),
        (h, h_q8): (&CudaView<'_, f32>, Option<&Q8Rows<'_>>),
        (act, act_shared): (&mut CudaViewMut<'v, f32>, &mut CudaViewMut<'v, f32>),
        out: &mut CudaViewMut<'_, f32>,
    ) -> Result<()>
    where
        'a: 'v,
    {
        let (device, c, w) = (self.device, self.c, self.w);
        let used = c.n_expert_used;
        let tiles = match self.grouped {
            true => {
                let mut host = vec![0i32; ids.len()];
                device.copy_to_host(ids, &mut host)?;
                ExpertTiles::new(&host, used, c.n_expert, self.fold == Fold::All)
            }
            false => None,
        };
        let routed = RoutedGateUp {
            device,
            w,
            ff: c.expert_ff,
            tiles: tiles.as_ref(),
            ids,
            h,
            h_q8,
        };
        // With the fold, one launch pair for both: REDLITE_MOE_FOLD_SHARED=0 times them apart.
        let down = w.shared_down.view();
        if self.fold == Fold::None {
            device.mark("routed experts");
            routed.run(act, None, copies)?;
        } else {
            device.mark("routed + shared experts (folded)");
            let (gate, up) = (w.shared_gate.view(), w.shared_up.view());
            routed.run(act, Some((&gate, &up, act_shared)), copies)?;
        }
        let shared = act_shared.as_view();
        let folded_down = (self.fold == Fold::All).then_some((&down, shared_weight, &shared));
        moe_down(
            device,
            &w.down_exps.view(),
            c.n_embd,
            ids,
            weights,
            &act.as_view(),
            out,
            false,
            folded_down,
            self.resident,
        )?;
        if self.fold == Fold::GateUp {
            // The shared expert's down as `shared_expert` launches it: the same sums.
            moe_down(
                device,
                &down,
                c.n_embd,
                zero_ids,
                shared_weight,
                &shared,
                out,
                true,
                None,
                true,
            )?;
        }
        Ok(())
    }
}

/// The routed experts' gate/up of one call: grouped by expert when `tiles` are given, else
/// per (token, slot) pair.
struct RoutedGateUp<'a, 'b> {
    device: &'a Device,
    w: &'a MoeWeights,
    ff: usize,
    tiles: Option<&'a ExpertTiles>,
    ids: &'a CudaView<'b, i32>,
    h: &'a CudaView<'b, f32>,
    /// `h` in Q8_K when its norm quantized it (a batch of decode size).
    h_q8: Option<&'a Q8Rows<'b>>,
}

impl RoutedGateUp<'_, '_> {
    /// With `copies`, the cache's misses are copied in the same launch (one token).
    fn run(
        &self,
        act: &mut CudaViewMut<'_, f32>,
        shared: Option<SharedGateUp<'_, '_>>,
        copies: Option<CacheCopies<'_, '_>>,
    ) -> Result<()> {
        let (gate, up) = (self.w.gate_exps.view(), self.w.up_exps.view());
        if let Some(copies) = copies {
            moe_gate_up_cached(
                self.device,
                (&gate, &up),
                self.ff,
                self.ids,
                (self.h, self.h_q8),
                act,
                shared,
                copies,
            )?;
            return Ok(());
        }
        match self.tiles {
            Some(tiles) => {
                moe_gate_up_grouped(self.device, &gate, &up, self.ff, tiles, self.h, act, shared)?
            }
            None => moe_gate_up(
                self.device,
                &gate,
                &up,
                self.ff,
                self.ids,
                (self.h, self.h_q8),
                act,
                shared,
            )?,
        }
        Ok(())
    }
}

/// Whether a prompt's gate/up takes the grouped launch: `REDLITE_MOE_GROUPED=1` and q8 dots
/// (the only kernel it has).
fn grouped(w: &MoeWeights) -> bool {
    static ON: OnceLock<bool> = OnceLock::new();
    let gate = w.gate_exps.view();
    *ON.get_or_init(|| std::env::var("REDLITE_MOE_GROUPED").as_deref() == Ok("1"))
        && gate.dots.quantizes(gate.ty)
}

/// Whether the shared expert rides along in the routed launches.
fn fold_shared(w: &MoeWeights, small: bool) -> Fold {
    static ON: OnceLock<bool> = OnceLock::new();
    let on = *ON.get_or_init(|| std::env::var("REDLITE_MOE_FOLD_SHARED").as_deref() != Ok("0"));
    let gate_up = on
        && moe_folds_shared(&w.gate_exps.view(), &w.shared_gate.view())
        && moe_folds_shared(&w.up_exps.view(), &w.shared_up.view());
    let down = moe_folds_shared(&w.down_exps.view(), &w.shared_down.view());
    match (gate_up, down) {
        (true, true) => Fold::All,
        (true, false) if small && fold_gate_up_alone() => Fold::GateUp,
        _ => Fold::None,
    }
}

/// `REDLITE_MOE_FOLD_GATE_UP=1`: in a batch of decode size, the shared expert's gate/up
/// rides in the routed launch also where its down cannot (a block type other than the
/// routed down's: the `use_more_bits` layers of the IQ1/IQ2 files, 24 of 48), one launch a
/// layer fewer. Each row sums as in its own launch, so the bits should not move; off until
/// a device call has checked that and measured it.
fn fold_gate_up_alone() -> bool {
    static ON: OnceLock<bool> = OnceLock::new();
    *ON.get_or_init(|| std::env::var("REDLITE_MOE_FOLD_GATE_UP").as_deref() == Ok("1"))
}
