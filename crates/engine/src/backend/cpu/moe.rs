//! The MoE block on the CPU (spec §3.4): softmax router, top-k, renormalized weights, SwiGLU
//! experts (tokens grouped by expert, so each expert's rows are decoded once per batch) and
//! the shared expert scaled by its sigmoid gate.

use std::borrow::Cow;
use std::sync::Mutex;

use redlite_quant::vec_dot_type;

use crate::backend::cpu::linear::{
    matmul_same_input, run_jobs, MatmulCtx, Precision, Prepared, RowJob,
};
use crate::backend::cpu::moe_decode;
use crate::backend::cpu::one_token::Product;
use crate::backend::cpu::ops::{sigmoid, silu, softmax};
use crate::backend::cpu::pool;
use crate::backend::cpu::weights::{Matrix, MoeWeights};
use crate::error::Result;
use crate::model::config::HybridConfig;

/// One token's experts and their router probabilities.
type Routed = Vec<(usize, f32)>;

/// Tokens routed per parallel task.
const ROUTE_TOKENS_PER_TASK: usize = 16;

/// Model-width values per task of the experts' weighted sum.
const SUM_COLS_PER_TASK: usize = 128;

/// The `k` largest of `p` (ties to the lower index), with their probabilities.
pub fn top_k(p: &[f32], k: usize) -> Vec<(usize, f32)> {
    let mut idx: Vec<usize> = (0..p.len()).collect();
    let order = |a: &usize, b: &usize| p[*b].total_cmp(&p[*a]).then(a.cmp(b));
    // A total order: selecting the k first, then sorting them, gives the full sort's head.
    if k < idx.len() {
        if k > 0 {
            idx.select_nth_unstable_by(k - 1, order);
        }
        idx.truncate(k);
    }
    idx.sort_by(order);
    idx.into_iter().map(|i| (i, p[i])).collect()
}

/// One SwiGLU feed-forward to run: a routed expert (a slab of the stacks) or the shared
/// expert, with the tokens it serves and their weights.
struct Unit<'w> {
    gate: &'w Matrix,
    up: &'w Matrix,
    down: &'w Matrix,
    /// Slab index within the stacks (0 for the shared expert's own matrices).
    slab: usize,
    width: usize,
    served: Vec<(usize, f32)>,
    /// The served tokens' inputs, `[n][n_embd]`.
    x: Cow<'w, [f32]>,
}

