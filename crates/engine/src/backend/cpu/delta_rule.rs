//! The gated delta rule, per v-head, in its two forms: the token loop (decode) and the
//! chunked WY form (prefill). Both compute, for each token t in order:
//!
//! ```text
//! S ← α_t S                      α_t = exp(g_t), g_t ≤ 0
//! δ = β_t (v_t − Sᵀ k_t)         the memory's prediction error for key k_t
//! S ← S + k_t δᵀ                 rank-1 write
//! o_t = Sᵀ q_t
//! ```
//!
//! Shapes (outermost first): `q`, `k`: `[T][k_heads][dk]`; `v`: `[T][v_heads][dv]`;
//! `g`, `beta`: `[T][v_heads]`; `state`: `[v_heads][dk][dv]`; `out`: `[T][v_heads][dv]`.
//! V-head h reads q/k head `h / (v_heads / k_heads)` (repeat-interleave).
// Index loops mirror the formulas (several arrays share one index).
#![allow(clippy::needless_range_loop)]

use crate::backend::cpu::linear::dot;
use crate::backend::cpu::pool;
use crate::backend::cpu::scratch::Scratch;

/// Sizes of one layer's recurrence.
#[derive(Clone, Copy, Debug)]
pub struct DeltaDims {
    pub k_heads: usize,
    pub v_heads: usize,
    pub dk: usize,
    pub dv: usize,
}

pub struct DeltaInputs<'a> {
    pub q: &'a [f32],
    pub k: &'a [f32],
    pub v: &'a [f32],
    pub g: &'a [f32],
    pub beta: &'a [f32],
}

impl DeltaInputs<'_> {
    fn tokens(&self, d: &DeltaDims) -> usize {
        self.g.len() / d.v_heads
    }

    fn check(&self, d: &DeltaDims, state: &[f32], out: &[f32]) {
        let t = self.tokens(d);
        debug_assert_eq!(self.q.len(), t * d.k_heads * d.dk);
        debug_assert_eq!(self.k.len(), t * d.k_heads * d.dk);
        debug_assert_eq!(self.v.len(), t * d.v_heads * d.dv);
        debug_assert_eq!(self.beta.len(), t * d.v_heads);
        debug_assert_eq!(state.len(), d.v_heads * d.dk * d.dv);
        debug_assert_eq!(out.len(), t * d.v_heads * d.dv);
    }
}

/// One v-head's work: `(h, state_h, out_h)`.
type HeadFn<'a> = dyn Fn(usize, &mut [f32], &mut [f32]) + Sync + 'a;

/// Runs `head(h, state_h, out_h)` for every v-head across the CPU pool, where `state_h` is
/// head h's `[dk][dv]` state and `out_h` its `[T][dv]` outputs. Heads are independent, so
/// the result is the same as running them in order.
fn for_each_head(
    d: &DeltaDims,
    tokens: usize,
    state: &mut [f32],
    out: &mut [f32],
    head: &HeadFn<'_>,
) {
    let (dk, dv) = (d.dk, d.dv);
    // One token: head h's outputs are contiguous in `out`, written in place.
    let mut staged = Scratch::zeroed(if tokens == 1 {
        0
    } else {
        d.v_heads * tokens * dv
    });
    let head_out: &mut [f32] = if tokens == 1 { out } else { &mut staged };
    let ran = pool::for_each_piece_pair(state, dk * dv, head_out, tokens * dv, &|h, s, o| {
        head(h, s, o);
        Ok(())
    });
    debug_assert!(ran.is_ok(), "head tasks return no errors");
    if tokens > 1 {
        // Back to `[T][v_heads][dv]`, blocks of tokens in parallel.
        const TOKENS_PER_TASK: usize = 16;
        let staged = &staged;
        let ran = pool::for_each_piece(out, d.v_heads * dv * TOKENS_PER_TASK, &|i, block| {
            for (dt, row) in block.chunks_mut(d.v_heads * dv).enumerate() {
                let t = i * TOKENS_PER_TASK + dt;
                for (h, o) in row.chunks_mut(dv).enumerate() {
                    o.copy_from_slice(&staged[(h * tokens + t) * dv..][..dv]);
                }
            }
            Ok(())
        });
        debug_assert!(ran.is_ok(), "copy tasks return no errors");
    }
}

/// The token loop: exact semantics, used for decode.
pub fn recurrent(d: &DeltaDims, x: &DeltaInputs, state: &mut [f32], out: &mut [f32]) {
    x.check(d, state, out);
    let tokens = x.tokens(d);
    for_each_head(d, tokens, state, out, &|h, s, o| {
        wide::recurrent_head(d, x, h, s, o)
    });
}

