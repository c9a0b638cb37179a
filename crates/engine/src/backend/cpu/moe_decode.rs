//! The MoE block for one token (decode), allocation-free and in four parallel regions
//! (router; every gate and up projection; every down projection; the weighted sum) where
//! the batched path (`moe::forward`) takes eight. The arithmetic is that path's for one
//! token, in the same order, so the bits are the same.

use arrayvec::ArrayVec;

use crate::backend::cpu::linear::{MatmulCtx, Precision};
use crate::backend::cpu::one_token::{self, Product, MAX_PRODUCTS};
use crate::backend::cpu::ops::{sigmoid, silu, softmax};
use crate::backend::cpu::pool;
use crate::backend::cpu::scratch::Scratch;
use crate::backend::cpu::weights::MoeWeights;
use crate::error::Result;
use crate::model::config::HybridConfig;

/// The most units (routed experts and the shared expert) one token runs: each has a gate
/// and an up product in one region.
const MAX_UNITS: usize = MAX_PRODUCTS / 2;

/// Model-width values per task of the weighted sum.
const SUM_COLS_PER_TASK: usize = 128;

/// Whether one token takes this path (else the batched path runs it).
pub fn applies(c: &HybridConfig, mm: &MatmulCtx, tokens: usize) -> bool {
    tokens == 1 && mm.precision == Precision::Ggml && c.n_expert_used < MAX_UNITS
}

/// Inserts `(i, p)` into `top` (sorted by descending probability, ties to the lower index),
/// keeping its `k` first: the order of `moe::top_k`.
fn push_top(top: &mut ArrayVec<(usize, f32), MAX_UNITS>, k: usize, i: usize, p: f32) {
    let before = |a: &(usize, f32)| p.total_cmp(&a.1).then(a.0.cmp(&i)).is_gt();
    let at = top.iter().position(before).unwrap_or(top.len());
    if at >= k {
        return;
    }
    if top.len() == k {
        top.pop();
    }
    top.insert(at, (i, p));
}

pub fn forward(
    c: &HybridConfig,
    mm: &MatmulCtx,
    w: &MoeWeights,
    h: &[f32],
    out: &mut [f32],
) -> Result<()> {
    let e = c.n_embd;
    let k = c.n_expert_used;
    let mut probs = Scratch::zeroed(c.n_expert);
    let mut shared_logit = [0f32; 1];
    one_token::run(
        mm,
        &[h],
        &mut [
            Product::whole(&w.router, &mut probs),
            Product::whole(&w.shared_gate_inp, &mut shared_logit),
        ],
    )?;

    // Route: top-k of the softmax, weights renormalized over them (summed in top-k
    // order), then the experts in ascending order and the shared expert last (the order
    // of the weighted sum).
    softmax(&mut probs);
    let mut top: ArrayVec<(usize, f32), MAX_UNITS> = ArrayVec::new();
    for (i, &p) in probs.iter().enumerate() {
        push_top(&mut top, k, i, p);
    }
    let sum: f32 = top.iter().map(|(_, p)| p).sum();
    let mut units: ArrayVec<(usize, f32), MAX_UNITS> =
        top.iter().map(|&(i, p)| (i, p / sum)).collect();
    units.sort_unstable_by_key(|&(i, _)| i);
    let routed = units.len();

    // Gate and up projections of every unit, all of the same input.
    let (ff, shared_ff) = (c.expert_ff, c.shared_ff);
    let width = |u: usize| if u < routed { ff } else { shared_ff };
    let total = routed * ff + shared_ff;
    let mut gates = Scratch::zeroed(total);
    let mut ups = Scratch::zeroed(total);
    {
        let mut products: ArrayVec<Product, MAX_PRODUCTS> = ArrayVec::new();
        let (mut g_rest, mut u_rest) = (&mut gates[..], &mut ups[..]);
        for u in 0..=routed {
            let (g, g_next) = std::mem::take(&mut g_rest).split_at_mut(width(u));
            let (up, u_next) = std::mem::take(&mut u_rest).split_at_mut(width(u));
            (g_rest, u_rest) = (g_next, u_next);
            let (gate_w, up_w, first) = match units.get(u) {
                Some(&(expert, _)) => (&w.gate_exps, &w.up_exps, expert * ff),
                None => (&w.shared_gate, &w.shared_up, 0),
            };
            products.push(Product {
                w: gate_w,
                first,
                input: 0,
                out: g,
            });
            products.push(Product {
                w: up_w,
                first,
                input: 0,
                out: up,
            });
        }
        one_token::run(mm, &[h], &mut products)?;
    }

    // SwiGLU in place of the gates, then every down projection, each of its own input.
    gates
        .iter_mut()
        .zip(ups.iter())
        .for_each(|(g, u)| *g = silu(*g) * u);
    let mut downs = Scratch::zeroed((routed + 1) * e);
    {
        let mut inputs: ArrayVec<&[f32], MAX_UNITS> = ArrayVec::new();
        let mut products: ArrayVec<Product, MAX_PRODUCTS> = ArrayVec::new();
        let mut rest = &gates[..];
        for (u, out) in downs.chunks_mut(e).enumerate() {
            let (a, next) = rest.split_at(width(u));
            rest = next;
            inputs.push(a);
            let (down_w, first) = match units.get(u) {
                Some(&(expert, _)) => (&w.down_exps, expert * e),
                None => (&w.shared_down, 0),
            };
            products.push(Product {
                w: down_w,
                first,
                input: u,
                out,
            });
        }
        one_token::run(mm, &inputs, &mut products)?;
    }

    // The weighted sum: each value adds its units in unit order, from zero.
    let shared_weight = sigmoid(shared_logit[0]);
    let downs = &downs;
    let units = &units;
    pool::for_each_piece(&mut out[..e], SUM_COLS_PER_TASK, &|j, part| {
        let r0 = j * SUM_COLS_PER_TASK;
        part.iter_mut().for_each(|v| *v = 0.0);
        for u in 0..=routed {
            let weight = units.get(u).map_or(shared_weight, |&(_, p)| p);
            let d = &downs[u * e + r0..][..part.len()];
            for (o, x) in part.iter_mut().zip(d) {
                *o += weight * x;
            }
        }
        Ok(())
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn top_k_matches_the_batched_routing() {
        let probs = [0.1, 0.3, 0.3, 0.05, 0.2, 0.3, 0.0, 0.2];
        for k in [1, 2, 3, 5, 8] {
            let mut top = ArrayVec::new();
            for (i, &p) in probs.iter().enumerate() {
                push_top(&mut top, k, i, p);
            }
            let want = crate::backend::cpu::moe::top_k(&probs, k);
            assert_eq!(top.as_slice(), want.as_slice(), "k = {k}");
        }
    }
}
