//! Launchers of the layer kernels: pick the specialization, size the grid and the dynamic
//! shared memory for a shape the op entry (`layer_ops`) already validated.

use crate::attention_ops::attention_max_splits;
pub(crate) use crate::deltanet_launch::{
    delta_rule, deltanet_conv, deltanet_prep, deltanet_split, deltanet_step, gated_norm, DeltaDims,
};
use crate::device::Device;
use crate::error::CudaError;
pub(crate) use crate::matmul_launch::{matmul, matvec_v1, q8_shared_bytes};
pub(crate) use crate::moe_launch::{moe_down, moe_folds, moe_gate_up, moe_route, CachedCopies};
use crate::raw;
use crate::source::{
    self, WeightKind, ATTENTION_HEADS_PER_CTA, ATTENTION_MIN_CHUNK, ATTENTION_WARPS, LAYER_WARPS,
    SMALL_BATCH_MAX_TOKENS,
};
use crate::switch::Switch;
use cudarc::driver::{CudaView, CudaViewMut, DeviceRepr, LaunchConfig};
use std::sync::OnceLock;

/// Threads of the one-CTA-per-row kernels (embed, rms_norm, deltanet_prep, moe_route).
pub(crate) const ROW_THREADS: u32 = 256;
/// Threads per CTA of the flat element-wise kernels.
pub(crate) const FLAT_THREADS: u32 = 256;
/// x is staged in shared memory up to the default 48 KiB dynamic limit.
pub(crate) const SHARED_MAX_BYTES: usize = 48 * 1024;

pub(crate) fn to_i32(v: usize) -> i32 {
    i32::try_from(v).unwrap_or(i32::MAX)
}

pub(crate) fn to_u32(v: usize) -> u32 {
    u32::try_from(v).unwrap_or(u32::MAX)
}

pub(crate) fn config(grid: (usize, usize, usize), threads: u32, shared: usize) -> LaunchConfig {
    LaunchConfig {
        grid_dim: (to_u32(grid.0), to_u32(grid.1), to_u32(grid.2)),
        block_dim: (threads, 1, 1),
        shared_mem_bytes: to_u32(shared),
    }
}

/// `attention_combine_kernel`'s launch: a CTA per (token, head, slice of
/// `COMBINE_THREADS` columns of the head), a factor, a sum and a list entry per split in
/// shared memory.
pub(crate) fn combine_config(
    tokens: usize,
    heads: usize,
    splits: usize,
    hd: usize,
) -> LaunchConfig {
    config(
        (tokens, heads, hd.div_ceil(COMBINE_THREADS as usize)),
        COMBINE_THREADS,
        splits * (2 * size_of::<f32>() + size_of::<i32>()),
    )
}

/// `REDLITE_COMBINE_AHEAD=0`: the attention's merge of its splits by
/// `attention_combine_kernel`, which loads each split's values after building the list of
/// live splits, instead of `attention_combine_ahead_kernel`, which loads them beside the splits'
/// maxima (the same bits either way; `attention_combine.cu`).
pub static COMBINE_AHEAD: Switch = Switch::new("REDLITE_COMBINE_AHEAD", true);

/// The merge of the attention's splits that `COMBINE_AHEAD` picks.
pub(crate) fn combine_kernel() -> &'static str {
    if COMBINE_AHEAD.on() {
        source::ATTENTION_COMBINE_AHEAD_KERNEL
    } else {
        source::ATTENTION_COMBINE_KERNEL
    }
}

/// Columns (threads) of a combine CTA: 4 CTAs for a head of 256 (at depth 4096, 16 CTAs of
/// 128 threads took 12.5 µs a launch, one L2 round trip per live split).
const COMBINE_THREADS: u32 = 64;

pub(crate) fn warps_grid(rows: usize) -> usize {
    rows.div_ceil(LAYER_WARPS as usize)
}

pub(crate) fn embed(
    device: &Device,
    kind: WeightKind,
    table: &CudaView<'_, u8>,
    tokens: &CudaView<'_, u32>,
    x: &mut CudaViewMut<'_, f32>,
    (rows, cols): (usize, usize),
) -> Result<(), CudaError> {
    let kernel = device.kernel(&source::embed_kernel(kind))?;
    let cfg = config((tokens.len(), 1, 1), ROW_THREADS, 0);
    let shape = (to_i32(rows), to_i32(cols));
    raw::launch_embed(device.stream(), kernel, cfg, table, tokens, x, shape)
}

