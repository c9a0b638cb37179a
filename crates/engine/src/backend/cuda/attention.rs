//! One gated full-attention mixer on the GPU (spec §3.3), mirroring `cpu::attention`:
//! q (with its per-head gate), k, v projections; q/k RMSNorm + partial NEOX RoPE + KV write;
//! causal attention over the cache with the sigmoid gate; output projection.

use redlite_cuda::{
    attention, attention_prep, matmul, matmul_quantized, AttentionShape, CudaSlice, CudaView,
    CudaViewMut, Device, KvElement, Position, Q8Rows,
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
    device.mark("attention projections");
    beside::products3(
        device,
        t,
        || Ok(matmul_quantized(device, &w.q.view(), (h, h_q8), &mut qg)?),
        || Ok(matmul_quantized(device, &w.k.view(), (h, h_q8), &mut k)?),
        || Ok(matmul_quantized(device, &w.v.view(), (h, h_q8), &mut v)?),
    )?;
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
    device.mark("attention projections");
    matmul(device, &w.out.view(), &o.as_view(), out)?;
    Ok(())
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
