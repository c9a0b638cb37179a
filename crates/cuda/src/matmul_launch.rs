//! The matrix product's launcher: which kernel a shape takes (float GEMM, token tiles, the
//! small-batch product, split-K, q8, versions 1 and 2), its grid and dynamic shared memory,
//! for a shape the op entry (`layer_ops::matmul`) already validated.

use crate::device::Device;
use crate::error::CudaError;
use crate::layer_launch::{config, to_i32, warps_grid, SHARED_MAX_BYTES};
use crate::ops::Dots;
use crate::q8_input::Q8Views;
use crate::raw;
use crate::source::{
    self, WeightKind, GEMM_THREADS, GEMM_TILES, LAYER_WARPS, MATMUL_SPLITK_WARPS, MATMUL_TILE_ROWS,
    MATMUL_TILE_TOKENS, MATMUL_V2_ROWS, MATMUL_V2_WARPS, ONE_TOKEN_KERNELS_MAX_TOKENS,
    SMALL_BATCH_MAX_TOKENS, WIDE_F16, WIDE_F32,
};
use cudarc::driver::{CudaView, CudaViewMut, LaunchConfig};
use redlite_gguf::GgmlType;
use std::sync::OnceLock;

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
    let q8 = raw::Q8Arg::new(plan.q8_input, q8);
    let staged = plan.cfg.shared_mem_bytes as usize;
    plan.cfg.shared_mem_bytes = q8.shared_bytes(staged) as u32;
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
        let per_warp = small_batch_rows(device, rows);
        let grid = (rows.div_ceil(MATMUL_V2_WARPS as usize * per_warp), 1, 1);
        let kernel = source::matmul_q8_small_kernel(kind, tokens, per_warp);
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
    // A small batch's split-K products: all its tokens in each CTA (q8 types, or the wide
    // F32 / F16 rows of the router).
    let small_splitk_fits = if q8 {
        small_shared <= SHARED_MAX_BYTES
    } else {
        [WIDE_F32.0, WIDE_F16.0].contains(&block)
    };
    if small_splitk
        && small_splitk_fits
        && (2..=SMALL_BATCH_MAX_TOKENS).contains(&tokens)
        && small_splitk_together()
    {
        let (kernel, shared, version) = if q8 {
            let kernel = source::matmul_splitk_q8_small_kernel(kind, tokens);
            (kernel, small_shared, "splitk q8 small ")
        } else {
            (
                source::matmul_splitk_small_kernel(block, tokens),
                0,
                "splitk small ",
            )
        };
        return MatmulPlan {
            tiled: true,
            q8_input: q8,
            ..plan(kernel, (rows, 1, 1), MATMUL_SPLITK_WARPS, shared, version)
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
    let per_warp = matmul_rows_per_warp(rows, device.multiprocessors() as usize, q8);
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

/// CTAs of a small batch's products (8 warps, held to 64 registers by `TilesMinBlocks` in
/// `matmul.cu`) a multiprocessor holds at once.
const SMALL_TILES_CTAS_PER_SM: usize = 4;

/// Rows a warp of a small batch's product of `rows` rows: 2 where one row a warp asks more
/// CTAs than one wave holds (`SMALL_TILES_CTAS_PER_SM` a multiprocessor), as an 8,192-row
/// projection does (1,024 CTAs against 528 on an H100), else 1. Each row's lanes and sums are
/// the same either way: the same bits. `REDLITE_SMALL_BATCH_ROWS=1` keeps one.
fn small_batch_rows(device: &Device, rows: usize) -> usize {
    static ON: OnceLock<bool> = OnceLock::new();
    let on = *ON.get_or_init(|| std::env::var("REDLITE_SMALL_BATCH_ROWS").as_deref() != Ok("1"));
    let one_wave = SMALL_TILES_CTAS_PER_SM * device.multiprocessors() as usize;
    if on && rows.div_ceil(MATMUL_V2_WARPS as usize) > one_wave {
        2
    } else {
        1
    }
}

/// Whether a small batch's split-K products take all its tokens in each CTA
/// (`matmul_splitk_q8_small_kernel`, and `matmul_splitk_small_kernel` for wide F32 / F16
/// rows: each weight item loaded, and decoded, once for them; the same bits as a CTA a
/// token). `REDLITE_SMALL_SPLITK=0` keeps a CTA a token.
fn small_splitk_together() -> bool {
    static ON: OnceLock<bool> = OnceLock::new();
    *ON.get_or_init(|| std::env::var("REDLITE_SMALL_SPLITK").as_deref() != Ok("0"))
}

/// Batches of several tokens take the token-tiled q8 matmul (same sums per row as the
/// one-token kernel; pp512 +16 % on the H200); `REDLITE_PREFILL_TILES=0` turns it off.
fn prefill_tiles() -> bool {
    static ON: OnceLock<bool> = OnceLock::new();
    *ON.get_or_init(|| std::env::var("REDLITE_PREFILL_TILES").as_deref() != Ok("0"))
}

/// `REDLITE_MATMUL_SPLITK=0`: version 2 (or q8) for every shape.
pub(crate) fn split_k() -> bool {
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
/// multiprocessor two CTAs; of the q8 one (`q8`), one. `REDLITE_MATMUL_ROWS` (1, 2 or 4)
/// forces one. A q8 warp's rows are summed each in the same order whatever their number (the
/// same bits); one row a warp measured faster in every A/B (H200 with PDL, full IQ2_XXS file:
/// tg128 354.3 against 343.4 and 346.8 with the heuristic's rows, 318.4 against 312.7 at
/// depth 4096; without PDL +0.6 to +1.5 %), and for the 8,192-row products alone, at 2 rows (1.3
/// waves of the Q4_K qkv) and at the rows that fit one wave (4 for the qkv), −1.2 % and −2.4 %.
fn matmul_rows_per_warp(rows: usize, multiprocessors: usize, q8: bool) -> usize {
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
    if q8 {
        return 1;
    }
    let ctas = |per_warp: usize| rows / (MATMUL_V2_WARPS as usize * per_warp);
    MATMUL_V2_ROWS
        .iter()
        .rev()
        .copied()
        .find(|&r| ctas(r) >= 2 * multiprocessors)
        .unwrap_or(1)
}

/// Small batches' q8 products with all their tokens in each CTA, unless
/// `REDLITE_SMALL_BATCH_MATVEC=0` (the 8-token tiles then; the same bits either way).
fn small_matvec() -> bool {
    static ON: OnceLock<bool> = OnceLock::new();
    *ON.get_or_init(|| std::env::var("REDLITE_SMALL_BATCH_MATVEC").as_deref() != Ok("0"))
}
