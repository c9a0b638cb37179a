//! Launchers of the layer kernels: pick the specialization, size the grid and the dynamic
//! shared memory for a shape the op entry (`layer_ops`) already validated.

use crate::device::Device;
use crate::error::CudaError;
use crate::ops::Dots;
use crate::raw;
use crate::source::{
    self, WeightKind, ATTENTION_MAX_SPLITS, ATTENTION_MIN_CHUNK, ATTENTION_WARPS, DELTA_COLS,
    LAYER_WARPS, MATMUL_SPLITK_WARPS, MATMUL_TILE_ROWS, MATMUL_TILE_TOKENS, MATMUL_V2_ROWS,
    MATMUL_V2_WARPS, MOE_LANES, MOE_V3_WARPS, WIDE_F16, WIDE_F32,
};
use cudarc::driver::{CudaView, CudaViewMut, DeviceRepr, LaunchConfig};
use redlite_gguf::GgmlType;
use std::sync::OnceLock;

/// Threads of the one-CTA-per-row kernels (embed, rms_norm, deltanet_prep, moe_route).
const ROW_THREADS: u32 = 256;
/// Threads per CTA of the flat element-wise kernels.
const FLAT_THREADS: u32 = 256;
/// x is staged in shared memory up to the default 48 KiB dynamic limit.
pub(crate) const SHARED_MAX_BYTES: usize = 48 * 1024;

fn to_i32(v: usize) -> i32 {
    i32::try_from(v).unwrap_or(i32::MAX)
}

fn to_u32(v: usize) -> u32 {
    u32::try_from(v).unwrap_or(u32::MAX)
}