pub(crate) fn rms_norm(
    device: &Device,
    x: &CudaView<'_, f32>,
    w: &CudaView<'_, f32>,
    out: &mut CudaViewMut<'_, f32>,
    eps: f32,
) -> Result<(), CudaError> {
    let kernel = device.kernel("rms_norm_kernel")?;
    let cfg = config((x.len() / w.len(), 1, 1), ROW_THREADS, 0);
    raw::launch_rms_norm(
        device.stream(),
        kernel,
        cfg,
        x,
        w,
        out,
        to_i32(w.len()),
        eps,
    )
}

pub(crate) fn mtp_concat_norms(
    device: &Device,
    rows: (&CudaView<'_, f32>, &CudaView<'_, f32>),
    norms: (&CudaView<'_, f32>, &CudaView<'_, f32>),
    concat: &mut CudaViewMut<'_, f32>,
    eps: f32,
) -> Result<(), CudaError> {
    let kernel = device.kernel("mtp_concat_norms_kernel")?;
    let cols = norms.0.len();
    let n = rows.0.len() / cols;
    let cfg = config((2 * n, 1, 1), ROW_THREADS, 0);
    let shape = (to_i32(n), to_i32(cols));
    raw::launch_mtp_concat_norms(
        device.stream(),
        kernel,
        cfg,
        rows,
        norms,
        concat,
        shape,
        eps,
    )
}

pub(crate) fn add_rms_norm(
    device: &Device,
    x: &mut CudaViewMut<'_, f32>,
    y: &CudaView<'_, f32>,
    w: &CudaView<'_, f32>,
    out: &mut CudaViewMut<'_, f32>,
    eps: f32,
) -> Result<(), CudaError> {
    let kernel = device.kernel("add_rms_norm_kernel")?;
    let cfg = config((x.len() / w.len(), 1, 1), ROW_THREADS, 0);
    let cols = to_i32(w.len());
    raw::launch_add_rms_norm(device.stream(), kernel, cfg, x, y, w, out, cols, eps)
}

pub(crate) fn add(
    device: &Device,
    x: &mut CudaViewMut<'_, f32>,
    y: &CudaView<'_, f32>,
) -> Result<(), CudaError> {
    let kernel = device.kernel("add_kernel")?;
    let n = x.len();
    let cfg = config((n.div_ceil(FLAT_THREADS as usize), 1, 1), FLAT_THREADS, 0);
    raw::launch_add(device.stream(), kernel, cfg, x, y, to_i32(n))
}

pub(crate) struct AttnDims {
    pub tokens: usize,
    pub pos0: usize,
    pub heads: usize,
    pub kv_heads: usize,
    pub head_dim: usize,
    pub rope_dim: usize,
    pub rope_base: f32,
    pub eps: f32,
}

