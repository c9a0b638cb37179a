//! The MoE block on the GPU (spec §3.4), mirroring `cpu::moe`: router logits, then softmax,
//! top-k and renormalization on the GPU; the selected experts' gate/up with SwiGLU fused;
//! their down projections with the weighted sum fused; the shared expert through the same
//! kernels (a stack of one expert) with its sigmoid gate as the weight, accumulated.
//! Seven launches per layer, no host round trip; five when the shared expert rides along in
//! the routed experts' gate/up and down launches, which needs the version-3 expert kernels
//! (`REDLITE_MOE_V3=1`, not the default: slower on the H200) and the same block types and
//! row lengths; `REDLITE_MOE_FOLD_SHARED=0` keeps it separate then.
//! Prompts (several tokens) take the int8 tensor-core products where they cover the experts'
//! types (`REDLITE_PREFILL_MMA=0` keeps the kernels below): the pairs are grouped by expert on
//! the device (`REDLITE_MMA_HOST_GROUPS=1`: on the host, one sync per layer), gate/up (SwiGLU
//! fused) and down run once per projection over all experts' tiles, and the down outputs are
//! summed back in token order by a second pass.
//! `REDLITE_MOE_GROUPED=1`: prompts (several tokens) with q8 dots take the grouped gate/up:
//! the router's ids come to the host, the pairs are grouped by expert, and each expert's rows
//! are read once per tile of pairs (same logits, bit for bit). Off: on the H200 it measured 3 %
//! slower at pp512 (docs/PERF.md), the per-pair launch already reads repeated rows from L2.

use std::sync::OnceLock;

use redlite_cuda::{
    matmul, mma_takes, moe_down, moe_down_mma, moe_folds_shared, moe_gate_up, moe_gate_up_grouped,
    moe_gate_up_mma, moe_route, CudaView, CudaViewMut, Device, ExpertTiles, MmaGroups, MmaTiles,
    PrefillKernels, SharedGateUp,
};

use crate::backend::cuda::scratch::Scratch;
use crate::backend::cuda::weights::MoeWeights;
use crate::error::Result;
use crate::model::config::HybridConfig;

/// `h`: `[T][n_embd]` (normed input) → `out`: `[T][n_embd]`.
pub fn forward(
    device: &Device,
    c: &HybridConfig,
    w: &MoeWeights,
    s: &mut Scratch,
    h: &CudaView<'_, f32>,
    out: &mut CudaViewMut<'_, f32>,
) -> Result<()> {
    let e = c.n_embd;
    let t = h.len() / e;
    let used = c.n_expert_used;
    let mut router = s.router.slice_mut(..t * c.n_expert);
    let mut shared_logit = s.shared_logit.slice_mut(..t);
    device.mark("router");
    matmul(device, &w.router.view(), h, &mut router)?;
    matmul(device, &w.shared_gate_inp.view(), h, &mut shared_logit)?;
    let mut ids = s.ids.slice_mut(..t * used);
    let mut weights = s.weights.slice_mut(..t * used);
    let mut shared_weight = s.shared_weight.slice_mut(..t);
    moe_route(
        device,
        &router.as_view(),
        &shared_logit.as_view(),
        &mut ids,
        &mut weights,
        &mut shared_weight,
    )?;
    let mut act = s.act.slice_mut(..t * used * c.expert_ff);
    if let Some(tiles) = mma_tiles(device, c, w, &ids.as_view(), t)? {
        device.mark("routed experts (mma)");
        let (gate, up) = (w.gate_exps.view(), w.up_exps.view());
        moe_gate_up_mma(device, &gate, &up, c.expert_ff, &tiles, h, &mut act)?;
        let (weights, act) = (weights.as_view(), act.as_view());
        moe_down_mma(
            device,
            &w.down_exps.view(),
            e,
            &tiles,
            &weights,
            &act,
            out,
            false,
        )?;
        device.mark("shared expert");
        let mut act_shared = s.act_shared.slice_mut(..t * c.shared_ff);
        let (gate, up) = (w.shared_gate.view(), w.shared_up.view());
        let down = w.shared_down.view();
        if [&gate, &up, &down].iter().all(|m| mma_takes(device, m, t)) {
            let dense = MmaGroups::dense(device, t)?;
            moe_gate_up_mma(device, &gate, &up, c.shared_ff, &dense, h, &mut act_shared)?;
            let (sw, act_shared) = (shared_weight.as_view(), act_shared.as_view());
            moe_down_mma(device, &down, e, &dense, &sw, &act_shared, out, true)?;
            return Ok(());
        }
        let zero_ids = s.zero_ids.slice(..t);
        moe_gate_up(
            device,
            &gate,
            &up,
            c.shared_ff,
            &zero_ids,
            h,
            &mut act_shared,
            None,
        )?;
        let (sw, act_shared) = (shared_weight.as_view(), act_shared.as_view());
        moe_down(
            device,
            &down,
            e,
            &zero_ids,
            &sw,
            &act_shared,
            out,
            true,
            None,
        )?;
        return Ok(());
    }
    let fold = fold_shared(w);
    let tiles = match t > 1 && grouped(w) {
        true => {
            let mut host = vec![0i32; t * used];
            device.copy_to_host(&ids.as_view(), &mut host)?;
            ExpertTiles::new(&host, used, c.n_expert, fold)
        }
        false => None,
    };
    let routed = RoutedGateUp {
        device,
        w,
        ff: c.expert_ff,
        tiles: tiles.as_ref(),
        ids: &ids.as_view(),
        h,
    };
    if fold {
        // One launch pair for both: REDLITE_MOE_FOLD_SHARED=0 times them apart.
        device.mark("routed + shared experts (folded)");
        let mut act_shared = s.act_shared.slice_mut(..t * c.shared_ff);
        let (gate, up) = (w.shared_gate.view(), w.shared_up.view());
        routed.run(&mut act, Some((&gate, &up, &mut act_shared)))?;
        let down = w.shared_down.view();
        moe_down(
            device,
            &w.down_exps.view(),
            e,
            &ids.as_view(),
            &weights.as_view(),
            &act.as_view(),
            out,
            false,
            Some((&down, &shared_weight.as_view(), &act_shared.as_view())),
        )?;
        return Ok(());
    }
    device.mark("routed experts");
    routed.run(&mut act, None)?;
    moe_down(
        device,
        &w.down_exps.view(),
        e,
        &ids.as_view(),
        &weights.as_view(),
        &act.as_view(),
        out,
        false,
        None,
    )?;
    device.mark("shared expert");
    let zero_ids = s.zero_ids.slice(..t);
    let mut act_shared = s.act_shared.slice_mut(..t * c.shared_ff);
    moe_gate_up(
        device,
        &w.shared_gate.view(),
        &w.shared_up.view(),
        c.shared_ff,
        &zero_ids,
        h,
        &mut act_shared,
        None,
    )?;
    moe_down(
        device,
        &w.shared_down.view(),
        e,
        &zero_ids,
        &shared_weight.as_view(),
        &act_shared.as_view(),
        out,
        true,
        None,
    )?;
    Ok(())
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
}

