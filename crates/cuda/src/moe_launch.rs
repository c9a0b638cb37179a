//! Launchers of the MoE kernels: routing, and the expert gate/up and down matvecs in their
//! versions (1, 2, 3 and q8), with the shared expert folded in where the version allows.

use crate::device::Device;
use crate::error::CudaError;
use crate::layer_launch::{config, matvec_v1, q8_shared_bytes, to_i32, ROW_THREADS};
use crate::ops::Dots;
use crate::q8_input::Q8Views;
use crate::raw;
use crate::source::{self, WeightKind, LAYER_WARPS, MOE_LANES, MOE_PRELOAD_ITEMS, MOE_V3_WARPS};
use cudarc::driver::{CudaView, CudaViewMut};
use redlite_gguf::GgmlType;
use std::cell::Cell;
use std::sync::OnceLock;

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

/// Rows per lane group of the q8 expert gate/up matvec: `REDLITE_MOE_GATE_UP_ROWS` (1, 2 or
/// 4), else `REDLITE_MOE_ROWS` if set, else 2, for any batch (four rows for batches of 2 to 16
/// tokens measured slower on the H200, eighteenth session: pp2 504.7 vs 515.5 t/s, MTP one
/// draft at 0.7 403.9 vs 410.4). Each row sums in the same order whatever the count (the same
/// bits). Two rows halve the CTAs, so the 10 + 1 experts of a token fit one wave on the H200
/// and each CTA's input quantization serves twice the rows: tg128 +2.2 % over one row
/// (docs/PERF.md, tenth session); the down matvec keeps one row (its loads-ahead kernel).
fn gate_up_rows() -> usize {
    static FORCED: OnceLock<Option<usize>> = OnceLock::new();
    let forced = *FORCED.get_or_init(|| {
        let forced = |name| {
            std::env::var(name)
                .ok()
                .and_then(|v| v.parse().ok())
                .filter(|r| source::MOE_Q8_ROWS.contains(r))
        };
        forced("REDLITE_MOE_GATE_UP_ROWS").or_else(|| forced("REDLITE_MOE_ROWS"))
    });
    forced.unwrap_or(2)
}

/// [`gate_up_rows`] for a launch of `tokens` tokens: a batch (an MTP verification, serving
/// slots) takes `REDLITE_MOE_BATCH_GATE_UP_ROWS` (1, 2 or 4) where it is set, an A/B of the
/// batches' CTA count (four rows: a quarter of the one-row CTAs, so a 4-row verification's
/// 44 expert slots take 1,408 CTAs instead of 2,816). The same bits either way.
fn gate_up_rows_for(tokens: usize) -> usize {
    static BATCH: OnceLock<Option<usize>> = OnceLock::new();
    let batch = *BATCH.get_or_init(|| {
        std::env::var("REDLITE_MOE_BATCH_GATE_UP_ROWS")
            .ok()
            .and_then(|v| v.parse().ok())
            .filter(|r| source::MOE_Q8_ROWS.contains(r))
    });
    match batch {
        Some(rows) if tokens > 1 => rows,
        _ => gate_up_rows(),
    }
}

/// CTAs of the preloading expert down (8 warps at 128 registers) a multiprocessor holds.
const DOWN_CTAS_PER_SM: usize = 2;

/// Whether a preloading expert down of `tokens` tokens and `ctas` CTAs a token runs folded
/// (each thread two lanes' work, half the CTAs: `moe_decode.cu`): for a few tokens whose
/// CTAs would need a second wave (`DOWN_CTAS_PER_SM` a multiprocessor), as an MTP
/// verification of three or four rows does on the 80B model. The same bits either way;
/// `REDLITE_DOWN_FOLD=0` never folds.
fn down_folded(device: &Device, tokens: usize, ctas: usize) -> bool {
    static ON: OnceLock<bool> = OnceLock::new();
    let on = *ON.get_or_init(|| std::env::var("REDLITE_DOWN_FOLD").as_deref() != Ok("0"));
    let one_wave = DOWN_CTAS_PER_SM * device.multiprocessors() as usize;
    on && tokens <= DOWN_FOLD_MAX_TOKENS && tokens * ctas > one_wave
}

