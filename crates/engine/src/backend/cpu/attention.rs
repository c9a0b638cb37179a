//! One gated full-attention mixer on the CPU (spec §3.3): per-head interleaved query and gate,
//! q/k RMSNorm, partial NEOX RoPE, GQA over the KV cache, causal softmax, sigmoid output gate.
// Index loops mirror the formulas (several arrays share one index).
#![allow(clippy::needless_range_loop)]

use crate::backend::cpu::linear::{dot, matmul, matmul_same_input, MatmulCtx};
use crate::backend::cpu::one_token::Product;
use crate::backend::cpu::ops::{rms_norm, sigmoid, softmax};
use crate::backend::cpu::pool;
use crate::backend::cpu::scratch::Scratch;
use crate::backend::cpu::weights::AttentionWeights;
use crate::backend::Batch;
use crate::error::Result;
use crate::model::config::HybridConfig;
use crate::state::KvCache;

/// Rotates the first `rope_dim` values of a head: pairs `(i, i + rope_dim / 2)`.
fn rope(x: &mut [f32], pos: usize, rope_dim: usize, base: f32) {
    let half = rope_dim / 2;
    for i in 0..half {
        let inv_freq = 1.0 / f64::from(base).powf(2.0 * i as f64 / rope_dim as f64);
        let angle = pos as f64 * inv_freq;
        let (sin, cos) = (angle.sin() as f32, angle.cos() as f32);
        let (a, b) = (x[i], x[i + half]);
        x[i] = a * cos - b * sin;
        x[i + half] = b * cos + a * sin;
    }
}

/// `h`: `[tokens][n_embd]` (normed input) → `out`: `[tokens][n_embd]`. The rows belong to
/// consecutive sequences, `(batch, cache)` each: projections run over all rows, the cache
/// write and the attention per sequence.
pub fn forward(
    c: &HybridConfig,
    mm: &MatmulCtx,
    w: &AttentionWeights,
    h: &[f32],
    seqs: &mut [(Batch, &mut KvCache)],
    out: &mut [f32],
) -> Result<()> {
    let (nh, nkv, hd) = (c.n_head, c.n_head_kv, c.head_dim);
    let tokens = h.len() / c.n_embd;
    let mut qg = Scratch::zeroed(tokens * 2 * nh * hd);
    let mut k = Scratch::zeroed(tokens * nkv * hd);
    let mut v = Scratch::zeroed(tokens * nkv * hd);
    matmul_same_input(
        mm,
        h,
        tokens,
        &mut [
            Product::whole(&w.q, &mut qg),
            Product::whole(&w.k, &mut k),
            Product::whole(&w.v, &mut v),
        ],
    )?;

    let mut o = Scratch::zeroed(tokens * nh * hd);
    let mut row0 = 0;
    for (b, kv) in seqs.iter_mut() {
        let rows = |width: usize| row0 * width..(row0 + b.tokens) * width;
        let (qg, o) = (&qg[rows(2 * nh * hd)], &mut o[rows(nh * hd)]);
        attend(
            c,
            w,
            *b,
            qg,
            &mut k[rows(nkv * hd)],
            &v[rows(nkv * hd)],
            kv,
            o,
        );
        row0 += b.tokens;
    }
    matmul(mm, &w.out, &o, tokens, out)
}

/// One sequence: q/k norms, RoPE and the cache write for its `b.tokens` rows, then causal
/// attention over its cache with the output gate, into `o` (`[tokens][heads * head_dim]`).
#[allow(clippy::too_many_arguments)]
fn attend(
    c: &HybridConfig,
    w: &AttentionWeights,
    b: Batch,
    qg: &[f32],
    k: &mut [f32],
    v: &[f32],
    kv: &mut KvCache,
    o: &mut [f32],
) {
    let (nh, nkv, hd) = (c.n_head, c.n_head_kv, c.head_dim);
    let mut tmp = Scratch::zeroed(hd);
    for t in 0..b.tokens {
        let pos = b.pos0 + t;
        for j in 0..nkv {
            let kj = &mut k[(t * nkv + j) * hd..][..hd];
            rms_norm(kj, &w.k_norm, c.rms_eps, &mut tmp);
            kj.copy_from_slice(&tmp);
            rope(kj, pos, c.rope_dim, c.rope_base);
        }
        kv.write(
            pos,
            &k[t * nkv * hd..(t + 1) * nkv * hd],
            &v[t * nkv * hd..(t + 1) * nkv * hd],
        );
    }

    // Each token's heads read only the cache: tokens run in parallel, each writing its own
    // output row (the same arithmetic as one after another).
    let kv = &*kv;
    let ran = pool::for_each_piece(o, nh * hd, &|t, row| {
        attend_token(
            c,
            w,
            b.pos0 + t,
            &qg[t * 2 * nh * hd..][..2 * nh * hd],
            kv,
            row,
        );
        Ok(())
    });
    debug_assert!(ran.is_ok(), "token tasks return no errors");
}

/// Every head of the token at `pos`: `qg` its `[heads][2][head_dim]` queries and gates, `o`
/// its `[heads * head_dim]` output.
fn attend_token(
    c: &HybridConfig,
    w: &AttentionWeights,
    pos: usize,
    qg: &[f32],
    kv: &KvCache,
    o: &mut [f32],
) {
    let (nh, nkv, hd) = (c.n_head, c.n_head_kv, c.head_dim);
    let group = nh / nkv;
    let scale = 1.0 / (hd as f32).sqrt();
    let mut key = Scratch::zeroed(hd);
    let mut val = Scratch::zeroed(hd);
    let mut qs = Scratch::zeroed(group * hd);
    // Sized for the whole cache once: the scores grow by one position per decode step.
    let mut scores = Scratch::with_capacity(group * (pos + 1), group * kv.capacity());
    // The query heads of one KV head together: each key and value is read once for all of
    // them; every head's own arithmetic is what it was one head at a time.
    for kvh in 0..nkv {
        let heads = kvh * group..(kvh + 1) * group;
        for (head, q) in heads.clone().zip(qs.chunks_exact_mut(hd)) {
            let base = head * 2 * hd;
            rms_norm(&qg[base..base + hd], &w.q_norm, c.rms_eps, q);
            rope(q, pos, c.rope_dim, c.rope_base);
        }
        for p in 0..=pos {
            kv.read_k(p, kvh * hd, &mut key);
            for (g, q) in qs.chunks_exact(hd).enumerate() {
                scores[g * (pos + 1) + p] = dot(q, &key) * scale;
            }
        }
        for s in scores.chunks_exact_mut(pos + 1) {
            softmax(s);
        }
        for p in 0..=pos {
            kv.read_v(p, kvh * hd, &mut val);
            for (g, head) in heads.clone().enumerate() {
                let s = scores[g * (pos + 1) + p];
                let oh = &mut o[head * hd..][..hd];
                oh.iter_mut().zip(&val).for_each(|(a, b)| *a += s * b);
            }
        }
    }
    for head in 0..nh {
        let base = head * 2 * hd;
        let oh = &mut o[head * hd..][..hd];
        let gate = &qg[base + hd..base + 2 * hd];
        oh.iter_mut().zip(gate).for_each(|(a, g)| *a *= sigmoid(*g));
    }
}