impl RoutedGateUp<'_, '_> {
    fn run(
        &self,
        act: &mut CudaViewMut<'_, f32>,
        shared: Option<SharedGateUp<'_, '_>>,
    ) -> Result<()> {
        let (gate, up) = (self.w.gate_exps.view(), self.w.up_exps.view());
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
                self.h,
                act,
                shared,
            )?,
        }
        Ok(())
    }
}

/// The routed pairs of a prompt grouped for the tensor-core expert products, when they cover
/// the experts' types (`REDLITE_PREFILL_MMA=0`: never; `None` takes the per-pair kernels):
/// on the device, no host round trip. `REDLITE_MMA_HOST_GROUPS=1` brings the router's ids to
/// the host once per layer instead (one sync; an out-of-range id then takes the per-pair
/// kernels), to time the difference.
fn mma_tiles(
    device: &Device,
    c: &HybridConfig,
    w: &MoeWeights,
    ids: &CudaView<'_, i32>,
    t: usize,
) -> Result<Option<MmaGroups>> {
    static HOST: OnceLock<bool> = OnceLock::new();
    let (gate, up, down) = (w.gate_exps.view(), w.up_exps.view(), w.down_exps.view());
    let covered = [&gate, &up, &down].iter().all(|m| mma_takes(device, m, t));
    if PrefillKernels::from_env() != PrefillKernels::Mma || !covered || gate.ty != up.ty {
        return Ok(None);
    }
    let (used, n_expert) = (c.n_expert_used, c.n_expert);
    if !*HOST.get_or_init(|| std::env::var("REDLITE_MMA_HOST_GROUPS").as_deref() == Ok("1")) {
        return Ok(Some(MmaGroups::on_device(device, ids, used, n_expert)?));
    }
    let mut host = vec![0i32; ids.len()];
    device.copy_to_host(ids, &mut host)?;
    match MmaTiles::new(&host, used, n_expert) {
        Some(tiles) => Ok(Some(MmaGroups::upload(device, &tiles)?)),
        None => Ok(None),
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
fn fold_shared(w: &MoeWeights) -> bool {
    static ON: OnceLock<bool> = OnceLock::new();
    *ON.get_or_init(|| std::env::var("REDLITE_MOE_FOLD_SHARED").as_deref() != Ok("0"))
        && moe_folds_shared(&w.gate_exps.view(), &w.shared_gate.view())
        && moe_folds_shared(&w.up_exps.view(), &w.shared_up.view())
        && moe_folds_shared(&w.down_exps.view(), &w.shared_down.view())
}