#[allow(clippy::too_many_arguments)]
pub(crate) fn attention_prep<T: DeviceRepr>(
    device: &Device,
    kv_type: &str,
    d: &AttnDims,
    inputs: [&CudaView<'_, f32>; 5],
    q: &mut CudaViewMut<'_, f32>,
    k_cache: &mut CudaViewMut<'_, T>,
    v_cache: &mut CudaViewMut<'_, T>,
    pos: Option<&CudaView<'_, u32>>,
) -> Result<(), CudaError> {
    let kernel = device.kernel(&source::attn_prep_kernel(kv_type))?;
    let cfg = config(
        (d.tokens, d.heads + d.kv_heads, 1),
        32,
        d.head_dim * size_of::<f32>(),
    );
    let dims = [d.pos0, d.heads, d.kv_heads, d.head_dim, d.rope_dim].map(to_i32);
    let rope = raw::RopeArgs {
        rope_base: d.rope_base,
        eps: d.eps,
    };
    raw::launch_attn_prep(
        device.stream(),
        kernel,
        cfg,
        inputs,
        q,
        k_cache,
        v_cache,
        pos,
        dims,
        rope,
    )
}

fn split_enabled() -> bool {
    static ENABLED: OnceLock<bool> = OnceLock::new();
    *ENABLED.get_or_init(|| std::env::var("REDLITE_ATTN_SPLIT").as_deref() != Ok("0"))
}

/// Splits of the KV length for `d` (1: the single-pass kernel): one per
/// `ATTENTION_MIN_CHUNK` positions, at most `attention_max_splits()`, and as many as
/// `partials_len` floats hold. `REDLITE_ATTN_SPLIT=0` forces the single-pass kernel.
fn attention_splits(d: &AttnDims, partials_len: usize) -> usize {
    if !split_enabled() {
        return 1;
    }
    let per_split = d.tokens * d.heads * (d.head_dim + 2);
    (d.pos0 + d.tokens)
        .div_ceil(ATTENTION_MIN_CHUNK)
        .min(attention_max_splits())
        .min(partials_len / per_split.max(1))
        .max(1)
}

/// Query heads per CTA of the split kernel: the most of `ATTENTION_HEADS_PER_CTA` up to N
/// (`REDLITE_ATTN_HEADS_PER_CTA=N`, default 4; 1 for the one-head kernel) that divides the
/// query heads of one KV head, each CTA then reading its split's K and V rows once for them
/// all but running their softmax chains one after the other. H200 with PDL (fourteenth
/// session): 4 heads tg128 350.4 / 333.5 at depths 0 / 4096 against 350.4 / 320.6 with one,
/// 2 heads 347.6 / 330.5, 8 heads 340.0 / 324.2; the same partials whatever the number.
fn attention_heads_per_cta(d: &AttnDims) -> usize {
    static MOST: OnceLock<usize> = OnceLock::new();
    let most = *MOST.get_or_init(|| {
        std::env::var("REDLITE_ATTN_HEADS_PER_CTA")
            .ok()
            .and_then(|v| v.parse().ok())
            .unwrap_or(4)
    });
    let group = d.heads / d.kv_heads.max(1);
    ATTENTION_HEADS_PER_CTA
        .iter()
        .copied()
        .filter(|&hpc| hpc <= most && group.is_multiple_of(hpc))
        .max()
        .unwrap_or(1)
}

/// The attention split kernel of a launch (flash decoding, step 1 of 2).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum SplitKernel {
    /// As the environment chooses ([`chosen_split`]).
    Chosen,
    /// This many query heads a CTA (1: `attention_split_kernel`).
    Heads(usize),
    /// Four or eight heads a CTA by each token's length (`attention_split_depth_kernel`).
    Depth(usize),
}

/// The split kernel the environment asks for `d`: the split by depth
/// (`REDLITE_ATTN_LONG_FROM`), else the grouped kernel of `attention_heads_per_cta` heads.
/// (A GQA kernel, all 8 query heads of a KV head in one CTA at four lanes a position, was
/// +0.4 / −0.8 / +0.7 % at depths 0 / 4096 / 32768 on an H100, twentieth session: removed.)
fn chosen_split(d: &AttnDims) -> SplitKernel {
    match long_from(d) {
        Some(from) => SplitKernel::Depth(from),
        None => SplitKernel::Heads(attention_heads_per_cta(d)),
    }
}

/// `REDLITE_ATTN_LONG_FROM=N` (N > 0): the split kernel that takes, token by token, four query
/// heads and four warps a CTA below length N and eight and eight from N on
/// (`attention_split_depth_kernel`), where the shape has eight query heads to a KV head; off
/// by default until measured (H200, eighteenth session: 8 and 8 were +5.9 % at depth 32768 and
/// -2.4 % at 4096 against 4 and 4).
fn long_from(d: &AttnDims) -> Option<usize> {
    static FROM: OnceLock<Option<usize>> = OnceLock::new();
    let from = *FROM.get_or_init(|| {
        std::env::var("REDLITE_ATTN_LONG_FROM")
            .ok()
            .and_then(|v| v.parse().ok())
            .filter(|&n: &usize| n > 0)
    });
    let group = d.heads / d.kv_heads.max(1);
    from.filter(|_| d.kv_heads > 0 && group.is_multiple_of(8) && d.heads.is_multiple_of(8))
}

/// Warps per CTA of the grouped split kernel: `REDLITE_ATTN_SPLIT_WARPS` (one of
/// `ATTENTION_SPLIT_WARPS`), default `ATTENTION_WARPS`. An A/B: more warps walk a split's
/// positions in shorter chains (the split CTAs hold ~8 warps a multiprocessor at depth 4096),
/// but the positions each warp sums and the merge of the warps change, so the bits do too.
fn attention_split_warps() -> u32 {
    static WARPS: OnceLock<u32> = OnceLock::new();
    *WARPS.get_or_init(|| {
        std::env::var("REDLITE_ATTN_SPLIT_WARPS")
            .ok()
            .and_then(|v| v.parse().ok())
            .filter(|w| source::ATTENTION_SPLIT_WARPS.contains(w))
            .unwrap_or(ATTENTION_WARPS)
    })
}

