//! One Gated DeltaNet mixer on the CPU (spec §3.2): projections, causal conv with its rolling
//! window, SiLU, L2-normalized q/k, gates, the delta rule, gated RMSNorm, output projection.
// Index loops mirror the formulas (several arrays share one index).
#![allow(clippy::needless_range_loop)]

use crate::backend::cpu::delta_rule::{self, DeltaDims, DeltaInputs};
use crate::backend::cpu::linear::{matmul, matmul_same_input, MatmulCtx};
use crate::backend::cpu::one_token::Product;
use crate::backend::cpu::ops::{l2_norm, rms_norm, sigmoid, silu, softplus};
use crate::backend::cpu::pool;
use crate::backend::cpu::scratch::Scratch;
use crate::backend::cpu::weights::DeltaNetWeights;
use crate::error::Result;
use crate::model::config::HybridConfig;
use crate::state::DeltaNetState;

/// Splits the legacy `ssm_in` output (per key group `[q k v… z…]`) into `qkv` (q | k | v, as
/// `attn_qkv` lays it out) and `z`.
fn split_legacy(c: &HybridConfig, p: &[f32], qkv: &mut [f32], z: &mut [f32]) {
    let (dk, dv) = (c.ssm_head_dim, c.ssm_head_dim);
    let r = c.ssm_v_heads / c.ssm_k_heads;
    let key_dim = c.ssm_k_heads * dk;
    let group = 2 * dk + 2 * r * dv;
    for g in 0..c.ssm_k_heads {
        let src = &p[g * group..(g + 1) * group];
        qkv[g * dk..(g + 1) * dk].copy_from_slice(&src[..dk]);
        qkv[key_dim + g * dk..key_dim + (g + 1) * dk].copy_from_slice(&src[dk..2 * dk]);
        let v_at = 2 * key_dim + g * r * dv;
        qkv[v_at..v_at + r * dv].copy_from_slice(&src[2 * dk..2 * dk + r * dv]);
        z[g * r * dv..(g + 1) * r * dv].copy_from_slice(&src[2 * dk + r * dv..]);
    }
}

/// Causal depthwise conv of `x` (`[tokens][channels]`, in place) continuing the rolling
/// `window` (`[kernel - 1][channels]`, oldest first), then SiLU; the window keeps the last
/// raw inputs.
fn conv_silu(c: &HybridConfig, taps_all: &[f32], window: &mut [f32], x: &mut [f32]) {
    let channels = c.conv_channels();
    let kernel = c.conv_kernel;
    let tokens = x.len() / channels;
    let history = window.len();
    let mut seq = Scratch::zeroed(history + x.len());
    seq[..history].copy_from_slice(window);
    seq[history..].copy_from_slice(x);
    // Each output row reads only `seq`: blocks of tokens in parallel.
    let seq = &seq;
    let ran = pool::for_each_piece(x, channels * TOKENS_PER_TASK, &|i, block| {
        for (dt, row) in block.chunks_mut(channels).enumerate() {
            let t = i * TOKENS_PER_TASK + dt;
            for (ch, out) in row.iter_mut().enumerate() {
                let taps = &taps_all[ch * kernel..(ch + 1) * kernel];
                let mut acc = 0f32;
                for (j, tap) in taps.iter().enumerate() {
                    acc += tap * seq[(t + j) * channels + ch];
                }
                *out = silu(acc);
            }
        }
        Ok(())
    });
    debug_assert!(ran.is_ok(), "conv tasks return no errors");
    window.copy_from_slice(&seq[tokens * channels..]);
}

/// One sequence's rows of a DeltaNet call.
pub struct SeqRows<'s> {
    pub tokens: usize,
    pub state: &'s mut DeltaNetState,
    /// When the call records (a speculative verification): receives the state after each
    /// row but the last, and the rows then run one at a time.
    pub record: Option<&'s mut Vec<DeltaNetState>>,
}

/// Tokens per parallel task of the per-token steps.
const TOKENS_PER_TASK: usize = 16;