/// [`recurrent`] for v-head `h`: `s` its `[dk][dv]` state, `out` its `[T][dv]` outputs.
#[inline(always)]
fn recurrent_head(d: &DeltaDims, x: &DeltaInputs, h: usize, s: &mut [f32], out: &mut [f32]) {
    let (dk, dv) = (d.dk, d.dv);
    let group = d.v_heads / d.k_heads;
    let mut delta = Scratch::zeroed(dv);
    let kh = h / group;
    for t in 0..x.tokens(d) {
        let q = &x.q[(t * d.k_heads + kh) * dk..][..dk];
        let k = &x.k[(t * d.k_heads + kh) * dk..][..dk];
        let v = &x.v[(t * d.v_heads + h) * dv..][..dv];
        let alpha = x.g[t * d.v_heads + h].exp();
        let beta = x.beta[t * d.v_heads + h];
        s.iter_mut().for_each(|e| *e *= alpha);
        delta.copy_from_slice(v);
        for (row, &ki) in s.chunks_exact(dv).zip(k) {
            sub_scaled(&mut delta, ki, row);
        }
        delta.iter_mut().for_each(|e| *e *= beta);
        let o = &mut out[t * dv..][..dv];
        o.iter_mut().for_each(|e| *e = 0.0);
        for ((row, &ki), &qi) in s.chunks_exact_mut(dv).zip(k).zip(q) {
            for ((r, o), &d) in row.iter_mut().zip(o.iter_mut()).zip(delta.iter()) {
                *r += ki * d;
                *o += *r * qi;
            }
        }
    }
}

/// `y -= a x`, element by element (slices, not indices: no bounds checks in the loop, so it
/// vectorizes; each element's one multiply and one subtract are the indexed loop's).
#[inline(always)]
fn sub_scaled(y: &mut [f32], a: f32, x: &[f32]) {
    for (y, &x) in y.iter_mut().zip(x) {
        *y -= a * x;
    }
}

/// `y[r][j] ±= Σ_i a[r][i] · m[i][j]` (minus with `SUB`) for `y`: rows x `w`, `a`: rows x `k`,
/// `m`: `k` x `w`, each element's terms taken in `i` order: the same operations, in the same
/// order, as [`add_scaled`] / [`sub_scaled`] of each `y` row with the rows of `m` one after the
/// other — the same bits. Tiles of 4 rows x 16 columns stay in registers while `i` runs, so a
/// row of `m` is loaded once per 4 rows of `y` and `y` once per tile instead of once per `i`
/// (the row-by-row loops were bound by those loads and stores).
#[inline(always)]
fn products<const SUB: bool>(y: &mut [f32], a: &[f32], m: &[f32], k: usize, w: usize) {
    const R: usize = 4;
    const J: usize = 16;
    let rows = y.len() / w.max(1);
    let term = |acc: &mut f32, a: f32, x: f32| {
        if SUB {
            *acc -= a * x;
        } else {
            *acc += a * x;
        }
    };
    let mut r0 = 0;
    while r0 + R <= rows {
        let mut j0 = 0;
        while j0 + J <= w {
            let mut acc = [[0f32; J]; R];
            for (rr, tile) in acc.iter_mut().enumerate() {
                tile.copy_from_slice(&y[(r0 + rr) * w + j0..][..J]);
            }
            for i in 0..k {
                let mi = &m[i * w + j0..][..J];
                for (rr, tile) in acc.iter_mut().enumerate() {
                    let ar = a[(r0 + rr) * k + i];
                    for (t, &x) in tile.iter_mut().zip(mi) {
                        term(t, ar, x);
                    }
                }
            }
            for (rr, tile) in acc.iter().enumerate() {
                y[(r0 + rr) * w + j0..][..J].copy_from_slice(tile);
            }
            j0 += J;
        }
        for r in r0..r0 + R {
            for i in 0..k {
                let ar = a[r * k + i];
                for j in j0..w {
                    term(&mut y[r * w + j], ar, m[i * w + j]);
                }
            }
        }
        r0 += R;
    }
    for r in r0..rows {
        let yr = &mut y[r * w..][..w];
        for (i, mi) in m.chunks_exact(w).take(k).enumerate() {
            let ar = a[r * k + i];
            for (t, &x) in yr.iter_mut().zip(mi) {
                term(t, ar, x);
            }
        }
    }
}

/// `y += a x`, as [`sub_scaled`].
#[inline(always)]
fn add_scaled(y: &mut [f32], a: f32, x: &[f32]) {
    for (y, &x) in y.iter_mut().zip(x) {
        *y += a * x;
    }
}

/// Tokens per chunk of the WY form.
pub const CHUNK: usize = 64;

/// The chunked form (spec §3.2 step 5′), used for prefill. Agrees with [`recurrent`] up to
/// rounding: within a chunk the writes are solved for at once through the unit
/// lower-triangular system `(I + L) U = diag(β) V`, so the work is matrix products.
pub fn chunked(d: &DeltaDims, x: &DeltaInputs, state: &mut [f32], out: &mut [f32]) {
    x.check(d, state, out);
    let tokens = x.tokens(d);
    for_each_head(d, tokens, state, out, &|h, s, o| {
        wide::chunked_head(d, x, h, s, o)
    });
}

