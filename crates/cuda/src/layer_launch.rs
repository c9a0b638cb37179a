//! Launchers of the layer kernels: pick the specialization, size the grid and the dynamic
//! shared memory for a shape the op entry (`layer_ops`) already validated.

use crate::device::Device;
use crate::error::CudaError;
use crate::layer_ops::TokenWalk;
pub(crate) use crate::moe_launch::{moe_down, moe_folds, moe_gate_up, moe_route};
use crate::ops::Dots;
use crate::q8_input::Q8Views;
use crate::raw;
use crate::source::{
    self, delta_chunked_shared_bytes, WeightKind, ATTENTION_MAX_SPLITS, ATTENTION_MIN_CHUNK,
    ATTENTION_WARPS, CONV_TOKENS_THREADS, DELTA_CHUNK_COLS, DELTA_CHUNK_THREADS, DELTA_COLS,
    GEMM_THREADS, GEMM_TILES, LAYER_WARPS, MATMUL_SPLITK_WARPS, MATMUL_TILE_ROWS,
    MATMUL_TILE_TOKENS, MATMUL_V2_ROWS, MATMUL_V2_WARPS, ONE_TOKEN_KERNELS_MAX_TOKENS,
    SMALL_BATCH_MAX_TOKENS, WIDE_F16, WIDE_F32,
};
use cudarc::driver::{CudaView, CudaViewMut, DeviceRepr, LaunchConfig};
use redlite_gguf::GgmlType;
use std::sync::OnceLock;

/// Threads of the one-CTA-per-row kernels (embed, rms_norm, deltanet_prep, moe_route).
pub(crate) const ROW_THREADS: u32 = 256;
/// Threads per CTA of the flat element-wise kernels.
const FLAT_THREADS: u32 = 256;
/// x is staged in shared memory up to the default 48 KiB dynamic limit.
pub(crate) const SHARED_MAX_BYTES: usize = 48 * 1024;

pub(crate) fn to_i32(v: usize) -> i32 {
    i32::try_from(v).unwrap_or(i32::MAX)
}

fn to_u32(v: usize) -> u32 {
    u32::try_from(v).unwrap_or(u32::MAX)
}

pub(crate) fn config(grid: (usize, usize, usize), threads: u32, shared: usize) -> LaunchConfig {
    LaunchConfig {
        grid_dim: (to_u32(grid.0), to_u32(grid.1), to_u32(grid.2)),
        block_dim: (threads, 1, 1),
        shared_mem_bytes: to_u32(shared),
    }
}

/// `attention_combine_kernel`'s launch: a CTA per (token, head), a factor and a list entry
/// per split in shared memory.
pub(crate) fn combine_config(tokens: usize, heads: usize, splits: usize) -> LaunchConfig {
    config(
        (tokens, heads, 1),
        128,
        splits * (size_of::<f32>() + size_of::<i32>()),
    )
}