/// The most tokens a folded expert down is used for (more: prompts, whose many waves folding
/// does not shorten).
const DOWN_FOLD_MAX_TOKENS: usize = 8;

/// Whether the one-row q8 expert down matvec loads its weights ahead of the input's
/// quantization (`moe_decode.cu`): the same bits, a shorter latency chain;
/// `REDLITE_MOE_DOWN_PRELOAD=0` keeps the kernel that loads as it goes.
pub(crate) fn preload() -> bool {
    static ON: OnceLock<bool> = OnceLock::new();
    let from_env =
        || *ON.get_or_init(|| std::env::var("REDLITE_MOE_DOWN_PRELOAD").as_deref() != Ok("0"));
    PRELOAD_HERE.get().unwrap_or_else(from_env)
}

thread_local! {
    /// This thread's choice over the environment's (`with_preload`).
    static PRELOAD_HERE: Cell<Option<bool>> = const { Cell::new(None) };
}

/// Runs `f` with the preloading down kernel on or off for launches from this thread,
/// whatever the environment says: the kernel tests compare the two bit for bit in one
/// process.
#[doc(hidden)]
pub fn with_preload<R>(on: bool, f: impl FnOnce() -> R) -> R {
    struct Restore(Option<bool>);
    impl Drop for Restore {
        fn drop(&mut self) {
            PRELOAD_HERE.set(self.0);
        }
    }
    let _restore = Restore(PRELOAD_HERE.replace(Some(on)));
    f()
}

/// Items per lane of a row of `values` values of `kind` shared by `lanes` lanes.
fn items_per_lane(kind: WeightKind, values: usize, lanes: usize) -> usize {
    (values / kind.ty.block_values() * kind.items_per_block).div_ceil(lanes)
}

/// Whether the expert launches of `ty` with `dots` can take the shared expert along (the
/// version-3 and q8 kernels can).
pub(crate) fn moe_folds(ty: GgmlType, dots: Dots) -> bool {
    !matvec_v1() && (moe_v3() || dots.quantizes(ty))
}

/// Whether a gate/up launch of `ty` with `dots` takes the q8 kernel (the one
/// `moe_gate_up_q8_cached_kernel` runs with an expert cache's copies).
pub(crate) fn gate_up_is_q8(ty: GgmlType, dots: Dots) -> bool {
    !matvec_v1() && !moe_v3() && dots.quantizes(ty)
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
    (x, q8): (&CudaView<'_, f32>, Option<Q8Views<'_, '_>>),
    act: &mut CudaViewMut<'_, f32>,
    (ff, cols): (usize, usize),
    (tokens, used, n_expert): MoeCounts,
    shared: Option<raw::SharedUpArgs<'_, '_>>,
    copies: Option<CachedCopies<'_, '_>>,
) -> Result<(), CudaError> {
    if let Some(copies) = copies {
        let MoeVersion::Q8 { lanes } = moe_version(kind, dots, cols) else {
            return Err(CudaError::UnsupportedType {
                op: crate::CudaOp::MoeGateUp,
                ty: kind.ty,
            });
        };
        let rows_per_cta = LAYER_WARPS as usize * 32 / lanes * gate_up_rows();
        let kernel = source::moe_gate_up_q8_cached_kernel(kind, lanes, gate_up_rows());
        return gate_up_cached(
            device,
            device.kernel(&kernel)?,
            (gate, up, ids),
            (x, q8),
            act,
            ((ff, cols), rows_per_cta, (used, n_expert)),
            shared,
            copies,
        );
    }
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
            device.kernel(&source::moe_gate_up_q8_kernel(
                kind,
                lanes,
                gate_up_rows_for(tokens),
                tokens > 1,
            ))?,
            LAYER_WARPS as usize * 32 / lanes * gate_up_rows_for(tokens),
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
        let q8 = raw::Q8Arg::new(dots.quantizes(kind.ty), q8);
        let shared_bytes = q8.shared_bytes(shared_bytes);
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
        return raw::launch_moe_gate_up_v3(
            device.stream(),
            kernel,
            cfg,
            inputs,
            q8,
            act,
            dims,
            shared,
            None,
        );
    }
    let cfg = config(
        (ff.div_ceil(rows_per_cta), used, tokens),
        threads,
        shared_bytes,
    );
    crate::profile::label(|| format!("moe_gate_up {} {ff}x{cols} used{used}", kind.cuda_name));
    raw::launch_moe_gate_up(device.stream(), kernel, cfg, gate, up, ids, x, act, dims)
}