/// [`chunked`] for v-head `h`: `s` its `[dk][dv]` state, `out` its `[T][dv]` outputs.
#[inline(always)]
fn chunked_head(d: &DeltaDims, x: &DeltaInputs, h: usize, s: &mut [f32], out: &mut [f32]) {
    let (dk, dv) = (d.dk, d.dv);
    let group = d.v_heads / d.k_heads;
    let tokens = x.tokens(d);
    // Per-chunk scratch, reused for every chunk.
    let mut cum = Scratch::zeroed(CHUNK);
    let mut kk = Scratch::zeroed(CHUNK * CHUNK);
    let mut u = Scratch::zeroed(CHUNK * dv);
    let mut w = Scratch::zeroed(CHUNK * dk);
    let mut new_v = Scratch::zeroed(CHUNK * dv);
    let mut q_scaled = Scratch::zeroed(CHUNK * dk);
    let mut k_scaled = Scratch::zeroed(dk * CHUNK);
    let kh = h / group;
    let q_of = |t: usize| &x.q[(t * d.k_heads + kh) * dk..][..dk];
    let k_of = |t: usize| &x.k[(t * d.k_heads + kh) * dk..][..dk];
    let mut start = 0;
    while start < tokens {
        let n = CHUNK.min(tokens - start);
        // 1. Cumulative log-decay within the chunk.
        let mut acc = 0f32;
        for r in 0..n {
            acc += x.g[(start + r) * d.v_heads + h];
            cum[r] = acc;
        }
        // 2. Key Gram matrix (lower triangle incl. diagonal).
        for r in 0..n {
            for c in 0..=r {
                kk[r * CHUNK + c] = dot(k_of(start + r), k_of(start + c));
            }
        }
        // 3-4. Forward substitution: U_r = β_r v_r − Σ_{s<r} L_rs U_s,
        //      W_r = β_r e^{G_r} k_r − Σ_{s<r} L_rs W_s, with L_rs = β_r (k_r·k_s) e^{G_r−G_s}.
        for r in 0..n {
            let beta = x.beta[(start + r) * d.v_heads + h];
            let v = &x.v[((start + r) * d.v_heads + h) * dv..][..dv];
            let k = k_of(start + r);
            let beta_eg = beta * cum[r].exp();
            let (u_done, u_rest) = u.split_at_mut(r * dv);
            let (w_done, w_rest) = w.split_at_mut(r * dk);
            let (u_r, w_r) = (&mut u_rest[..dv], &mut w_rest[..dk]);
            u_r.iter_mut().zip(v).for_each(|(u, &v)| *u = beta * v);
            w_r.iter_mut().zip(k).for_each(|(w, &k)| *w = beta_eg * k);
            for (s_, (u_s, w_s)) in u_done
                .chunks_exact(dv)
                .zip(w_done.chunks_exact(dk))
                .enumerate()
            {
                let l = beta * kk[r * CHUNK + s_] * (cum[r] - cum[s_]).exp();
                sub_scaled(u_r, l, u_s);
                sub_scaled(w_r, l, w_s);
            }
        }
        // 5. V' = U − W S.
        new_v[..n * dv].copy_from_slice(&u[..n * dv]);
        products::<true>(&mut new_v[..n * dv], &w[..n * dk], s, dk, dv);
        // Outputs: O_r = e^{G_r} q_r S + Σ_{s≤r} (q_r·k_s) e^{G_r−G_s} v'_s.
        for (r, qs) in q_scaled.chunks_exact_mut(dk).take(n).enumerate() {
            let eg = cum[r].exp();
            qs.iter_mut()
                .zip(q_of(start + r))
                .for_each(|(e, &qi)| *e = qi * eg);
        }
        let o_chunk = &mut out[start * dv..][..n * dv];
        o_chunk.iter_mut().for_each(|e| *e = 0.0);
        products::<false>(o_chunk, &q_scaled[..n * dk], s, dk, dv);
        for r in 0..n {
            let q = q_of(start + r);
            let o = &mut out[(start + r) * dv..][..dv];
            for (s_, nv) in new_v.chunks_exact(dv).take(r + 1).enumerate() {
                let m = dot(q, k_of(start + s_)) * (cum[r] - cum[s_]).exp();
                add_scaled(o, m, nv);
            }
        }
        // New state: e^{G_last} S + Σ_r e^{G_last − G_r} k_r v'_rᵀ.
        let last = cum[n - 1];
        let decay = last.exp();
        s.iter_mut().for_each(|e| *e *= decay);
        for r in 0..n {
            let f = (last - cum[r]).exp();
            for (i, &ki) in k_of(start + r).iter().enumerate() {
                k_scaled[i * n + r] = ki * f;
            }
        }
        products::<false>(s, &k_scaled[..dk * n], &new_v[..n * dv], n, dv);
        start += n;
    }
}