fn warps_grid(rows: usize) -> usize {
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

/// `q8`: x already quantized to Q8_K (scales, codes of every row), for the q8 kernels to
/// read instead of quantizing x in each CTA; the other kernels ignore it.
#[allow(clippy::too_many_arguments)]
pub(crate) fn matmul(
    device: &Device,
    kind: WeightKind,
    dots: Dots,
    weights: &CudaView<'_, u8>,
    x: &CudaView<'_, f32>,
    q8: Option<Q8Views<'_, '_>>,
    y: &mut CudaViewMut<'_, f32>,
    (rows, cols, tokens): (usize, usize, usize),
) -> Result<(), CudaError> {
    let x_aligned = device.address(x).is_multiple_of(16);
    let mut plan = plan_matmul(device, kind, dots, (rows, cols, tokens), x_aligned);
    let kernel = device.kernel(&plan.kernel)?;
    let q8 = match (plan.q8_input, q8) {
        (false, _) => raw::Q8Arg::Absent,
        (true, None) => raw::Q8Arg::Null,
        (true, Some((d, q))) => {
            // Nothing to stage: the kernel reads the codes where they are.
            plan.cfg.shared_mem_bytes = 0;
            raw::Q8Arg::Given(d, q)
        }
    };
    crate::profile::label(|| {
        format!(
            "matmul {}{} {rows}x{cols} t{tokens}",
            plan.version, kind.cuda_name
        )
    });
    if plan.tiled {
        let shape = (to_i32(rows), to_i32(cols), to_i32(tokens));
        return raw::launch_matmul_tiles(
            device.stream(),
            kernel,
            plan.cfg,
            weights,
            x,
            q8,
            y,
            shape,
        );
    }
    let shape = (to_i32(rows), to_i32(cols));
    raw::launch_matmul(device.stream(), kernel, plan.cfg, weights, x, q8, y, shape)
}

/// The matmul kernel for a shape, its launch configuration, its profile label prefix,
/// whether it takes the token count (the token-tiled kernel) and whether it takes a
/// quantized input (`gd, gq`: the q8 kernels).
struct MatmulPlan {
    kernel: String,
    cfg: LaunchConfig,
    version: &'static str,
    tiled: bool,
    q8_input: bool,
}

/// In order: the float-weight GEMM (F32/F16 prompts), token tiles (several tokens, q8; `REDLITE_PREFILL_TILES=0` turns them off), split-K (at most
/// `SPLITK_MAX_ROWS` rows), q8, version 1 (`REDLITE_MATVEC_V1=1`), version 2.
fn plan_matmul(
    device: &Device,
    kind: WeightKind,
    dots: Dots,
    (rows, cols, tokens): (usize, usize, usize),
    x_aligned: bool,
) -> MatmulPlan {
    let q8 = dots.quantizes(kind.ty) && !matvec_v1();
    let plan = |kernel, grid, warps: u32, shared, version| MatmulPlan {
        kernel,
        cfg: config(grid, warps * 32, shared),
        version,
        tiled: false,
        q8_input: false,
    };
    let block = match kind.ty {
        GgmlType::F32 if cols.is_multiple_of(WIDE_F32.1) => WIDE_F32.0,
        GgmlType::F16 if cols.is_multiple_of(WIDE_F16.1) => WIDE_F16.0,
        _ => kind.cuda_name,
    };
    let gemm = gemm_float(device, kind.ty, (rows, cols, tokens))
        .filter(|_| x_aligned && tokens > ONE_TOKEN_KERNELS_MAX_TOKENS);
    if let Some((kernel, tile)) = gemm {
        let grid = (rows.div_ceil(tile.0), tokens.div_ceil(tile.1), 1);
        return MatmulPlan {
            tiled: true,
            cfg: config(grid, GEMM_THREADS, 0),
            kernel,
            version: "gemm ",
            q8_input: false,
        };
    }
    let tile_shared = q8_shared_bytes(MATMUL_TILE_TOKENS * cols);
    let splitk = rows <= SPLITK_MAX_ROWS && split_k() && !matvec_v1();
    // A batch of decode size keeps the one-token kernel where that is split-K (the token
    // tiles sum a row in the q8 matvec's order, split-K in its own): each row the bits of
    // one token.
    let small_splitk = splitk && tokens <= ONE_TOKEN_KERNELS_MAX_TOKENS;
    // A small batch's other q8 products: all its tokens in each CTA, one row per warp (the
    // 8-token tiles, 2 rows a warp, took 2.8x a one-token product for 4 tokens on the H200).
    let small_shared = q8_shared_bytes(tokens * cols);
    if (2..=SMALL_BATCH_MAX_TOKENS).contains(&tokens)
        && q8
        && !small_splitk
        && small_matvec()
        && small_shared <= SHARED_MAX_BYTES
    {
        let grid = (rows.div_ceil(MATMUL_V2_WARPS as usize), 1, 1);
        let kernel = source::matmul_q8_small_kernel(kind, tokens);
        return MatmulPlan {
            tiled: true,
            q8_input: true,
            ..plan(kernel, grid, MATMUL_V2_WARPS, small_shared, "q8 small ")
        };
    }
    if tokens > 1 && q8 && prefill_tiles() && tile_shared <= SHARED_MAX_BYTES && !small_splitk {
        let per_cta = MATMUL_V2_WARPS as usize * MATMUL_TILE_ROWS;
        let grid = (
            rows.div_ceil(per_cta),
            tokens.div_ceil(MATMUL_TILE_TOKENS),
            1,
        );
        let kernel = source::matmul_q8_tiles_kernel(kind);
        return MatmulPlan {
            tiled: true,
            q8_input: true,
            ..plan(kernel, grid, MATMUL_V2_WARPS, tile_shared, "q8 tiles ")
        };
    }
    if splitk {
        let kernel = source::matmul_splitk_kernel(block, q8);
        let (shared, version) = if q8 {
            (q8_shared_bytes(cols), "splitk q8 ")
        } else {
            (0, "splitk ")
        };
        return MatmulPlan {
            q8_input: q8,
            ..plan(
                kernel,
                (rows, tokens, 1),
                MATMUL_SPLITK_WARPS,
                shared,
                version,
            )
        };
    }
    let per_warp = matmul_rows_per_warp(rows, device.multiprocessors() as usize);
    let grid = (
        rows.div_ceil(MATMUL_V2_WARPS as usize * per_warp),
        tokens,
        1,
    );
    if q8 {
        let kernel = source::matmul_q8_kernel(kind, per_warp);
        return MatmulPlan {
            q8_input: true,
            ..plan(kernel, grid, MATMUL_V2_WARPS, q8_shared_bytes(cols), "q8 ")
        };
    }
    let x_bytes = cols * size_of::<f32>();
    let x_shared = x_bytes <= SHARED_MAX_BYTES && (matvec_v1() || stage_x());
    let shared = if x_shared { x_bytes } else { 0 };
    if matvec_v1() {
        let kernel = source::matmul_kernel(kind, x_shared);
        return plan(
            kernel,
            (warps_grid(rows), tokens, 1),
            LAYER_WARPS,
            shared,
            "v1 ",
        );
    }
    let kernel = source::matmul_v2_kernel(block, per_warp, x_shared);
    plan(kernel, grid, MATMUL_V2_WARPS, shared, "")
}

/// The float-weight GEMM and its tile for a prompt of at least `GEMM_MIN_TOKENS` tokens with
/// at least `GEMM_MIN_ROWS` rows of F32 or F16 weights whose rows load as aligned groups of 4
/// (`REDLITE_PREFILL_GEMM=0`: the matvecs): 64-token tiles, or 32 where those would give
/// fewer CTAs than two per multiprocessor.
fn gemm_float(
    device: &Device,
    ty: GgmlType,
    (rows, cols, tokens): (usize, usize, usize),
) -> Option<(String, (usize, usize))> {
    static ON: OnceLock<bool> = OnceLock::new();
    let on = *ON.get_or_init(|| std::env::var("REDLITE_PREFILL_GEMM").as_deref() != Ok("0"));
    if !on || tokens < GEMM_MIN_TOKENS || rows < GEMM_MIN_ROWS || !cols.is_multiple_of(4) {
        return None;
    }
    let [wide, narrow] = GEMM_TILES;
    let ctas = rows.div_ceil(wide.0) * tokens.div_ceil(wide.1);
    let tile = if ctas < 2 * device.multiprocessors() as usize {
        narrow
    } else {
        wide
    };
    Some((source::gemm_float_kernel(ty, tile)?, tile))
}

/// Fewest tokens for the float-weight GEMM: a 64-token tile with fewer tokens wastes most
/// of its work, and the split-K matvec is already fast for a handful.
const GEMM_MIN_TOKENS: usize = 16;

/// Fewest rows: a matrix of a few rows (the shared-expert gate's one) runs on a handful of
/// CTAs as a GEMM (145 µs for 1 x 2048 at 512 tokens on the H200); the split-K matvec gives
/// it a CTA per (row, token).
const GEMM_MIN_ROWS: usize = 64;

/// Matrices of at most this many rows take the split-K matmul: version 2 would launch at
/// most 128 CTAs of 8 warps (fewer than the H200's 132 multiprocessors).
const SPLITK_MAX_ROWS: usize = 1024;

/// Batches of several tokens take the token-tiled q8 matmul (same sums per row as the
/// one-token kernel; pp512 +16 % on the H200); `REDLITE_PREFILL_TILES=0` turns it off.
fn prefill_tiles() -> bool {
    static ON: OnceLock<bool> = OnceLock::new();
    *ON.get_or_init(|| std::env::var("REDLITE_PREFILL_TILES").as_deref() != Ok("0"))
}

/// `REDLITE_MATMUL_SPLITK=0`: version 2 (or q8) for every shape.
fn split_k() -> bool {
    static ON: OnceLock<bool> = OnceLock::new();
    *ON.get_or_init(|| std::env::var("REDLITE_MATMUL_SPLITK").as_deref() != Ok("0"))
}

/// Dynamic shared memory of a q8 kernel staging `values` activation values: the f32 scale
/// of each 256 values (padded to 16 bytes), then the int8 codes (`q8_scales_bytes` in
/// `q8dot.cuh`).
pub(crate) fn q8_shared_bytes(values: usize) -> usize {
    (values / 256 * 4).next_multiple_of(16) + values
}

/// Whether the version-2 matmul stages x in shared memory (`REDLITE_MATMUL_XSHARED=0`: it
/// reads x through L1 instead).
fn stage_x() -> bool {
    static ON: OnceLock<bool> = OnceLock::new();
    *ON.get_or_init(|| std::env::var("REDLITE_MATMUL_XSHARED").as_deref() != Ok("0"))
}

/// `REDLITE_MATVEC_V1=1`: the version-1 matvecs (one row per warp, 4 warps per CTA).
pub(crate) fn matvec_v1() -> bool {
    static V1: OnceLock<bool> = OnceLock::new();
    *V1.get_or_init(|| std::env::var("REDLITE_MATVEC_V1").as_deref() == Ok("1"))
}

/// Rows per warp of the version-2 matmul: the most (of 1, 2, 4) that still gives every
/// multiprocessor two CTAs; `REDLITE_MATMUL_ROWS` (1, 2 or 4) forces one.
fn matmul_rows_per_warp(rows: usize, multiprocessors: usize) -> usize {
    static FORCED: OnceLock<Option<usize>> = OnceLock::new();
    let forced = *FORCED.get_or_init(|| {
        std::env::var("REDLITE_MATMUL_ROWS")
            .ok()
            .and_then(|v| v.parse().ok())
            .filter(|r| MATMUL_V2_ROWS.contains(r))
    });
    if let Some(r) = forced {
        return r;
    }
    let ctas = |per_warp: usize| rows / (MATMUL_V2_WARPS as usize * per_warp);
    MATMUL_V2_ROWS
        .iter()
        .rev()
        .copied()
        .find(|&r| ctas(r) >= 2 * multiprocessors)
        .unwrap_or(1)
}

pub(crate) struct DeltaDims {
    pub tokens: usize,
    pub k_heads: usize,
    pub v_heads: usize,
    pub head_dim: usize,
}

impl DeltaDims {
    fn channels(&self) -> usize {
        2 * self.k_heads * self.head_dim + self.v_heads * self.head_dim
    }
}

pub(crate) fn deltanet_split(
    device: &Device,
    d: &DeltaDims,
    p: &CudaView<'_, f32>,
    qkv: &mut CudaViewMut<'_, f32>,
    z: &mut CudaViewMut<'_, f32>,
) -> Result<(), CudaError> {
    let kernel = device.kernel("deltanet_split_kernel")?;
    let width = d.channels() + d.v_heads * d.head_dim;
    let cfg = config(
        (width.div_ceil(FLAT_THREADS as usize), d.tokens, 1),
        FLAT_THREADS,
        0,
    );
    let r = d.v_heads / d.k_heads;
    let dims = [d.k_heads, d.head_dim, r, d.head_dim].map(to_i32);
    raw::launch_deltanet_split(device.stream(), kernel, cfg, p, qkv, z, dims)
}

/// Sequential: one thread per channel. Chunked: one CTA per 32 channels, 32 token ranges.
pub(crate) fn deltanet_conv(
    device: &Device,
    d: &DeltaDims,
    walk: TokenWalk,
    width: usize,
    w: &CudaView<'_, f32>,
    state: &mut CudaViewMut<'_, f32>,
    qkv: &mut CudaViewMut<'_, f32>,
) -> Result<(), CudaError> {
    let channels = d.channels();
    let (kernel, cfg) = match walk {
        TokenWalk::Sequential => (
            device.kernel(&source::conv_kernel(width))?,
            config(
                (channels.div_ceil(FLAT_THREADS as usize), 1, 1),
                FLAT_THREADS,
                0,
            ),
        ),
        TokenWalk::Chunked => (
            device.kernel(&source::conv_tokens_kernel(width))?,
            config((channels.div_ceil(32), 1, 1), CONV_TOKENS_THREADS, 0),
        ),
    };
    let dims = (to_i32(channels), to_i32(d.tokens));
    raw::launch_conv(device.stream(), kernel, cfg, qkv, state, w, dims)
}

#[allow(clippy::too_many_arguments)]
pub(crate) fn deltanet_prep(
    device: &Device,
    d: &DeltaDims,
    eps: f32,
    qkv: &mut CudaViewMut<'_, f32>,
    ba: &CudaView<'_, f32>,
    a: &CudaView<'_, f32>,
    dt_bias: &CudaView<'_, f32>,
    beta: &mut CudaViewMut<'_, f32>,
    g: &mut CudaViewMut<'_, f32>,
) -> Result<(), CudaError> {
    let kernel = device.kernel("deltanet_prep_kernel")?;
    let cfg = config((d.tokens, 1, 1), ROW_THREADS, 0);
    let dims = [d.channels(), d.k_heads, d.v_heads, d.head_dim].map(to_i32);
    let q_scale = 1.0 / (d.head_dim as f32).sqrt();
    raw::launch_deltanet_prep(
        device.stream(),
        kernel,
        cfg,
        qkv,
        ba,
        a,
        dt_bias,
        beta,
        g,
        dims,
        (eps, q_scale),
    )
}

/// Both forms: grid (v_heads, dv / 32), 32 value columns per CTA; sequential with a thread
/// per column, chunked with 256 threads and its shared memory (above the default limit).
pub(crate) fn delta_rule(
    device: &Device,
    d: &DeltaDims,
    walk: TokenWalk,
    (qkv, beta, g): (&CudaView<'_, f32>, &CudaView<'_, f32>, &CudaView<'_, f32>),
    state: &mut CudaViewMut<'_, f32>,
    out: &mut CudaViewMut<'_, f32>,
) -> Result<(), CudaError> {
    // The chunked form needs ~124 KiB of shared memory at head dim 128: GPUs that cannot
    // give a CTA that much (sm_86 / sm_89: ~99 KiB) walk the tokens one by one.
    let walk = match walk {
        TokenWalk::Chunked
            if delta_chunked_shared_bytes(d.head_dim) > device.shared_per_block_optin() =>
        {
            TokenWalk::Sequential
        }
        walk => walk,
    };
    let (kernel, cfg) = match walk {
        TokenWalk::Sequential => (
            device.kernel(&source::delta_rule_kernel(d.head_dim))?,
            config(
                (d.v_heads, d.head_dim / DELTA_COLS as usize, 1),
                DELTA_COLS,
                0,
            ),
        ),
        TokenWalk::Chunked => (
            device.kernel(&source::delta_chunked_kernel(d.head_dim))?,
            config(
                (d.v_heads, d.head_dim / DELTA_CHUNK_COLS, 1),
                DELTA_CHUNK_THREADS,
                delta_chunked_shared_bytes(d.head_dim),
            ),
        ),
    };
    let dims = [d.tokens, d.k_heads, d.v_heads, d.head_dim].map(to_i32);
    raw::launch_delta_rule(device.stream(), kernel, cfg, qkv, beta, g, state, out, dims)
}

#[allow(clippy::too_many_arguments)]
pub(crate) fn deltanet_step(
    device: &Device,
    d: &DeltaDims,
    width: usize,
    eps: f32,
    inputs: [&CudaView<'_, f32>; 7],
    (conv_state, recurrent, out): (
        &mut CudaViewMut<'_, f32>,
        &mut CudaViewMut<'_, f32>,
        &mut CudaViewMut<'_, f32>,
    ),
    record: Option<(&mut CudaViewMut<'_, f32>, &mut CudaViewMut<'_, f32>)>,
    out_q8: Option<(&mut CudaViewMut<'_, f32>, &mut CudaViewMut<'_, i8>)>,
) -> Result<(), CudaError> {
    let kernel = device.kernel(&source::deltanet_step_kernel(d.head_dim, width))?;
    let threads = d.v_heads / d.k_heads * d.head_dim;
    let cfg = config((d.k_heads, 1, 1), to_u32(threads), 0);
    let dims = [d.tokens, d.k_heads, d.v_heads].map(to_i32);
    let q_scale = 1.0 / (d.head_dim as f32).sqrt();
    raw::launch_deltanet_step(
        device.stream(),
        kernel,
        cfg,
        inputs,
        (conv_state, recurrent, out),
        record,
        out_q8,
        dims,
        (eps, q_scale),
    )
}

pub(crate) fn gated_norm(
    device: &Device,
    d: &DeltaDims,
    eps: f32,
    o: &mut CudaViewMut<'_, f32>,
    z: &CudaView<'_, f32>,
    w: &CudaView<'_, f32>,
) -> Result<(), CudaError> {
    let kernel = device.kernel(&source::gated_norm_kernel())?;
    let rows = d.tokens * d.v_heads;
    let cfg = config((warps_grid(rows), 1, 1), LAYER_WARPS * 32, 0);
    let dims = (to_i32(rows), to_i32(d.head_dim));
    raw::launch_gated_norm(device.stream(), kernel, cfg, o, z, w, dims, eps)
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

/// Small batches' q8 products with all their tokens in each CTA, unless
/// `REDLITE_SMALL_BATCH_MATVEC=0` (the 8-token tiles then; the same bits either way).
fn small_matvec() -> bool {
    static ON: OnceLock<bool> = OnceLock::new();
    *ON.get_or_init(|| std::env::var("REDLITE_SMALL_BATCH_MATVEC").as_deref() != Ok("0"))
}

fn split_enabled() -> bool {
    static ENABLED: OnceLock<bool> = OnceLock::new();
    *ENABLED.get_or_init(|| std::env::var("REDLITE_ATTN_SPLIT").as_deref() != Ok("0"))
}

/// Splits of the KV length for `d` (1: the single-pass kernel): one per
/// `ATTENTION_MIN_CHUNK` positions, at most `ATTENTION_MAX_SPLITS`, and as many as
/// `partials_len` floats hold. `REDLITE_ATTN_SPLIT=0` forces the single-pass kernel.
fn attention_splits(d: &AttnDims, partials_len: usize) -> usize {
    if !split_enabled() {
        return 1;
    }
    let per_split = d.tokens * d.heads * (d.head_dim + 2);
    (d.pos0 + d.tokens)
        .div_ceil(ATTENTION_MIN_CHUNK)
        .min(ATTENTION_MAX_SPLITS)
        .min(partials_len / per_split.max(1))
        .max(1)
}

/// Splits launched when the position is read from device memory (a graph replayed at any
/// position): every split the partials hold, the kernel leaving the unneeded ones empty.
fn device_pos_splits(d: &AttnDims, partials_len: usize) -> usize {
    if !split_enabled() {
        return 1;
    }
    let per_split = d.tokens * d.heads * (d.head_dim + 2);
    ATTENTION_MAX_SPLITS.min(partials_len / per_split.max(1))
}

#[allow(clippy::too_many_arguments)]
pub(crate) fn attention<T: DeviceRepr>(
    device: &Device,
    kv_type: &str,
    d: &AttnDims,
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
        let split = device.kernel(&source::attention_split_kernel(kv_type, d.head_dim))?;
        let cfg = config((d.tokens, d.heads, splits), ATTENTION_WARPS * 32, 0);
        let dims = [d.pos0, d.heads, d.kv_heads, chunk, ATTENTION_MIN_CHUNK].map(to_i32);
        raw::launch_attention_split(
            device.stream(),
            split,
            cfg,
            (q, k_cache, v_cache),
            partials,
            pos,
            dims,
            scale,
        )?;
        let combine = device.kernel(source::ATTENTION_COMBINE_KERNEL)?;
        let cfg = combine_config(d.tokens, d.heads, splits);
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
