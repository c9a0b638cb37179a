//! The router and the routing of a MoE block on the GPU: one token's fused router (the
//! routing in its last CTA, with the post-mixer norm under `REDLITE_ROUTER_NORM=1`), the
//! routing with the shared expert's gate row for batches of decode size, and the router
//! products then the routing elsewhere. Every path gives the same ids, weights and
//! shared-expert weights, bit for bit.

use std::sync::OnceLock;

use redlite_cuda::{
    matmul, moe_route, moe_route_gate, moe_route_gate_takes, router_norm_on, router_topk,
    router_topk_norm, router_topk_norm_takes, router_topk_takes, CudaView, Device, PostNorm,
    RouterRows, Switch, WeightMatrix,
};

use crate::backend::cuda::scratch::Scratch;
use crate::backend::cuda::weights::MoeWeights;
use crate::error::{EngineError, Result};
use crate::model::config::HybridConfig;

/// The rows of the fused decode router ([`router_topk`]) for `t` tokens: the router and the
/// shared expert's gate row stored together (`merged`, `DeviceMatrix::router`), or with
/// `REDLITE_ROUTER_TOPK_APART=1` apart (an F32 router and an F16 gate, as the real files
/// have); `None` where it does not take them.
fn fused_router_rows<'m, 'a>(
    merged: Option<&'m WeightMatrix<'a>>,
    (router, gate): (&'m WeightMatrix<'a>, &'m WeightMatrix<'a>),
    t: usize,
) -> Option<RouterRows<'m, 'a>> {
    match merged {
        Some(both) => Some(RouterRows::Merged(both)),
        None if t == 1 && router_topk_apart() => Some(RouterRows::Apart { router, gate }),
        None => None,
    }
    .filter(router_topk_takes)
}

/// `f` on the fused router's rows of block `w` for one token (their views live here).
fn with_one_token_router_rows<R>(
    w: &MoeWeights,
    f: impl FnOnce(Option<RouterRows<'_, '_>>) -> R,
) -> R {
    let merged = w
        .router
        .view_with_extra_rows()
        .filter(|_| router_with_shared_row());
    let (router, gate) = (w.router.view(), w.shared_gate_inp.view());
    f(fused_router_rows(merged.as_ref(), (&router, &gate), 1))
}

/// Whether [`route_with_norm`] takes block `w` (the switch `REDLITE_ROUTER_NORM=1` is on and
/// the fused router takes its rows with the norm).
pub fn takes_route_with_norm(c: &HybridConfig, w: &MoeWeights) -> bool {
    router_norm_on()
        && with_one_token_router_rows(w, |rows| {
            rows.is_some_and(|rows| router_topk_norm_takes(&rows, c.n_embd))
        })
}

/// One decode token's post-mixer add + norm and routing in one launch
/// ([`router_topk_norm`], where [`takes_route_with_norm`]): the ids and weights in `s` for
/// `moe::forward` with `routed`, the normed row and its codes in `norm.h`; the bits of the
/// norm, then `moe::forward`'s routing.
pub fn route_with_norm(
    device: &Device,
    c: &HybridConfig,
    w: &MoeWeights,
    s: &mut Scratch,
    norm: PostNorm<'_, '_>,
) -> Result<()> {
    with_one_token_router_rows(w, |rows| {
        let Some(rows) =
            rows.filter(|rows| router_norm_on() && router_topk_norm_takes(rows, c.n_embd))
        else {
            return Err(EngineError::BadConfig(
                "the router with the post-mixer norm does not take this block".into(),
            ));
        };
        device.mark("router");
        let used = c.n_expert_used;
        router_topk_norm(
            device,
            rows,
            norm,
            &mut s.router.slice_mut(..c.n_expert + 1),
            &mut s.route_ticket.slice_mut(..1),
            &mut s.ids.slice_mut(..used),
            &mut s.weights.slice_mut(..used),
            &mut s.shared_weight.slice_mut(..1),
        )?;
        Ok(())
    })
}

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
    let (router_view, gate_view) = (w.router.view(), w.shared_gate_inp.view());
    if let Some(rows) = fused_router_rows(merged.as_ref(), (&router_view, &gate_view), t) {
        router_topk(
            device,
            rows,
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

/// `REDLITE_ROUTER_TOPK_APART=1`: one-token steps of a file whose shared-expert gate row is
/// apart from the router (an F32 router and an F16 gate, as real files have) take the fused
/// router too, the gate row reduced by a CTA of its own; by default they take the split-K
/// router and then the routing with the gate row. Written without a GPU (the fifteenth session
/// lost its device); opt-in until a GPU test and an A/B have run.
pub static ROUTER_TOPK_APART: Switch = Switch::new("REDLITE_ROUTER_TOPK_APART", false);

fn router_topk_apart() -> bool {
    ROUTER_TOPK_APART.on()
}

/// Whether one-token steps compute the router and the shared expert's gate row in one launch
/// (`REDLITE_ROUTER_SHARED_ROW=0`: two launches, as prompts do).
fn router_with_shared_row() -> bool {
    static ON: OnceLock<bool> = OnceLock::new();
    *ON.get_or_init(|| std::env::var("REDLITE_ROUTER_SHARED_ROW").as_deref() != Ok("0"))
}
