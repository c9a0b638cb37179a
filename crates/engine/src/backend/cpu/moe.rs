//! The MoE block on the CPU (spec §3.4): softmax router, top-k, renormalized weights, SwiGLU
//! experts (tokens grouped by expert, so each expert's rows are decoded once per batch) and
//! the shared expert scaled by its sigmoid gate.

use crate::backend::cpu::linear::{matmul, matmul_rows, MatmulCtx};
use crate::backend::cpu::ops::{sigmoid, silu, softmax};
use crate::backend::cpu::weights::{Matrix, MoeWeights};
use crate::error::Result;
use crate::model::config::HybridConfig;

/// The `k` largest of `p` (ties to the lower index), with their probabilities.
pub fn top_k(p: &[f32], k: usize) -> Vec<(usize, f32)> {
    let mut idx: Vec<usize> = (0..p.len()).collect();
    idx.sort_by(|&a, &b| p[b].total_cmp(&p[a]).then(a.cmp(&b)));
    idx.truncate(k);
    idx.into_iter().map(|i| (i, p[i])).collect()
}

/// SwiGLU of `x` (`[n][n_embd]`) through rows `[first, first + width)` of gate/up and the
/// matching slab of down; result `[n][n_embd]`.
#[allow(clippy::too_many_arguments)]
fn swiglu(
    mm: &MatmulCtx,
    gate: &Matrix,
    up: &Matrix,
    down: &Matrix,
    slab: usize,
    width: usize,
    x: &[f32],
    n: usize,
    out: &mut [f32],
) -> Result<()> {
    let mut g = vec![0f32; n * width];
    let mut u = vec![0f32; n * width];
    matmul_rows(mm, gate, slab * width, width, x, n, &mut g)?;
    matmul_rows(mm, up, slab * width, width, x, n, &mut u)?;
    g.iter_mut().zip(&u).for_each(|(a, b)| *a = silu(*a) * b);
    // Each slab of `down` has one row per hidden value.
    let rows = out.len() / n;
    matmul_rows(mm, down, slab * rows, rows, &g, n, out)
}

pub fn forward(
    c: &HybridConfig,
    mm: &MatmulCtx,
    w: &MoeWeights,
    h: &[f32],
    tokens: usize,
    out: &mut [f32],
) -> Result<()> {
    let e = c.n_embd;
    let mut logits = vec![0f32; tokens * c.n_expert];
    matmul(mm, &w.router, h, tokens, &mut logits)?;

    // Route: per expert, the tokens it serves and their weights, in token order.
    let mut routes: Vec<Vec<(usize, f32)>> = vec![Vec::new(); c.n_expert];
    for t in 0..tokens {
        let p = &mut logits[t * c.n_expert..(t + 1) * c.n_expert];
        softmax(p);
        let top = top_k(p, c.n_expert_used);
        let sum: f32 = top.iter().map(|(_, w)| w).sum();
        for (expert, weight) in top {
            routes[expert].push((t, weight / sum));
        }
    }

    out.iter_mut().for_each(|v| *v = 0.0);
    let mut gathered = Vec::new();
    let mut y = Vec::new();
    for (expert, served) in routes.iter().enumerate() {
        if served.is_empty() {
            continue;
        }
        let n = served.len();
        gathered.clear();
        for &(t, _) in served {
            gathered.extend_from_slice(&h[t * e..(t + 1) * e]);
        }
        y.resize(n * e, 0.0);
        swiglu(
            mm,
            &w.gate_exps,
            &w.up_exps,
            &w.down_exps,
            expert,
            c.expert_ff,
            &gathered,
            n,
            &mut y,
        )?;
        for (i, &(t, weight)) in served.iter().enumerate() {
            out[t * e..(t + 1) * e]
                .iter_mut()
                .zip(&y[i * e..(i + 1) * e])
                .for_each(|(o, v)| *o += weight * v);
        }
    }

    let mut shared = vec![0f32; tokens * e];
    swiglu(
        mm,
        &w.shared_gate,
        &w.shared_up,
        &w.shared_down,
        0,
        c.shared_ff,
        h,
        tokens,
        &mut shared,
    )?;
    let mut gates = vec![0f32; tokens];
    matmul(mm, &w.shared_gate_inp, h, tokens, &mut gates)?;
    for (t, gate) in gates.iter().enumerate() {
        let gate = sigmoid(*gate);
        out[t * e..(t + 1) * e]
            .iter_mut()
            .zip(&shared[t * e..(t + 1) * e])
            .for_each(|(o, s)| *o += gate * s);
    }
    Ok(())
}