/// Splits launched when the position is read from device memory (a graph replayed at any
/// position): every split the partials hold, the kernel leaving the unneeded ones empty.
fn device_pos_splits(d: &AttnDims, partials_len: usize) -> usize {
    if !split_enabled() {
        return 1;
    }
    let per_split = d.tokens * d.heads * (d.head_dim + 2);
    attention_max_splits().min(partials_len / per_split.max(1))
}

#[allow(clippy::too_many_arguments)]
pub(crate) fn attention<T: DeviceRepr>(
    device: &Device,
    kv_type: &str,
    d: &AttnDims,
    split: SplitKernel,
    q: &CudaView<'_, f32>,
    qg: &CudaView<'_, f32>,
    k_cache: &CudaView<'_, T>,
    v_cache: &CudaView<'_, T>,
    partials: &mut CudaViewMut<'_, f32>,
    o: &mut CudaViewMut<'_, f32>,
    pos: Option<&CudaView<'_, u32>>,
) -> Result<(), CudaError> {
    let scale = 1.0 / (d.head_dim as f32).sqrt();
    // A small batch launches what the decode graph launches (every split, the kernel deriving
    // each token's chunk from its own length), also with the position from the host: an
    // eager step then sums in the graph's order, so the graph and eager launches (serve mixes
    // both) give bit-identical logits, and each row of a small batch the bits of a one-token
    // step at its position (an MTP verification's rows equal plain decoding's).
    let (splits, chunk) = match pos {
        Some(_) => (device_pos_splits(d, partials.len()), 0),
        None if d.tokens <= SMALL_BATCH_MAX_TOKENS => (device_pos_splits(d, partials.len()), 0),
        None => {
            let splits = attention_splits(d, partials.len());
            (splits, (d.pos0 + d.tokens).div_ceil(splits))
        }
    };
    if splits > 1 {
        let split = match split {
            SplitKernel::Chosen => chosen_split(d),
            split => split,
        };
        // The kernel, its grid's y (CTAs of a token and split), warps and depth argument.
        let (kernel, ctas_y, warps, long_len) = match split {
            SplitKernel::Depth(from) => {
                let name = source::attention_split_depth_kernel(kv_type, d.head_dim);
                (device.kernel(&name)?, d.heads / 4, 8, Some(from))
            }
            SplitKernel::Heads(1) | SplitKernel::Chosen => {
                let name = source::attention_split_kernel(kv_type, d.head_dim);
                (device.kernel(&name)?, d.heads, ATTENTION_WARPS, None)
            }
            SplitKernel::Heads(hpc) => {
                let warps = attention_split_warps();
                let name = source::attention_split_heads_kernel(kv_type, d.head_dim, hpc, warps);
                (device.kernel(&name)?, d.heads / hpc, warps, None)
            }
        };
        let cfg = config((d.tokens, ctas_y, splits), warps * 32, 0);
        let dims = [d.pos0, d.heads, d.kv_heads, chunk, ATTENTION_MIN_CHUNK].map(to_i32);
        raw::launch_attention_split(
            device.stream(),
            kernel,
            cfg,
            (q, k_cache, v_cache),
            partials,
            pos,
            dims,
            scale,
            long_len.map(to_i32),
        )?;
        let combine = device.kernel(combine_kernel())?;
        let cfg = combine_config(d.tokens, d.heads, splits, d.head_dim);
        let dims = [d.heads, d.head_dim, splits].map(to_i32);
        return raw::launch_attention_combine(
            device.stream(),
            combine,
            cfg,
            &partials.as_view(),
            qg,
            o,
            dims,
        );
    }
    let kernel = device.kernel(&source::attention_kernel(kv_type, d.head_dim))?;
    let cfg = config((d.tokens, d.heads, 1), ATTENTION_WARPS * 32, 0);
    let dims = [d.pos0, d.heads, d.kv_heads].map(to_i32);
    raw::launch_attention(
        device.stream(),
        kernel,
        cfg,
        q,
        qg,
        k_cache,
        v_cache,
        o,
        pos,
        dims,
        scale,
    )
}