pub fn forward(
    c: &HybridConfig,
    mm: &MatmulCtx,
    w: &MoeWeights,
    h: &[f32],
    tokens: usize,
    out: &mut [f32],
) -> Result<()> {
    if moe_decode::applies(c, mm, tokens) {
        return moe_decode::forward(c, mm, w, h, out);
    }
    let e = c.n_embd;
    let mut logits = vec![0f32; tokens * c.n_expert];
    let mut shared_gates = vec![0f32; tokens];
    matmul_same_input(
        mm,
        h,
        tokens,
        &mut [
            Product::whole(&w.router, &mut logits),
            Product::whole(&w.shared_gate_inp, &mut shared_gates),
        ],
    )?;

    // Route: per expert, the tokens it serves and their weights, in token order.
    // Each token's softmax and top-k are its own: computed in parallel, a block per task.
    let tops: Vec<Mutex<(&mut [f32], Vec<Routed>)>> = logits
        .chunks_mut(c.n_expert * ROUTE_TOKENS_PER_TASK)
        .map(|block| Mutex::new((block, Vec::new())))
        .collect();
    pool::for_each(tops.len(), &|i| {
        let mut guard = tops[i].lock().unwrap_or_else(|p| p.into_inner());
        let (block, top) = &mut *guard;
        for p in block.chunks_mut(c.n_expert) {
            softmax(p);
            top.push(top_k(p, c.n_expert_used));
        }
        Ok(())
    })?;
    let mut routes: Vec<Vec<(usize, f32)>> = vec![Vec::new(); c.n_expert];
    let per_token = tops
        .into_iter()
        .flat_map(|m| m.into_inner().unwrap_or_else(|p| p.into_inner()).1);
    for (t, top) in per_token.enumerate() {
        let sum: f32 = top.iter().map(|(_, w)| w).sum();
        for (expert, weight) in top {
            routes[expert].push((t, weight / sum));
        }
    }
    // Each token's input quantized once for every expert whose gate dots the same format
    // (the same bits as quantizing each expert's copy); the experts' batches are picked
    // from it. Only f32 rows (exact precision) are gathered per expert.
    let base = match mm.precision {
        Precision::Ggml => Some(Prepared::new(mm, w.gate_exps.ty, h, e)?),
        Precision::Exact => None,
    };
    let picks_from_base = |ty| {
        base.as_ref()
            .is_some_and(|b| b.format() == Some(vec_dot_type(ty)))
    };
    let gather = |served: &[(usize, f32)]| -> Vec<f32> {
        served
            .iter()
            .flat_map(|&(t, _)| h[t * e..(t + 1) * e].iter().copied())
            .collect()
    };
    // Routed experts in ascending order, then the shared expert (the order of the sum).
    let mut units: Vec<Unit> = routes
        .into_iter()
        .enumerate()
        .filter(|(_, served)| !served.is_empty())
        .map(|(expert, served)| Unit {
            gate: &w.gate_exps,
            up: &w.up_exps,
            down: &w.down_exps,
            slab: expert,
            width: c.expert_ff,
            x: if picks_from_base(w.gate_exps.ty)
                && vec_dot_type(w.up_exps.ty) == vec_dot_type(w.gate_exps.ty)
            {
                Cow::Borrowed(&[][..])
            } else {
                Cow::Owned(gather(&served))
            },
            served,
        })
        .collect();
    let shared: Vec<(usize, f32)> = shared_gates
        .iter()
        .enumerate()
        .map(|(t, g)| (t, sigmoid(*g)))
        .collect();
    units.push(Unit {
        gate: &w.shared_gate,
        up: &w.shared_up,
        down: &w.shared_down,
        slab: 0,
        width: c.shared_ff,
        x: if picks_from_base(w.shared_gate.ty)
            && vec_dot_type(w.shared_up.ty) == vec_dot_type(w.shared_gate.ty)
        {
            Cow::Borrowed(&[][..])
        } else {
            Cow::Borrowed(h)
        },
        served: shared,
    });

    // Gate and up projections of every unit in one parallel region.
    // Gate and up usually share a type: their input is then prepared once. Batches picked
    // from `base` are copies, made in parallel; the others are prepared (in parallel
    // inside) one by one.
    let picked: Vec<Mutex<Option<Prepared<'static>>>> =
        units.iter().map(|_| Mutex::new(None)).collect();
    pool::for_each(units.len(), &|i| {
        let (u, Some(base)) = (&units[i], base.as_ref()) else {
            return Ok(());
        };
        if u.x.is_empty() {
            let tokens: Vec<usize> = u.served.iter().map(|&(t, _)| t).collect();
            *picked[i].lock().unwrap_or_else(|p| p.into_inner()) = Some(base.select(&tokens)?);
        }
        Ok(())
    })?;
    let preps = units
        .iter()
        .zip(picked)
        .map(|(u, picked)| {
            let gate = match picked.into_inner().unwrap_or_else(|p| p.into_inner()) {
                Some(gate) => gate,
                None => Prepared::new(mm, u.gate.ty, &u.x, e)?,
            };
            let up = if vec_dot_type(u.up.ty) == vec_dot_type(u.gate.ty) {
                None
            } else {
                Some(Prepared::new(mm, u.up.ty, &u.x, e)?)
            };
            Ok((gate, up))
        })
        .collect::<Result<Vec<_>>>()?;
    let mut gates: Vec<Vec<f32>> = units
        .iter()
        .map(|u| vec![0f32; u.width * u.served.len()])
        .collect();
    let mut ups = gates.clone();
    let mut jobs = Vec::with_capacity(2 * units.len());
    for (((u, (pg, pu)), g), up) in units.iter().zip(&preps).zip(&mut gates).zip(&mut ups) {
        let first = u.slab * u.width;
        jobs.push(RowJob {
            w: u.gate,
            first,
            n: u.width,
            prep: pg,
            out: g,
        });
        jobs.push(RowJob {
            w: u.up,
            first,
            n: u.width,
            prep: pu.as_ref().unwrap_or(pg),
            out: up,
        });
    }
    run_jobs(mm, jobs)?;

    // SwiGLU, token-major, then the down projections in one region.
    let swiglu: Vec<Mutex<Vec<f32>>> = units.iter().map(|_| Mutex::new(Vec::new())).collect();
    pool::for_each(units.len(), &|i| {
        let (u, g, up) = (&units[i], &gates[i], &ups[i]);
        let n = u.served.len();
        let mut a = vec![0f32; n * u.width];
        for r in 0..u.width {
            for t in 0..n {
                a[t * u.width + r] = silu(g[r * n + t]) * up[r * n + t];
            }
        }
        *swiglu[i].lock().unwrap_or_else(|p| p.into_inner()) = a;
        Ok(())
    })?;
    let swiglu: Vec<Vec<f32>> = swiglu
        .into_iter()
        .map(|m| m.into_inner().unwrap_or_else(|p| p.into_inner()))
        .collect();
    // One unit's input per task (a unit serves ~10 tokens of a prompt: one block).
    let down_preps: Vec<Mutex<Option<Prepared<'_>>>> =
        units.iter().map(|_| Mutex::new(None)).collect();
    pool::for_each(units.len(), &|i| {
        let prep = Prepared::new(mm, units[i].down.ty, &swiglu[i], units[i].width)?;
        *down_preps[i].lock().unwrap_or_else(|p| p.into_inner()) = Some(prep);
        Ok(())
    })?;
    let down_preps = down_preps
        .into_iter()
        .map(|p| {
            p.into_inner()
                .unwrap_or_else(|p| p.into_inner())
                .ok_or_else(|| {
                    crate::error::EngineError::BadConfig("unprepared expert input".into())
                })
        })
        .collect::<Result<Vec<_>>>()?;
    let mut downs: Vec<Vec<f32>> = units
        .iter()
        .map(|u| vec![0f32; e * u.served.len()])
        .collect();
    let jobs = units
        .iter()
        .zip(&down_preps)
        .zip(&mut downs)
        .map(|((u, prep), out)| RowJob {
            w: u.down,
            first: u.slab * e,
            n: e,
            prep,
            out,
        })
        .collect();
    run_jobs(mm, jobs)?;

    // The weighted sum, a slice of the model width per task: each output value still adds
    // its units in unit order.
    out.iter_mut().for_each(|v| *v = 0.0);
    let slices: Vec<Mutex<Vec<&mut [f32]>>> = (0..e.div_ceil(SUM_COLS_PER_TASK))
        .map(|_| Mutex::new(Vec::new()))
        .collect();
    // Slice j holds every token's columns from j·SUM_COLS_PER_TASK, in token order.
    for row in out.chunks_mut(e) {
        for (j, part) in row.chunks_mut(SUM_COLS_PER_TASK).enumerate() {
            slices[j]
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .push(part);
        }
    }
    pool::for_each(slices.len(), &|j| {
        let mut rows = slices[j].lock().unwrap_or_else(|p| p.into_inner());
        let r0 = j * SUM_COLS_PER_TASK;
        for (u, d) in units.iter().zip(&downs) {
            let n = u.served.len();
            for (i, &(t, weight)) in u.served.iter().enumerate() {
                for (k, o) in rows[t].iter_mut().enumerate() {
                    *o += weight * d[(r0 + k) * n + i];
                }
            }
        }
        Ok(())
    })?;
    Ok(())
}