/// `h`: `[tokens][n_embd]` (normed input) → `out`: `[tokens][n_embd]`. The rows belong to
/// consecutive sequences: projections and per-row math run over all rows, the conv window
/// and the delta rule per sequence.
pub fn forward(
    c: &HybridConfig,
    mm: &MatmulCtx,
    w: &DeltaNetWeights,
    h: &[f32],
    seqs: &mut [SeqRows<'_>],
    out: &mut [f32],
) -> Result<()> {
    let tokens = h.len() / c.n_embd;
    let channels = c.conv_channels();
    let inner = c.ssm_inner();
    let (nk, nv, dk, dv) = (c.ssm_k_heads, c.ssm_v_heads, c.ssm_head_dim, c.ssm_head_dim);

    // 1. Projections.
    let mut qkv = Scratch::zeroed(tokens * channels);
    let mut z = Scratch::zeroed(tokens * inner);
    let mut ba = Scratch::zeroed(tokens * 2 * nv);
    match &w.gate_proj {
        Some(gate) => matmul_same_input(
            mm,
            h,
            tokens,
            &mut [
                Product::whole(&w.in_proj, &mut qkv),
                Product::whole(gate, &mut z),
                Product::whole(&w.ba, &mut ba),
            ],
        )?,
        None => {
            let mut p = Scratch::zeroed(tokens * (channels + inner));
            matmul_same_input(
                mm,
                h,
                tokens,
                &mut [
                    Product::whole(&w.in_proj, &mut p),
                    Product::whole(&w.ba, &mut ba),
                ],
            )?;
            for t in 0..tokens {
                split_legacy(
                    c,
                    &p[t * (channels + inner)..(t + 1) * (channels + inner)],
                    &mut qkv[t * channels..(t + 1) * channels],
                    &mut z[t * inner..(t + 1) * inner],
                );
            }
        }
    }

    // 2. Causal depthwise conv over [window; new inputs], then SiLU; keep the last inputs.
    // A recorded sequence keeps the window after each row (the same math row by row).
    let mut row0 = 0;
    for seq in seqs.iter_mut() {
        let n = seq.tokens;
        let rows = &mut qkv[row0 * channels..(row0 + n) * channels];
        match seq.record.as_mut() {
            None => conv_silu(c, &w.conv, &mut seq.state.conv, rows),
            Some(record) => {
                record.clear();
                for (t, row) in rows.chunks_mut(channels).enumerate() {
                    conv_silu(c, &w.conv, &mut seq.state.conv, row);
                    if t + 1 < n {
                        record.push(DeltaNetState {
                            conv: seq.state.conv.clone(),
                            recurrent: Vec::new(),
                        });
                    }
                }
            }
        }
        row0 += n;
    }

    // 3. Split, L2-normalize q and k per head, scale q.
    let key_dim = nk * dk;
    let mut q = Scratch::zeroed(tokens * key_dim);
    let mut k = Scratch::zeroed(tokens * key_dim);
    let mut v = Scratch::zeroed(tokens * inner);
    let q_scale = 1.0 / (dk as f32).sqrt();
    for t in 0..tokens {
        let row = &qkv[t * channels..(t + 1) * channels];
        q[t * key_dim..(t + 1) * key_dim].copy_from_slice(&row[..key_dim]);
        k[t * key_dim..(t + 1) * key_dim].copy_from_slice(&row[key_dim..2 * key_dim]);
        v[t * inner..(t + 1) * inner].copy_from_slice(&row[2 * key_dim..]);
    }
    for head in q.chunks_mut(dk) {
        l2_norm(head, c.rms_eps);
        head.iter_mut().for_each(|x| *x *= q_scale);
    }
    for head in k.chunks_mut(dk) {
        l2_norm(head, c.rms_eps);
    }

    // 4. Gates. `ssm_ba` is grouped per key head: [b × r, a × r].
    let r = nv / nk;
    let mut beta = Scratch::zeroed(tokens * nv);
    let mut g = Scratch::zeroed(tokens * nv);
    for t in 0..tokens {
        for hd in 0..nv {
            let base = t * 2 * nv + 2 * r * (hd / r);
            let b_val = ba[base + hd % r];
            let a_val = ba[base + r + hd % r];
            beta[t * nv + hd] = sigmoid(b_val);
            g[t * nv + hd] = w.a[hd] * softplus(a_val + w.dt_bias[hd]);
        }
    }

    // 5. The delta rule: the token loop for one token (and for each row of a recorded
    // sequence), the chunked form for a prompt.
    let dims = DeltaDims {
        k_heads: nk,
        v_heads: nv,
        dk,
        dv,
    };
    let mut o = Scratch::zeroed(tokens * inner);
    let mut row0 = 0;
    for seq in seqs.iter_mut() {
        let n = seq.tokens;
        let rows = |from: usize, to: usize, width: usize| from * width..to * width;
        let inputs = |from: usize, to: usize| DeltaInputs {
            q: &q[rows(from, to, key_dim)],
            k: &k[rows(from, to, key_dim)],
            v: &v[rows(from, to, inner)],
            g: &g[rows(from, to, nv)],
            beta: &beta[rows(from, to, nv)],
        };
        match seq.record.as_mut() {
            Some(record) => {
                for t in 0..n {
                    let at = row0 + t;
                    let o_row = &mut o[rows(at, at + 1, inner)];
                    delta_rule::recurrent(
                        &dims,
                        &inputs(at, at + 1),
                        &mut seq.state.recurrent,
                        o_row,
                    );
                    if let Some(saved) = record.get_mut(t) {
                        saved.recurrent.clone_from(&seq.state.recurrent);
                    }
                }
            }
            None if n == 1 => {
                let o_seq = &mut o[rows(row0, row0 + n, inner)];
                delta_rule::recurrent(
                    &dims,
                    &inputs(row0, row0 + n),
                    &mut seq.state.recurrent,
                    o_seq,
                );
            }
            None => {
                let o_seq = &mut o[rows(row0, row0 + n, inner)];
                delta_rule::chunked(
                    &dims,
                    &inputs(row0, row0 + n),
                    &mut seq.state.recurrent,
                    o_seq,
                );
            }
        }
        row0 += n;
    }

    // 6. Gated RMSNorm per head: RMSNorm(o_h) · ssm_norm · silu(z_h).
    pool::for_each_piece(&mut o, inner * TOKENS_PER_TASK, &|i, block| {
        let z = &z[i * inner * TOKENS_PER_TASK..];
        let mut normed = Scratch::zeroed(dv);
        for (oh, zh) in block.chunks_mut(dv).zip(z.chunks(dv)) {
            rms_norm(oh, &w.norm, c.rms_eps, &mut normed);
            for ((x, n), zz) in oh.iter_mut().zip(normed.iter()).zip(zh) {
                *x = n * silu(*zz);
            }
        }
        Ok(())
    })?;

    // 7. Output projection.
    matmul(mm, &w.out, &o, tokens, out)
}