/// The head functions compiled a second time with AVX2 enabled, chosen at run time. The engine
/// crate is built for baseline x86-64 (SSE2): its axpy loops run 4 lanes wide; here 8. FMA is
/// not enabled, so every multiply and add rounds as in the baseline build and `dot` keeps its
/// 8 lanes: the results are bit-identical, only the vectors are wider.
mod wide {
    use super::{DeltaDims, DeltaInputs};

    #[cfg(target_arch = "x86_64")]
    fn has_avx2() -> bool {
        static AVX2: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
        *AVX2.get_or_init(|| std::is_x86_feature_detected!("avx2"))
    }

    macro_rules! dispatch {
        ($name:ident, $avx2:ident) => {
            #[cfg(target_arch = "x86_64")]
            #[target_feature(enable = "avx2")]
            fn $avx2(d: &DeltaDims, x: &DeltaInputs, h: usize, s: &mut [f32], o: &mut [f32]) {
                super::$name(d, x, h, s, o)
            }

            pub(super) fn $name(
                d: &DeltaDims,
                x: &DeltaInputs,
                h: usize,
                s: &mut [f32],
                o: &mut [f32],
            ) {
                #[cfg(target_arch = "x86_64")]
                if has_avx2() {
                    // SAFETY: the CPU has AVX2 (detected at run time), the one feature enabled.
                    return unsafe { $avx2(d, x, h, s, o) };
                }
                super::$name(d, x, h, s, o)
            }
        };
    }

    dispatch!(recurrent_head, recurrent_head_avx2);
    dispatch!(chunked_head, chunked_head_avx2);
}

#[cfg(test)]
mod tests {
    use super::*;

    fn random(seed: &mut u64, n: usize, scale: f32) -> Vec<f32> {
        (0..n)
            .map(|_| {
                *seed = seed
                    .wrapping_mul(6364136223846793005)
                    .wrapping_add(1442695040888963407);
                ((*seed >> 40) as f32 / (1u64 << 24) as f32 - 0.5) * 2.0 * scale
            })
            .collect()
    }

    fn normalize_heads(x: &mut [f32], dim: usize, scale: f32) {
        for head in x.chunks_mut(dim) {
            let n = head.iter().map(|v| v * v).sum::<f32>().sqrt();
            head.iter_mut().for_each(|v| *v *= scale / n);
        }
    }

    #[test]
    fn chunked_matches_the_token_loop() {
        let d = DeltaDims {
            k_heads: 2,
            v_heads: 4,
            dk: 16,
            dv: 8,
        };
        for tokens in [1, 7, 64, 65, 150] {
            let mut seed = tokens as u64;
            let mut q = random(&mut seed, tokens * d.k_heads * d.dk, 1.0);
            let mut k = random(&mut seed, tokens * d.k_heads * d.dk, 1.0);
            normalize_heads(&mut q, d.dk, 1.0 / (d.dk as f32).sqrt());
            normalize_heads(&mut k, d.dk, 1.0);
            let v = random(&mut seed, tokens * d.v_heads * d.dv, 1.0);
            let g: Vec<f32> = random(&mut seed, tokens * d.v_heads, 1.0)
                .iter()
                .map(|x| -0.3 * x.abs())
                .collect();
            let beta: Vec<f32> = random(&mut seed, tokens * d.v_heads, 1.0)
                .iter()
                .map(|x| 0.5 + 0.5 * x)
                .collect();
            let init = random(&mut seed, d.v_heads * d.dk * d.dv, 0.5);
            let x = DeltaInputs {
                q: &q,
                k: &k,
                v: &v,
                g: &g,
                beta: &beta,
            };
            let (mut s1, mut s2) = (init.clone(), init);
            let mut o1 = vec![0f32; tokens * d.v_heads * d.dv];
            let mut o2 = o1.clone();
            recurrent(&d, &x, &mut s1, &mut o1);
            chunked(&d, &x, &mut s2, &mut o2);
            let rel = |a: &[f32], b: &[f32]| {
                let num: f32 = a.iter().zip(b).map(|(x, y)| (x - y).powi(2)).sum();
                let den: f32 = a.iter().map(|x| x * x).sum();
                (num / den).sqrt()
            };
            assert!(
                rel(&o1, &o2) < 1e-5,
                "{tokens} tokens: outputs differ by {}",
                rel(&o1, &o2)
            );
            assert!(
                rel(&s1, &s2) < 1e-5,
                "{tokens} tokens: states differ by {}",
                rel(&s1, &s2)
            );
        }
    }
}
