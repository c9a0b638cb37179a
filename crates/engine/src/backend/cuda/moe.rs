//! The MoE block on the GPU (spec §3.4), mirroring `cpu::moe`: router logits, then softmax,
//! top-k and renormalization on the GPU; the selected experts' gate/up with SwiGLU fused;
//! their down projections with the weighted sum fused; the shared expert through the same
//! kernels (a stack of one expert) with its sigmoid gate as the weight, accumulated.
//! Seven launches per layer, no host round trip; five when the shared expert rides along in
//! the routed experts' gate/up and down launches, which needs the version-3 expert kernels
//! (`REDLITE_MOE_V3=1`, not the default: slower on the H200) and the same block types and
//! row lengths; `REDLITE_MOE_FOLD_SHARED=0` keeps it separate then.

use std::sync::OnceLock;

use redlite_cuda::{
    matmul, moe_down, moe_folds_shared, moe_gate_up, moe_route, CudaView, CudaViewMut, Device,
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
    if fold_shared(w) {
        // One launch pair for both: REDLITE_MOE_FOLD_SHARED=0 times them apart.
        device.mark("routed + shared experts (folded)");
        let mut act_shared = s.act_shared.slice_mut(..t * c.shared_ff);
        let (gate, up) = (w.shared_gate.view(), w.shared_up.view());
        moe_gate_up(
            device,
            &w.gate_exps.view(),
            &w.up_exps.view(),
            c.expert_ff,
            &ids.as_view(),
            h,
            &mut act,
            Some((&gate, &up, &mut act_shared)),
        )?;
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
    moe_gate_up(
        device,
        &w.gate_exps.view(),
        &w.up_exps.view(),
        c.expert_ff,
        &ids.as_view(),
        h,
        &mut act,
        None,
    )?;
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

/// Whether the shared expert rides along in the routed launches.
fn fold_shared(w: &MoeWeights) -> bool {
    static ON: OnceLock<bool> = OnceLock::new();
    *ON.get_or_init(|| std::env::var("REDLITE_MOE_FOLD_SHARED").as_deref() != Ok("0"))
        && moe_folds_shared(&w.gate_exps.view(), &w.shared_gate.view())
        && moe_folds_shared(&w.up_exps.view(), &w.shared_up.view())
        && moe_folds_shared(&w.down_exps.view(), &w.shared_down.view())
}