fn config(grid: (usize, usize, usize), threads: u32, shared: usize) -> LaunchConfig {
    LaunchConfig {
        grid_dim: (to_u32(grid.0), to_u32(grid.1), to_u32(grid.2)),
        block_dim: (threads, 1, 1),
        shared_mem_bytes: to_u32(shared),
    }
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

#[allow(clippy::too_many_arguments)]
pub(crate) fn matmul(
    device: &Device,
    kind: WeightKind,
    dots: Dots,
    weights: &CudaView<'_, u8>,
    x: &CudaView<'_, f32>,
    y: &mut CudaViewMut<'_, f32>,
    (rows, cols, tokens): (usize, usize, usize),
) -> Result<(), CudaError> {
    let plan = plan_matmul(device, kind, dots, (rows, cols, tokens));
    let kernel = device.kernel(&plan.kernel)?;
    crate::profile::label(|| {
        format!(
            "matmul {}{} {rows}x{cols} t{tokens}",
            plan.version, kind.cuda_name
        )
    });
    if plan.tiled {
        let shape = (to_i32(rows), to_i32(cols), to_i32(tokens));
        return raw::launch_matmul_tiles(device.stream(), kernel, plan.cfg, weights, x, y, shape);
    }
    let shape = (to_i32(rows), to_i32(cols));
    raw::launch_matmul(device.stream(), kernel, plan.cfg, weights, x, y, shape)
}

/// The matmul kernel for a shape, its launch configuration, its profile label prefix and
/// whether it takes the token count (the token-tiled kernel).
struct MatmulPlan {
    kernel: String,
    cfg: LaunchConfig,
    version: &'static str,
    tiled: bool,
}

/// In order: token tiles (several tokens, q8, `REDLITE_PREFILL_TILES=1`), split-K (at most
/// `SPLITK_MAX_ROWS` rows), q8, version 1 (`REDLITE_MATVEC_V1=1`), version 2.
fn plan_matmul(
    device: &Device,
    kind: WeightKind,
    dots: Dots,
    (rows, cols, tokens): (usize, usize, usize),
) -> MatmulPlan {
    let q8 = dots.quantizes(kind.ty) && !matvec_v1();
    let plan = |kernel, grid, warps: u32, shared, version| MatmulPlan {
        kernel,
        cfg: config(grid, warps * 32, shared),
        version,
        tiled: false,
    };
    let block = match kind.ty {
        GgmlType::F32 if cols.is_multiple_of(WIDE_F32.1) => WIDE_F32.0,
        GgmlType::F16 if cols.is_multiple_of(WIDE_F16.1) => WIDE_F16.0,
        _ => kind.cuda_name,
    };
    let tile_shared = q8_shared_bytes(MATMUL_TILE_TOKENS * cols);
    if tokens > 1 && q8 && prefill_tiles() && tile_shared <= SHARED_MAX_BYTES {
        let per_cta = MATMUL_V2_WARPS as usize * MATMUL_TILE_ROWS;
        let grid = (
            rows.div_ceil(per_cta),
            tokens.div_ceil(MATMUL_TILE_TOKENS),
            1,
        );
        let kernel = source::matmul_q8_tiles_kernel(kind);
        return MatmulPlan {
            tiled: true,
            ..plan(kernel, grid, MATMUL_V2_WARPS, tile_shared, "q8 tiles ")
        };
    }
    if rows <= SPLITK_MAX_ROWS && split_k() && !matvec_v1() {
        let kernel = source::matmul_splitk_kernel(block, q8);
        let (shared, version) = if q8 {
            (q8_shared_bytes(cols), "splitk q8 ")
        } else {
            (0, "splitk ")
        };
        return plan(
            kernel,
            (rows, tokens, 1),
            MATMUL_SPLITK_WARPS,
            shared,
            version,
        );
    }
    let per_warp = matmul_rows_per_warp(rows, device.multiprocessors() as usize);
    let grid = (
        rows.div_ceil(MATMUL_V2_WARPS as usize * per_warp),
        tokens,
        1,
    );
    if q8 {
        let kernel = source::matmul_q8_kernel(kind, per_warp);
        return plan(kernel, grid, MATMUL_V2_WARPS, q8_shared_bytes(cols), "q8 ");
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

/// Matrices of at most this many rows take the split-K matmul: version 2 would launch at
/// most 128 CTAs of 8 warps (fewer than the H200's 132 multiprocessors).
const SPLITK_MAX_ROWS: usize = 1024;

/// `REDLITE_PREFILL_TILES=1`: batches of several tokens take the token-tiled q8 matmul
/// (off until measured on a GPU).
fn prefill_tiles() -> bool {
    static ON: OnceLock<bool> = OnceLock::new();
    *ON.get_or_init(|| std::env::var("REDLITE_PREFILL_TILES").as_deref() == Ok("1"))
}

/// `REDLITE_MATMUL_SPLITK=0`: version 2 (or q8) for every shape.
fn split_k() -> bool {
    static ON: OnceLock<bool> = OnceLock::new();
    *ON.get_or_init(|| std::env::var("REDLITE_MATMUL_SPLITK").as_deref() != Ok("0"))
}

/// Dynamic shared memory of a q8 kernel staging `values` activation values: the f32 scale
/// of each 256 values (padded to 16 bytes), then the int8 codes (`q8_scales_bytes` in
/// `q8dot.cuh`).
fn q8_shared_bytes(values: usize) -> usize {
    (values / 256 * 4).next_multiple_of(16) + values
}

/// Whether the version-2 matmul stages x in shared memory (`REDLITE_MATMUL_XSHARED=0`: it
/// reads x through L1 instead).
fn stage_x() -> bool {
    static ON: OnceLock<bool> = OnceLock::new();
    *ON.get_or_init(|| std::env::var("REDLITE_MATMUL_XSHARED").as_deref() != Ok("0"))
}

/// `REDLITE_MATVEC_V1=1`: the version-1 matvecs (one row per warp, 4 warps per CTA).
fn matvec_v1() -> bool {
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

#[allow(clippy::too_many_arguments)]
pub(crate) fn moe_route(
    device: &Device,
    logits: &CudaView<'_, f32>,
    shared_logit: &CudaView<'_, f32>,
    ids: &mut CudaViewMut<'_, i32>,
    weights: &mut CudaViewMut<'_, f32>,
    shared_weight: &mut CudaViewMut<'_, f32>,
    (tokens, n_expert, used): (usize, usize, usize),
) -> Result<(), CudaError> {
    static V1: OnceLock<bool> = OnceLock::new();
    let v1 = *V1.get_or_init(|| std::env::var("REDLITE_ROUTE_V1").as_deref() == Ok("1"));
    let cfg = if v1 || n_expert > 32 * source::ROUTE_V2_PER_LANE {
        (
            device.kernel("moe_route_kernel")?,
            ROW_THREADS,
            n_expert * size_of::<f32>(),
        )
    } else {
        (device.kernel(&source::route_v2_kernel())?, 32, 0)
    };
    let (kernel, cfg) = (cfg.0, config((tokens, 1, 1), cfg.1, cfg.2));
    let dims = (to_i32(n_expert), to_i32(used));
    raw::launch_moe_route(
        device.stream(),
        kernel,
        cfg,
        logits,
        shared_logit,
        ids,
        weights,
        shared_weight,
        dims,
    )
}

/// Sizes of one MoE launch: (tokens, experts selected per token, experts in the stack).
pub(crate) type MoeCounts = (usize, usize, usize);

/// Which expert matvecs run: version 2 (default) with its lanes per row (16 when a row has
/// at most 16 thread items, else 32), version 3 under `REDLITE_MOE_V3=1` (measured slower on
/// the H200: reading x through L1 instead of shared memory costs more than staging it; see
/// docs/PERF.md), version 1 under `REDLITE_MATVEC_V1=1`.
enum MoeVersion {
    V1,
    V2 { lanes: usize },
    V3,
    Q8 { lanes: usize },
}

/// Whether the version-3 expert matvecs run (`REDLITE_MOE_V3=1`, and not
/// `REDLITE_MATVEC_V1=1`).
pub(crate) fn moe_v3() -> bool {
    static V3: OnceLock<bool> = OnceLock::new();
    !matvec_v1() && *V3.get_or_init(|| std::env::var("REDLITE_MOE_V3").as_deref() == Ok("1"))
}

/// Rows per lane group of the q8 expert matvecs: `REDLITE_MOE_ROWS` (1, 2 or 4), else 1.
fn moe_q8_rows() -> usize {
    static ROWS: OnceLock<usize> = OnceLock::new();
    *ROWS.get_or_init(|| {
        std::env::var("REDLITE_MOE_ROWS")
            .ok()
            .and_then(|v| v.parse().ok())
            .filter(|r| source::MOE_Q8_ROWS.contains(r))
            .unwrap_or(1)
    })
}

/// Whether the expert launches of `ty` with `dots` can take the shared expert along (the
/// version-3 and q8 kernels can).
pub(crate) fn moe_folds(ty: GgmlType, dots: Dots) -> bool {
    !matvec_v1() && (moe_v3() || dots.quantizes(ty))
}

fn moe_version(kind: WeightKind, dots: Dots, cols: usize) -> MoeVersion {
    if matvec_v1() {
        return MoeVersion::V1;
    }
    if moe_v3() {
        return MoeVersion::V3;
    }
    let items = cols / kind.ty.block_values() * kind.items_per_block;
    let lanes = if items <= MOE_LANES[0] {
        MOE_LANES[0]
    } else {
        MOE_LANES[1]
    };
    if dots.quantizes(kind.ty) {
        MoeVersion::Q8 { lanes }
    } else {
        MoeVersion::V2 { lanes }
    }
}

#[allow(clippy::too_many_arguments)]
pub(crate) fn moe_gate_up(
    device: &Device,
    kind: WeightKind,
    dots: Dots,
    gate: &CudaView<'_, u8>,
    up: &CudaView<'_, u8>,
    ids: &CudaView<'_, i32>,
    x: &CudaView<'_, f32>,
    act: &mut CudaViewMut<'_, f32>,
    (ff, cols): (usize, usize),
    (tokens, used, n_expert): MoeCounts,
    shared: Option<raw::SharedUpArgs<'_, '_>>,
) -> Result<(), CudaError> {
    let (kernel, rows_per_cta, threads, shared_bytes) = match moe_version(kind, dots, cols) {
        MoeVersion::V3 => (
            device.kernel(&source::moe_gate_up_v3_kernel(kind))?,
            MOE_V3_WARPS as usize,
            MOE_V3_WARPS * 32,
            0,
        ),
        MoeVersion::V2 { lanes } => (
            device.kernel(&source::moe_gate_up_v2_kernel(kind, lanes))?,
            LAYER_WARPS as usize * 32 / lanes,
            LAYER_WARPS * 32,
            cols * size_of::<f32>(),
        ),
        MoeVersion::Q8 { lanes } => (
            device.kernel(&source::moe_gate_up_q8_kernel(kind, lanes, moe_q8_rows()))?,
            LAYER_WARPS as usize * 32 / lanes * moe_q8_rows(),
            LAYER_WARPS * 32,
            q8_shared_bytes(cols),
        ),
        MoeVersion::V1 => (
            device.kernel(&source::moe_gate_up_kernel(kind))?,
            LAYER_WARPS as usize,
            LAYER_WARPS * 32,
            cols * size_of::<f32>(),
        ),
    };
    let dims = (to_i32(ff), to_i32(cols), to_i32(used), to_i32(n_expert));
    if let MoeVersion::V3 | MoeVersion::Q8 { .. } = moe_version(kind, dots, cols) {
        let (slots, rows) = match &shared {
            Some(s) => (used + 1, ff.max(s.3)),
            None => (used, ff),
        };
        let cfg = config(
            (rows.div_ceil(rows_per_cta), slots, tokens),
            threads,
            shared_bytes,
        );
        let version = if dots.quantizes(kind.ty) { "q8" } else { "v3" };
        crate::profile::label(|| {
            format!(
                "moe_gate_up {version} {} {ff}x{cols} slots{slots}",
                kind.cuda_name
            )
        });
        let inputs = (gate, up, ids, x);
        return raw::launch_moe_gate_up_v3(device.stream(), kernel, cfg, inputs, act, dims, shared);
    }
    let cfg = config(
        (ff.div_ceil(rows_per_cta), used, tokens),
        threads,
        shared_bytes,
    );
    crate::profile::label(|| format!("moe_gate_up {} {ff}x{cols} used{used}", kind.cuda_name));
    raw::launch_moe_gate_up(device.stream(), kernel, cfg, gate, up, ids, x, act, dims)
}

#[allow(clippy::too_many_arguments)]
pub(crate) fn moe_down(
    device: &Device,
    kind: WeightKind,
    dots: Dots,
    down: &CudaView<'_, u8>,
    ids: &CudaView<'_, i32>,
    weights: &CudaView<'_, f32>,
    act: &CudaView<'_, f32>,
    out: &mut CudaViewMut<'_, f32>,
    (rows, ff, accumulate): (usize, usize, bool),
    (tokens, used, n_expert): MoeCounts,
    shared: Option<raw::SharedDownArgs<'_, '_>>,
) -> Result<(), CudaError> {
    let staged = used * ff * size_of::<f32>();
    let (kernel, rows_per_cta, threads, shared_bytes) = match moe_version(kind, dots, ff) {
        MoeVersion::V3 => (
            device.kernel(&source::moe_down_v3_kernel(kind))?,
            MOE_V3_WARPS as usize,
            MOE_V3_WARPS * 32,
            0,
        ),
        MoeVersion::V2 { lanes } => (
            device.kernel(&source::moe_down_v2_kernel(kind, lanes))?,
            LAYER_WARPS as usize * 32 / lanes,
            LAYER_WARPS * 32,
            staged,
        ),
        MoeVersion::Q8 { lanes } => (
            device.kernel(&source::moe_down_q8_kernel(kind, lanes, moe_q8_rows()))?,
            LAYER_WARPS as usize * 32 / lanes * moe_q8_rows(),
            LAYER_WARPS * 32,
            q8_shared_bytes(used * ff + shared.as_ref().map_or(0, |s| s.3)),
        ),
        MoeVersion::V1 => (
            device.kernel(&source::moe_down_kernel(kind))?,
            LAYER_WARPS as usize,
            LAYER_WARPS * 32,
            staged,
        ),
    };
    let cfg = config(
        (rows.div_ceil(rows_per_cta), tokens, 1),
        threads,
        shared_bytes,
    );
    let dims = (
        to_i32(rows),
        to_i32(ff),
        to_i32(used),
        to_i32(n_expert),
        i32::from(accumulate),
    );
    if let MoeVersion::V3 | MoeVersion::Q8 { .. } = moe_version(kind, dots, ff) {
        let with = if shared.is_some() { "+shared" } else { "" };
        let version = if dots.quantizes(kind.ty) { "q8" } else { "v3" };
        crate::profile::label(|| {
            format!(
                "moe_down {version} {} {rows}x{ff} used{used}{with}",
                kind.cuda_name
            )
        });
        let inputs = (down, ids, weights, act);
        return raw::launch_moe_down_v3(device.stream(), kernel, cfg, inputs, out, dims, shared);
    }
    crate::profile::label(|| format!("moe_down {} {rows}x{ff} used{used}", kind.cuda_name));
    raw::launch_moe_down(
        device.stream(),
        kernel,
        cfg,
        down,
        ids,
        weights,
        act,
        out,
        dims,
    )
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

pub(crate) fn deltanet_conv(
    device: &Device,
    d: &DeltaDims,
    width: usize,
    w: &CudaView<'_, f32>,
    state: &mut CudaViewMut<'_, f32>,
    qkv: &mut CudaViewMut<'_, f32>,
) -> Result<(), CudaError> {
    let kernel = device.kernel(&source::conv_kernel(width))?;
    let channels = d.channels();
    let cfg = config(
        (channels.div_ceil(FLAT_THREADS as usize), 1, 1),
        FLAT_THREADS,
        0,
    );
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

pub(crate) fn delta_rule(
    device: &Device,
    d: &DeltaDims,
    (qkv, beta, g): (&CudaView<'_, f32>, &CudaView<'_, f32>, &CudaView<'_, f32>),
    state: &mut CudaViewMut<'_, f32>,
    out: &mut CudaViewMut<'_, f32>,
) -> Result<(), CudaError> {
    let kernel = device.kernel(&source::delta_rule_kernel(d.head_dim))?;
    let cfg = config(
        (d.v_heads, d.head_dim / DELTA_COLS as usize, 1),
        DELTA_COLS,
        0,
    );
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
    conv_state: &mut CudaViewMut<'_, f32>,
    recurrent: &mut CudaViewMut<'_, f32>,
    out: &mut CudaViewMut<'_, f32>,
) -> Result<(), CudaError> {
    let kernel = device.kernel(&source::deltanet_step_kernel(d.head_dim, width))?;
    let threads = d.v_heads / d.k_heads * d.head_dim;
    let cfg = config((d.k_heads, 1, 1), to_u32(threads), 0);
    let dims = [d.k_heads, d.v_heads].map(to_i32);
    let q_scale = 1.0 / (d.head_dim as f32).sqrt();
    raw::launch_deltanet_step(
        device.stream(),
        kernel,
        cfg,
        inputs,
        (conv_state, recurrent, out),
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
    let (splits, chunk) = match pos {
        Some(_) => (device_pos_splits(d, partials.len()), 0),
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
        let cfg = config((d.tokens, d.heads, 1), 128, 0);
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