/// The misses' copies riding in a one-token gate/up launch (`moe_cached.cu`), checked by
/// the op entry: the raw arguments and the copy CTAs per fill.
pub(crate) struct CachedCopies<'a, 'b> {
    pub args: raw::CachedCopyArgs<'a, 'b>,
    /// Copy CTAs of one fill: gate and up, down.
    pub chunks: (usize, usize),
}

/// `moe_gate_up_q8_cached_kernel`: the q8 gate/up of one token with the copies' CTAs before
/// (gate, up) and after (down) its own, all in one flat grid.
#[allow(clippy::too_many_arguments, clippy::type_complexity)]
fn gate_up_cached(
    device: &Device,
    kernel: &cudarc::driver::CudaFunction,
    (gate, up, ids): (&CudaView<'_, u8>, &CudaView<'_, u8>, &CudaView<'_, i32>),
    (x, q8): (&CudaView<'_, f32>, Option<Q8Views<'_, '_>>),
    act: &mut CudaViewMut<'_, f32>,
    ((ff, cols), rows_per_cta, (used, n_expert)): ((usize, usize), usize, (usize, usize)),
    shared: Option<raw::SharedUpArgs<'_, '_>>,
    copies: CachedCopies<'_, '_>,
) -> Result<(), CudaError> {
    let (slots, rows) = match &shared {
        Some(s) => (used + 1, ff.max(s.3)),
        None => (used, ff),
    };
    let grid = (rows.div_ceil(rows_per_cta), slots);
    let max_fills = copies.args.fills.len() / 2;
    let (gate_chunks, down_chunks) = copies.chunks;
    let ctas = max_fills * (2 * gate_chunks + down_chunks) + grid.0 * grid.1;
    let q8 = raw::Q8Arg::new(true, q8);
    let cfg = config(
        (ctas, 1, 1),
        LAYER_WARPS * 32,
        q8.shared_bytes(q8_shared_bytes(cols)),
    );
    crate::profile::label(|| {
        format!("moe_gate_up cached {ff}x{cols} slots{slots} fills{max_fills}")
    });
    let dims = (to_i32(ff), to_i32(cols), to_i32(used), to_i32(n_expert));
    raw::launch_moe_gate_up_v3(
        device.stream(),
        kernel,
        cfg,
        (gate, up, ids, x),
        q8,
        act,
        dims,
        shared,
        Some((copies.args, (to_i32(grid.0), to_i32(grid.1)))),
    )
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
    weights_fixed: bool,
) -> Result<(), CudaError> {
    let staged = used * ff * size_of::<f32>();
    let shared_ff = shared.as_ref().map_or(0, |s| s.3);
    let preload_items = |lanes| {
        let items = items_per_lane(kind, ff.max(shared_ff), lanes);
        Some(items).filter(|i| preload() && moe_q8_rows() == 1 && MOE_PRELOAD_ITEMS.contains(i))
    };
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
        MoeVersion::Q8 { lanes } => {
            let (kernel, warps, fold) = match preload_items(lanes) {
                Some(items) => {
                    let warps = source::down_warps(kind);
                    let ctas = rows.div_ceil(warps as usize * 32 / lanes);
                    let fold = if down_folded(device, tokens, ctas) {
                        2
                    } else {
                        1
                    };
                    let early = weights_fixed && raw::pdl_enabled();
                    let kernel = source::moe_down_q8_preload_kernel(
                        kind,
                        lanes,
                        items,
                        (early, fold, tokens > 1),
                    );
                    (kernel, warps, fold)
                }
                None => (
                    source::moe_down_q8_kernel(kind, lanes, moe_q8_rows()),
                    LAYER_WARPS,
                    1,
                ),
            };
            (
                device.kernel(&kernel)?,
                warps as usize * 32 / (lanes / fold) * moe_q8_rows(),
                warps * 32,
                q8_shared_bytes(used * ff + shared_ff),
            )
        }
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
