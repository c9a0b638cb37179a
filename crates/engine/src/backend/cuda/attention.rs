//! One gated full-attention mixer on the GPU (spec §3.3), mirroring `cpu::attention`:
//! q (with its per-head gate), k, v projections; q/k RMSNorm + partial NEOX RoPE + KV write;
//! causal attention over the cache with the sigmoid gate; output projection.

use std::sync::OnceLock;

use redlite_cuda::{
    attention, attention_prep, attention_rows_to_l2, matmul, matmul_quantized, AttentionShape,
    CudaSlice, CudaView, CudaViewMut, Device, KvElement, Position, Q8Rows,
    ONE_TOKEN_KERNELS_MAX_TOKENS,
};

use crate::backend::cuda::beside;
use crate::backend::cuda::scratch::Scratch;
use crate::backend::cuda::state::LayerKv;
use crate::backend::cuda::weights::AttentionWeights;
use crate::backend::Batch;
use crate::error::Result;
use crate::model::config::HybridConfig;

/// `h`: `[T][n_embd]` (normed input) → `out`: `[T][n_embd]`; extends the layer's KV cache
/// at positions `b.pos0..b.pos0 + T` (`position`: where the kernels read `b.pos0` from).
#[allow(clippy::too_many_arguments)]
pub fn forward(
    device: &Device,
    c: &HybridConfig,
    w: &AttentionWeights,
    s: &mut Scratch,
    b: Batch,
    (h, h_q8): (&CudaView<'_, f32>, Option<&Q8Rows<'_>>),
    kv: &mut LayerKv,
    capacity: usize,
    out: &mut CudaViewMut<'_, f32>,
    position: Position<'_, '_>,
) -> Result<()> {
    let t = b.tokens;
    let (heads, kv_width) = (c.n_head * c.head_dim, c.n_head_kv * c.head_dim);
    let mut qg = s.proj.slice_mut(..t * 2 * heads);
    let mut k = s.k.slice_mut(..t * kv_width);
    let mut v = s.v.slice_mut(..t * kv_width);
    let shape = AttentionShape {
        tokens: t,
        pos0: b.pos0,
        heads: c.n_head,
        kv_heads: c.n_head_kv,
        head_dim: c.head_dim,
        rope_dim: c.rope_dim,
        rope_base: c.rope_base,
        eps: c.rms_eps,
        capacity,
    };
    // Not behind the expert cache's copies for the next block on the side stream.
    let ahead = rows_ahead() && t <= ONE_TOKEN_KERNELS_MAX_TOKENS && !device.side_pending();
    if ahead {
        rows_to_l2(device, &shape, kv, position)?;
    }
    device.mark("attention projections");
    beside::products3(
        device,
        t,
        || Ok(matmul_quantized(device, &w.q.view(), (h, h_q8), &mut qg)?),
        || Ok(matmul_quantized(device, &w.k.view(), (h, h_q8), &mut k)?),
        || Ok(matmul_quantized(device, &w.v.view(), (h, h_q8), &mut v)?),
    )?;
    let mut q = s.q.slice_mut(..t * heads);
    let mut o = s.o.slice_mut(..t * heads);
    let mut partials = s.attn_partials.as_view_mut();
    device.mark("attention");
    let inputs = Inputs {
        qg: qg.as_view(),
        k: k.as_view(),
        v: v.as_view(),
        q_norm: w.q_norm.as_view(),
        k_norm: w.k_norm.as_view(),
    };
    match kv {
        LayerKv::F32 { k, v } => over_cache(
            device,
            &shape,
            &inputs,
            &mut q,
            (k, v),
            &mut partials,
            &mut o,
            position,
        )?,
        LayerKv::F16 { k, v } => over_cache(
            device,
            &shape,
            &inputs,
            &mut q,
            (k, v),
            &mut partials,
            &mut o,
            position,
        )?,
    }
    if ahead {
        // Long done (a few instructions of one CTA beside the projections); joined here, in
        // the mixer, because a capture ends only with every stream joined and a step whose
        // experts run on the CPU ends its capture before any MoE block on the GPU joins.
        device.join_side()?;
    }
    device.mark("attention projections");
    matmul(device, &w.out.view(), &o.as_view(), out)?;
    Ok(())
}

/// `REDLITE_KV_ROWS_AHEAD=1`: a decode batch's attention asks L2 for its layer's K and V rows
/// on the side stream before the projections ([`rows_to_l2`]). Off until measured.
fn rows_ahead() -> bool {
    static ON: OnceLock<bool> = OnceLock::new();
    *ON.get_or_init(|| std::env::var("REDLITE_KV_ROWS_AHEAD").as_deref() == Ok("1"))
}

/// Queues the layer's request of its cached K and V rows to L2 on the side stream, after the
/// normed input and beside the projections (a parallel branch in a captured step), so that
/// the rows come from DRAM while the latency-bound products run and the split kernels find
/// them in L2. Rows that would fill more than half of L2 are not asked for. The request
/// writes nothing.
fn rows_to_l2(
    device: &Device,
    shape: &AttentionShape,
    kv: &LayerKv,
    position: Position<'_, '_>,
) -> Result<()> {
    let budget = device.l2_bytes() / 2;
    device.on_side(|| -> Result<()> {
        match kv {
            LayerKv::F32 { k, v } => attention_rows_to_l2(
                device,
                shape,
                (&k.as_view(), &v.as_view()),
                position,
                budget,
            )?,
            LayerKv::F16 { k, v } => attention_rows_to_l2(
                device,
                shape,
                (&k.as_view(), &v.as_view()),
                position,
                budget,
            )?,
        }
        Ok(())
    })
}

struct Inputs<'a> {
    qg: CudaView<'a, f32>,
    k: CudaView<'a, f32>,
    v: CudaView<'a, f32>,
    q_norm: CudaView<'a, f32>,
    k_norm: CudaView<'a, f32>,
}

/// Norm + RoPE + cache write, then attention over the cache, for one KV element type.
#[allow(clippy::too_many_arguments)]
fn over_cache<T: KvElement>(
    device: &Device,
    shape: &AttentionShape,
    x: &Inputs<'_>,
    q: &mut CudaViewMut<'_, f32>,
    (k_cache, v_cache): (&mut CudaSlice<T>, &mut CudaSlice<T>),
    partials: &mut CudaViewMut<'_, f32>,
    o: &mut CudaViewMut<'_, f32>,
    position: Position<'_, '_>,
) -> Result<()> {
    attention_prep(
        device,
        shape,
        &x.qg,
        &x.k,
        &x.v,
        (&x.q_norm, &x.k_norm),
        q,
        &mut k_cache.as_view_mut(),
        &mut v_cache.as_view_mut(),
        position,
    )?;
    attention(
        device,
        shape,
        &q.as_view(),
        &x.qg,
        &k_cache.as_view(),
        &v_cache.as_view(),
        partials,
        o,
        position,
    )?;
    Ok(())
}
