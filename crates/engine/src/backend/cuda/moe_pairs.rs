//! The routed experts of a prompt (several tokens) pair by pair: gate/up per (token, slot)
//! pair as in decode, each pair's down product written on its own, then the routing-weighted
//! sum of a token's pairs in one fixed order (`moe_combine`). With an expert cache whose
//! slots cannot hold every expert the prompt chose, the experts come through in waves (each
//! copied in once, the cached ones first) and each launch covers its wave's pairs only; the
//! sums are the same whatever the waves, so a cached prompt gives the bits of a resident one.
//! The products are the int8 tensor-core ones (`mma`: each wave's pairs grouped by expert on
//! the device, gate/up and down once per projection over the experts' tiles) where they cover
//! the experts' types and the call's tokens (`REDLITE_PREFILL_MMA=0`: never), else the
//! per-pair matvecs; resident or cached, a call takes the same family, so their bits agree.
//! `REDLITE_MOE_PAIR_DOWN=0` keeps the fused down (weighted sum inside the down launch, no
//! tensor cores) for resident prompts instead; a cache always takes this path for prompts.

use std::sync::OnceLock;

use redlite_cuda::{
    mma_takes, moe_combine, moe_down, moe_down_mma_combine, moe_down_mma_pairs, moe_gate_up,
    moe_gate_up_mma, CudaSlice, CudaView, CudaViewMut, Device, MmaGroups, PrefillKernels,
};

use crate::backend::cuda::experts::{plan_waves, LayerCache};
use crate::backend::cuda::weights::MoeWeights;
use crate::error::Result;
use crate::model::config::HybridConfig;

/// Most pairs in one per-pair down launch (its grid's y dimension).
const PAIRS_PER_LAUNCH: usize = 65_535;

/// Whether resident prompts take the per-pair down (`REDLITE_MOE_PAIR_DOWN`, default on).
pub fn pair_down() -> bool {
    static ON: OnceLock<bool> = OnceLock::new();
    *ON.get_or_init(|| std::env::var("REDLITE_MOE_PAIR_DOWN").as_deref() != Ok("0"))
}

/// The scratch buffers a prompt's pairs use (fields of `Scratch`, sized for its tokens).
pub struct PairBuffers<'a> {
    pub act: &'a mut CudaSlice<f32>,
    pub wave_ids: &'a mut CudaSlice<i32>,
    pub slot_ids: &'a mut CudaSlice<i32>,
    pub fills: &'a mut CudaSlice<i32>,
    pub fill_count: &'a mut CudaSlice<i32>,
    pub pair_out: &'a mut CudaSlice<f32>,
    pub ones: &'a CudaSlice<f32>,
}

/// `out[t] = Σ_k weights[t][k] · expert_{ids[t][k]}(h[t])` for the tokens of `h`.
#[allow(clippy::too_many_arguments)]
pub fn routed(
    device: &Device,
    c: &HybridConfig,
    w: &MoeWeights,
    mut cache: Option<&mut LayerCache>,
    b: PairBuffers<'_>,
    (ids, weights): (&CudaView<'_, i32>, &CudaView<'_, f32>),
    h: &CudaView<'_, f32>,
    out: &mut CudaViewMut<'_, f32>,
) -> Result<()> {
    let (e, ff) = (c.n_embd, c.expert_ff);
    let pairs = ids.len();
    let waves = match cache.as_deref() {
        Some(cache) if pairs > cache.slots() => {
            let mut host = vec![0i32; pairs];
            device.copy_to_host(ids, &mut host)?;
            let slot_of = cache.slot_of(device)?;
            plan_waves(&host, &slot_of, cache.slots())
                .into_iter()
                .map(Some)
                .collect()
        }
        _ => vec![None],
    };
    let (gate, up, down) = (w.gate_exps.view(), w.up_exps.view(), w.down_exps.view());
    let tokens = pairs / c.n_expert_used.max(1);
    let mma = PrefillKernels::from_env() == PrefillKernels::Mma
        && gate.ty == up.ty
        && [&gate, &up, &down]
            .iter()
            .all(|m| mma_takes(device, m, tokens));
    // Experts in the stacks: the layer's, or the cache's slots.
    let stack = gate.rows / ff.max(1);
    let mut act = b.act.slice_mut(..pairs * ff);
    let mut y = b.pair_out.slice_mut(..pairs * e);
    for wave in waves {
        let wave_ids = match wave {
            Some(list) => {
                device.copy_to_device(&list, &mut b.wave_ids.slice_mut(..pairs))?;
                b.wave_ids.slice(..pairs)
            }
            None => ids.slice(..),
        };
        let chosen = match cache.as_deref_mut() {
            Some(cache) => {
                let stacks = [w.gate_exps.bytes(), w.up_exps.bytes(), w.down_exps.bytes()];
                let mut slot_ids = b.slot_ids.slice_mut(..pairs);
                cache.bring_in(
                    device,
                    &wave_ids,
                    &mut slot_ids,
                    (b.fills, b.fill_count),
                    stacks,
                )?;
                b.slot_ids.slice(..pairs)
            }
            None => wave_ids,
        };
        if mma {
            device.mark("routed experts (mma)");
            let groups = MmaGroups::on_device(device, &chosen, c.n_expert_used, stack)?;
            moe_gate_up_mma(device, &gate, &up, ff, &groups, h, &mut act)?;
            moe_down_mma_pairs(device, &down, e, &groups, &act.as_view(), &mut y)?;
            continue;
        }
        device.mark("routed experts");
        moe_gate_up(device, &gate, &up, ff, &chosen, (h, None), &mut act, None)?;
        for start in (0..pairs).step_by(PAIRS_PER_LAUNCH) {
            let end = (start + PAIRS_PER_LAUNCH).min(pairs);
            moe_down(
                device,
                &down,
                e,
                &chosen.slice(start..end),
                &b.ones.slice(start..end),
                &act.slice(start * ff..end * ff),
                &mut y.slice_mut(start * e..end * e),
                false,
                None,
                false,
            )?;
        }
    }
    device.mark("routed experts (sum)");
    if mma {
        // Pairs whose router id is out of range joined no tile: left out of the sum.
        let skip = Some((ids, c.n_expert));
        moe_down_mma_combine(device, &y.as_view(), weights, skip, out, false)?;
    } else {
        moe_combine(device, &y.as_view(), weights, out, e)?;
    }
    Ok(())
}
