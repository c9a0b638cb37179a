//! The router and the routing of a MoE block on the GPU: one token's fused router (the
//! routing in its last CTA) where the router and the shared expert's gate row are stored
//! together, the routing with the shared expert's gate row for batches of decode size, and
//! the router products then the routing elsewhere. Every path gives the same ids, weights
//! and shared-expert weights, bit for bit.

use std::sync::OnceLock;

use redlite_cuda::{
    matmul, moe_route, moe_route_gate, moe_route_gate_takes, router_topk, router_topk_takes,
    CudaView, Device,
};

use crate::backend::cuda::scratch::Scratch;
use crate::backend::cuda::weights::MoeWeights;
use crate::error::Result;
use crate::model::config::HybridConfig;

/// The router and the routing of the `t` tokens of `h`: their ids, weights and shared-expert
/// weights into `s`, the router's logits at `s.router[t * n_expert..]`.
pub(super) fn route(
    device: &Device,
    c: &HybridConfig,
    w: &MoeWeights,
    s: &mut Scratch,
    h: &CudaView<'_, f32>,
    t: usize,
) -> Result<()> {
    let used = c.n_expert_used;
    device.mark("router");
    let mut ids = s.ids.slice_mut(..t * used);
    let mut weights = s.weights.slice_mut(..t * used);
    let mut shared_weight = s.shared_weight.slice_mut(..t);
    // One token: the router and the shared expert's gate row in one launch, with the routing
    // in its last CTA where the router is F32; each row's dot and the routing are the same,
    // so are the bits.
    let merged = w
        .router
        .view_with_extra_rows()
        .filter(|_| t == 1 && router_with_shared_row());
    if let Some(both) = merged.as_ref().filter(|both| router_topk_takes(both)) {
        router_topk(
            device,
            both,
            h,
            &mut s.router.slice_mut(..c.n_expert + 1),
            &mut s.route_ticket.slice_mut(..1),
            &mut ids,
            &mut weights,
            &mut shared_weight,
        )?;
    } else if merged.is_none() && moe_route_gate_takes(&w.shared_gate_inp.view(), t, c.n_expert) {
        // A batch of decode size with the gate row apart (an F32 router and an F16 gate, as
        // the real files have): the gate's dot in the routing launch, the same bits.
        let mut router = s.router.slice_mut(..t * c.n_expert);
        matmul(device, &w.router.view(), h, &mut router)?;
        moe_route_gate(
            device,
            &router.as_view(),
            &w.shared_gate_inp.view(),
            h,
            &mut ids,
            &mut weights,
            &mut shared_weight,
        )?;
    } else {
        let (router, shared_logit) = match merged {
            Some(both) => {
                matmul(device, &both, h, &mut s.router.slice_mut(..c.n_expert + 1))?;
                (
                    s.router.slice(..c.n_expert),
                    s.router.slice(c.n_expert..c.n_expert + 1),
                )
            }
            None => {
                matmul(
                    device,
                    &w.router.view(),
                    h,
                    &mut s.router.slice_mut(..t * c.n_expert),
                )?;
                let mut shared_logit = s.shared_logit.slice_mut(..t);
                matmul(device, &w.shared_gate_inp.view(), h, &mut shared_logit)?;
                (s.router.slice(..t * c.n_expert), s.shared_logit.slice(..t))
            }
        };
        moe_route(
            device,
            &router,
            &shared_logit,
            &mut ids,
            &mut weights,
            &mut shared_weight,
        )?;
    }
    Ok(())
}

/// Whether one-token steps compute the router and the shared expert's gate row in one launch
/// (`REDLITE_ROUTER_SHARED_ROW=0`: two launches, as prompts do).
fn router_with_shared_row() -> bool {
    static ON: OnceLock<bool> = OnceLock::new();
    *ON.get_or_init(|| std::env::var("REDLITE_ROUTER_SHARED_ROW").as_deref() != Ok("0"))
}
