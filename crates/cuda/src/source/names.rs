//! The kernels' name expressions (the template instances NVRTC exports) and the compile-time
//! sizes they are instantiated with, mirrored by the launchers.

use redlite_gguf::GgmlType;

use super::kinds::{MmaShape, WeightKind, Q8_DOT_TYPES, WEIGHT_KINDS};

/// Greedy sampling on the device (`elementwise.cu`, `greedy.rs`), and its values a thread.
pub(crate) const ARGMAX_KERNEL: &str = "argmax_kernel";
pub(crate) const IDS_OF_KEYS_KERNEL: &str = "ids_of_keys_kernel";
pub(crate) const COPY_SPANS_KERNEL: &str = "copy_spans_kernel";
pub(crate) const ARGMAX_PER_THREAD: usize = 8;

/// The weighted sum of per-pair expert outputs (`moe.cu`).
pub(crate) const MOE_COMBINE_KERNEL: &str = "moe_combine_kernel";
/// The GPU expert cache's kernels (`expert_cache.cu`).
pub(crate) const EXPERT_CACHE_LOOKUP: &str = "expert_cache_lookup_kernel";
pub(crate) const EXPERT_CACHE_FILL: &str = "expert_cache_fill_kernel";
/// The benchmark-only skewed routing (`moe_route.cu`, `route_skew.rs`).
pub(crate) const MOE_ROUTE_SKEW_KERNEL: &str = "moe_route_skew_kernel";

pub(crate) fn mma_matmul_kernel(kind: WeightKind, s: MmaShape) -> String {
    format!(
        "mma_matmul_kernel<{}, {}, {}, {}, {}, {}>",
        kind.cuda_name, s.warps_m, s.warps_n, s.frags_m, s.frags_n, s.mats
    )
}

pub(crate) const MMA_QUANTIZE_KERNEL: &str = "mma_quantize_kernel";
pub(crate) const MMA_COMBINE_KERNEL: &str = "mma_combine_kernel";
pub(crate) const MMA_GROUP_KERNEL: &str = "mma_group_kernel";

pub(super) fn q8_kinds() -> impl Iterator<Item = WeightKind> {
    WEIGHT_KINDS
        .into_iter()
        .filter(|k| Q8_DOT_TYPES.contains(&k.ty))
}

/// Rows per CTA of the matvec kernel (one warp each).
pub(crate) const MATVEC_WARPS: u32 = 4;

pub(crate) fn dequantize_kernel(kind: WeightKind) -> String {
    format!("dequantize_kernel<{}>", kind.cuda_name)
}

/// Dequantization to f16 (the weights of a cuBLAS prompt product).
pub(crate) fn dequantize_f16_kernel(kind: WeightKind) -> String {
    format!("dequantize_f16_kernel<{}>", kind.cuda_name)
}

/// f32 to f16 (the activations of a cuBLAS prompt product).
pub(crate) const TO_F16_KERNEL: &str = "to_f16_kernel";

pub(crate) fn matvec_kernel(kind: WeightKind, x_shared: bool) -> String {
    format!(
        "matvec_kernel<{}, {MATVEC_WARPS}, {x_shared}>",
        kind.cuda_name
    )
}

/// Rows (warps) per CTA of the layer matvecs (matmul, MoE gate/up and down).
pub(crate) const LAYER_WARPS: u32 = 4;
/// Value columns per CTA of the delta-rule kernel (one thread each).
pub(crate) const DELTA_COLS: u32 = 32;
/// Key dims the delta-rule kernel is built for (the state column lives in registers).
pub(crate) const DELTA_DK: [usize; 3] = [32, 64, 128];
/// Rows of a group in the fused DeltaNet step (`deltanet_step_kernel`'s G): an even number of
/// rows in pairs, an odd one row by row; under `REDLITE_DELTANET_WHOLE_GROUP=1` a batch of 3
/// or 4 rows (an MTP verification of 2 or 3 drafts) as one group of all its rows (the kernel
/// then takes the rows one after another, their gates through shared memory: unrolled they
/// spill the state column).
pub(crate) const DELTA_ROW_GROUPS: [usize; 4] = [1, 2, 3, 4];
/// The groups of [`DELTA_ROW_GROUPS`] built only for a batch of exactly that many rows.
pub(crate) const DELTA_WHOLE_GROUPS: [usize; 2] = [3, 4];
/// Rows whose delta-rule inputs the fused step keeps for a replay (`deltanet_step_kernel`'s
/// REPLAY_ROWS: a verification of up to 4 rows keeps its first 3).
pub(crate) const DELTA_REPLAY_MAX_ROWS: usize = 3;
/// Tokens per chunk of the chunked delta rule (`deltanet_chunked.cu`).
pub(crate) const DELTA_CHUNK: usize = 64;
/// Threads per CTA of the chunked delta rule, and the value columns each CTA owns
/// (`DELTA_CHUNK_THREADS`, `DELTA_CHUNK_COLS` there).
pub(crate) const DELTA_CHUNK_THREADS: u32 = 256;
pub(crate) const DELTA_CHUNK_COLS: usize = 32;
/// Threads per CTA of the token-parallel conv: 32 channels x 32 token ranges.
pub(crate) const CONV_TOKENS_THREADS: u32 = 1024;
/// Causal conv widths the conv kernel is built for.
pub(crate) const CONV_KERNELS: [usize; 1] = [4];
/// Attention head dims the attention kernel is built for (32 x values per lane).
pub(crate) const ATTENTION_HEAD_DIMS: [usize; 3] = [64, 128, 256];
/// Warps per CTA of the attention kernels.
pub(crate) const ATTENTION_WARPS: u32 = 4;
/// Most KV-length splits of the flash-decoding attention (per token and head), unless
/// `REDLITE_ATTN_MAX_SPLITS` says otherwise (`attention_max_splits`).
pub const ATTENTION_MAX_SPLITS: usize = 64;
/// Fewest positions per split: shorter ranges do not pay for their partials.
pub(crate) const ATTENTION_MIN_CHUNK: usize = 32;
/// Batches (per sequence) of at most this many tokens (an MTP verification: one token and up
/// to three drafts) run the DeltaNet rows in one fused launch, split each token's attention
/// as a one-token step does, take the small-batch q8 product, and may read their position
/// from device memory (a recorded graph replayed at any position); each row gives the bits
/// of a one-token step.
pub const SMALL_BATCH_MAX_TOKENS: usize = 4;
/// Batches of at most this many tokens (several serving slots decoding together, with their
/// MTP verifications: 4 slots x (1 + 3)) take the one-token step's products and MoE kernels,
/// each row summed as a one-token step sums it: a request decoded beside others gets the bits
/// it gets alone. Larger batches (prompts) take the prompt kernels (tensor cores, GEMMs).
pub const ONE_TOKEN_KERNELS_MAX_TOKENS: usize = 16;
/// KV-cache element types in CUDA spelling: f32 and f16 bits.
pub(crate) const KV_CUDA_TYPES: [&str; 2] = ["float", "u16"];

pub(crate) fn embed_kernel(kind: WeightKind) -> String {
    format!("embed_kernel<{}>", kind.cuda_name)
}

pub(crate) fn matmul_kernel(kind: WeightKind, x_shared: bool) -> String {
    format!(
        "matmul_kernel<{}, {LAYER_WARPS}, {x_shared}>",
        kind.cuda_name
    )
}

/// Warps per CTA of the version-2 dense matmul, and the rows per warp it is built for.
pub(crate) const MATMUL_V2_WARPS: u32 = 8;
pub(crate) const MATMUL_V2_ROWS: [usize; 3] = [1, 2, 4];
/// Block structs of `blocks.cuh` that read F32 / F16 rows 16 bytes at a time, with the
/// values each holds.
pub(crate) const WIDE_F32: (&str, usize) = ("F32x4", 4);
pub(crate) const WIDE_F16: (&str, usize) = ("F16x8", 8);

pub(crate) fn matmul_v2_kernel(block: &str, rows: usize, x_shared: bool) -> String {
    format!("matmul_v2_kernel<{block}, {MATMUL_V2_WARPS}, {rows}, {x_shared}>")
}

pub(crate) fn matmul_q8_kernel(kind: WeightKind, rows: usize) -> String {
    format!(
        "matmul_q8_kernel<{}, {MATMUL_V2_WARPS}, {rows}>",
        kind.cuda_name
    )
}

/// Rows per warp and tokens per CTA of the token-tiled q8 matmul (prompt ingestion).
pub(crate) const MATMUL_TILE_ROWS: usize = 2;
pub(crate) const MATMUL_TILE_TOKENS: usize = 8;

/// The token tiles for a small batch: exactly `tokens` tokens per CTA and `rows` rows per warp
/// (each warp then does `tokens` dots per weight item, the work of a few rows of one token).
pub(crate) fn matmul_q8_small_kernel(kind: WeightKind, tokens: usize, rows: usize) -> String {
    format!(
        "matmul_q8_tiles_kernel<{}, {MATMUL_V2_WARPS}, {rows}, {tokens}>",
        kind.cuda_name
    )
}

/// Rows a warp of the small-batch products (`matmul_q8_small_kernel`): 1, or 2 where one
/// row a warp would need a second wave (`matmul_launch.rs`).
pub(crate) const SMALL_BATCH_ROWS: [usize; 2] = [1, 2];

pub(crate) fn matmul_q8_tiles_kernel(kind: WeightKind) -> String {
    format!(
        "matmul_q8_tiles_kernel<{}, {MATMUL_V2_WARPS}, {MATMUL_TILE_ROWS}, {MATMUL_TILE_TOKENS}>",
        kind.cuda_name
    )
}

/// Weight rows and tokens per CTA of the float-weight prompt GEMM (`gemm.cu`): 64 x 64, or
/// 64 x 32 where 64-token tiles would not fill the GPU.
pub(crate) const GEMM_TILES: [(usize, usize); 2] = [(64, 64), (64, 32)];
/// Threads per CTA of the float-weight prompt GEMM (`GEMM_THREADS` there).
pub(crate) const GEMM_THREADS: u32 = 256;

/// The float-weight prompt GEMM for F32 or F16 weights (`gemm_float_kernel`), tiles of
/// `tile` (one of [`GEMM_TILES`]).
pub(crate) fn gemm_float_kernel(ty: GgmlType, (bm, bn): (usize, usize)) -> Option<String> {
    let element = match ty {
        GgmlType::F32 => "float",
        GgmlType::F16 => "u16",
        _ => return None,
    };
    Some(format!("gemm_float_kernel<{element}, {bm}, {bn}>"))
}

/// Warps per CTA of the split-K matmul (one CTA per row).
pub(crate) const MATMUL_SPLITK_WARPS: u32 = 4;

pub(crate) fn matmul_splitk_kernel(block: &str, q8: bool) -> String {
    let name = if q8 {
        "matmul_splitk_q8_kernel"
    } else {
        "matmul_splitk_kernel"
    };
    format!("{name}<{block}, {MATMUL_SPLITK_WARPS}>")
}

/// The split-K float product of a small batch of `tokens` tokens, all in each CTA
/// (`matmul.cu`), for the wide F32 / F16 rows (`WIDE_F32`, `WIDE_F16`): the router's.
pub(crate) fn matmul_splitk_small_kernel(block: &str, tokens: usize) -> String {
    format!("matmul_splitk_small_kernel<{block}, {MATMUL_SPLITK_WARPS}, {tokens}>")
}

/// The split-K q8 product of a small batch of `tokens` tokens, all in each CTA (`matmul.cu`).
pub(crate) fn matmul_splitk_q8_small_kernel(kind: WeightKind, tokens: usize) -> String {
    format!(
        "matmul_splitk_q8_small_kernel<{}, {MATMUL_SPLITK_WARPS}, {tokens}>",
        kind.cuda_name
    )
}

/// Rows per lane group the q8 expert matvecs are built for.
pub(crate) const MOE_Q8_ROWS: [usize; 3] = [1, 2, 4];

/// `batch`: the instance of the module built for batches (`moe_batch`, the IQ2 codebooks read
/// from global memory: `batch_tables_prefix`).
pub(crate) fn moe_gate_up_q8_kernel(
    kind: WeightKind,
    lanes: usize,
    rows: usize,
    batch: bool,
) -> String {
    format!(
        "moe_gate_up_q8{}_kernel<{}, {LAYER_WARPS}, {lanes}, {rows}>",
        batch_infix(batch),
        kind.cuda_name
    )
}

/// The infix of a q8 expert kernel's name in the `moe_batch` module.
fn batch_infix(batch: bool) -> &'static str {
    if batch {
        "_batch"
    } else {
        ""
    }
}

/// The q8 gate/up of one token with an expert cache's copies in the launch (`moe_cached.cu`).
pub(crate) fn moe_gate_up_q8_cached_kernel(kind: WeightKind, lanes: usize, rows: usize) -> String {
    format!(
        "moe_gate_up_q8_cached_kernel<{}, {LAYER_WARPS}, {lanes}, {rows}>",
        kind.cuda_name
    )
}

/// The grouped gate/up (prompts): one row per lane group, `GROUP_TILE` pairs per CTA.
pub(crate) fn moe_gate_up_q8_grouped_kernel(kind: WeightKind, lanes: usize) -> String {
    format!(
        "moe_gate_up_q8_grouped_kernel<{}, {LAYER_WARPS}, {lanes}, {}>",
        kind.cuda_name,
        crate::moe_groups::GROUP_TILE
    )
}

pub(crate) fn moe_down_q8_kernel(kind: WeightKind, lanes: usize, rows: usize) -> String {
    format!(
        "moe_down_q8_kernel<{}, {LAYER_WARPS}, {lanes}, {rows}>",
        kind.cuda_name
    )
}

/// Items per lane and term the preloading down kernel is built for (`moe_decode.cu`).
pub(crate) const MOE_PRELOAD_ITEMS: [usize; 2] = [1, 2];

/// Threads a lane group's work is folded into by the preloading down (`moe_decode.cu`).
pub(crate) const MOE_DOWN_FOLDS: [usize; 2] = [1, 2];

/// `early`: the ids and weights loaded before the PDL wait (resident experts); `fold`: 1, or 2
/// for each thread doing two lanes' work (`moe_decode.cu`); `batch`: the `moe_batch` module's.
pub(crate) fn moe_down_q8_preload_kernel(
    kind: WeightKind,
    lanes: usize,
    items: usize,
    (early, fold, batch): (bool, usize, bool),
) -> String {
    format!(
        "moe_down_q8_preload{}_kernel<{}, {}, {lanes}, {items}, {early}, {fold}>",
        batch_infix(batch),
        kind.cuda_name,
        down_warps(kind)
    )
}

/// Warps a CTA of the preloading expert down of `kind`: 8 (128 CTAs a token for the 80B
/// model's 2,048 rows instead of 256 of 4, the same 8 warps a multiprocessor), so each CTA
/// quantizes the down's input (22 blocks of 256) in one load round instead of two, at the
/// same 128 registers; the IQ2_XS instances keep 4 (at 8 they spill 24-32 bytes). Each row's
/// lanes and sums are the same: the same bits. H100, f16 KV, three sets of three interleaved
/// rounds (twentieth session): tg128 +2.2 %, +0.9 %, +1.1 %, MTP one draft at 0.7 unchanged
/// (the other way to one round, 6 blocks a warp at a time in CTAs of 4 warps, cost MTP 7 %
/// at 151 registers, and was removed). `REDLITE_DOWN_WARPS=4` (a compile option) keeps 4 for
/// every type.
pub(crate) fn down_warps(kind: WeightKind) -> u32 {
    if down_warps_option() == LAYER_WARPS || kind.ty == GgmlType::IQ2XS {
        LAYER_WARPS
    } else {
        8
    }
}

/// `REDLITE_DOWN_WARPS`: 4 keeps `LAYER_WARPS` for every type; anything else, 8 (the
/// default).
pub(crate) fn down_warps_option() -> u32 {
    static WARPS: std::sync::OnceLock<u32> = std::sync::OnceLock::new();
    *WARPS.get_or_init(|| match std::env::var("REDLITE_DOWN_WARPS").as_deref() {
        Ok("4") => LAYER_WARPS,
        _ => 8,
    })
}

/// The `early` variants of the preloading down that are built: both unless `REDLITE_PDL=0`.
pub(super) fn preload_early_variants() -> &'static [bool] {
    match crate::raw::pdl_requested() {
        true => &[false, true],
        false => &[false],
    }
}

/// The block structs the version-2 matmul is instantiated for.
pub(super) fn matmul_v2_blocks() -> Vec<&'static str> {
    WEIGHT_KINDS
        .iter()
        .map(|k| k.cuda_name)
        .chain([WIDE_F32.0, WIDE_F16.0])
        .collect()
}

pub(crate) fn moe_gate_up_kernel(kind: WeightKind) -> String {
    format!("moe_gate_up_kernel<{}, {LAYER_WARPS}>", kind.cuda_name)
}

pub(crate) fn moe_down_kernel(kind: WeightKind) -> String {
    format!("moe_down_kernel<{}, {LAYER_WARPS}>", kind.cuda_name)
}

/// Lanes per row the version-2 expert matvecs are built for.
pub(crate) const MOE_LANES: [usize; 2] = [16, 32];

pub(crate) fn moe_gate_up_v2_kernel(kind: WeightKind, lanes: usize) -> String {
    format!(
        "moe_gate_up_v2_kernel<{}, {LAYER_WARPS}, {lanes}>",
        kind.cuda_name
    )
}

pub(crate) fn moe_down_v2_kernel(kind: WeightKind, lanes: usize) -> String {
    format!(
        "moe_down_v2_kernel<{}, {LAYER_WARPS}, {lanes}>",
        kind.cuda_name
    )
}

/// Router probabilities per lane of the version-2 routing (n_expert ≤ 32 x this).
pub(crate) const ROUTE_V2_PER_LANE: usize = 16;

pub(crate) fn route_v2_kernel() -> String {
    format!("moe_route_v2_kernel<{ROUTE_V2_PER_LANE}>")
}

/// The routing with the shared expert's gate row in the same launch (`route_gate.rs`), for
/// the split-K matmul's wide float blocks.
pub(crate) fn route_gate_kernel(block: &str) -> String {
    format!("moe_route_gate_kernel<{ROUTE_V2_PER_LANE}, {block}, {MATMUL_SPLITK_WARPS}>")
}

/// The fused decode router and routing (`router_topk.rs`).
pub(crate) fn router_topk_kernel() -> String {
    format!("router_topk_kernel<{ROUTE_V2_PER_LANE}, {MATMUL_SPLITK_WARPS}>")
}

/// Warps (rows) per CTA of the version-3 expert matvecs.
pub(crate) const MOE_V3_WARPS: u32 = 8;

pub(crate) fn moe_gate_up_v3_kernel(kind: WeightKind) -> String {
    format!("moe_gate_up_v3_kernel<{}, {MOE_V3_WARPS}>", kind.cuda_name)
}

pub(crate) fn moe_down_v3_kernel(kind: WeightKind) -> String {
    format!("moe_down_v3_kernel<{}, {MOE_V3_WARPS}>", kind.cuda_name)
}

pub(crate) fn conv_kernel(width: usize) -> String {
    format!("conv_silu_kernel<{width}>")
}

pub(crate) fn conv_tokens_kernel(width: usize) -> String {
    format!("conv_silu_tokens_kernel<{width}>")
}

pub(crate) fn delta_chunked_kernel(dk: usize) -> String {
    format!("delta_chunked_kernel<{dk}, {DELTA_CHUNK}>")
}

/// Dynamic shared memory of `delta_chunked_kernel<dk, DELTA_CHUNK>`
/// (`delta_chunked_shared_floats` there): k and q rows padded to dk + 4, the state columns,
/// the two Gram matrices, Δ rows padded to 36 and four per-row vectors.
pub(crate) const fn delta_chunked_shared_bytes(dk: usize) -> usize {
    let (chunk, cols) = (DELTA_CHUNK, DELTA_CHUNK_COLS);
    4 * (2 * chunk * (dk + 4) + dk * cols + 2 * chunk * chunk + chunk * (cols + 4) + 4 * chunk)
}

pub(crate) fn delta_rule_kernel(dk: usize) -> String {
    format!("delta_rule_kernel<{dk}, {DELTA_COLS}>")
}

pub(crate) fn deltanet_step_kernel(dk: usize, width: usize, group: usize) -> String {
    format!("deltanet_step_kernel<{dk}, {width}, {group}>")
}

pub(crate) fn deltanet_replay_kernel(dk: usize) -> String {
    format!("deltanet_replay_kernel<{dk}>")
}

pub(crate) fn gated_norm_kernel() -> String {
    format!("gated_norm_kernel<{LAYER_WARPS}>")
}

pub(crate) fn attn_prep_kernel(kv: &str) -> String {
    format!("attn_prep_kernel<{kv}>")
}

pub(crate) fn attention_kernel(kv: &str, head_dim: usize) -> String {
    format!(
        "attention_kernel<{kv}, {}, {ATTENTION_WARPS}>",
        head_dim / 32
    )
}

/// Query heads of one KV head per CTA the grouped split kernel is built for.
pub(crate) const ATTENTION_HEADS_PER_CTA: [usize; 3] = [2, 4, 8];

/// Warps per CTA the grouped split kernel is built for (`REDLITE_ATTN_SPLIT_WARPS`; the first
/// is the default, `ATTENTION_WARPS`).
pub(crate) const ATTENTION_SPLIT_WARPS: [u32; 2] = [ATTENTION_WARPS, 8];

pub(crate) fn attention_split_heads_kernel(
    kv: &str,
    head_dim: usize,
    hpc: usize,
    warps: u32,
) -> String {
    format!(
        "attention_split_heads_kernel<{kv}, {}, {warps}, {hpc}>",
        head_dim / 32
    )
}

/// The split kernel choosing four or eight query heads a CTA by each token's length
/// (`REDLITE_ATTN_LONG_FROM`), 8 warps.
pub(crate) fn attention_split_depth_kernel(kv: &str, head_dim: usize) -> String {
    format!("attention_split_depth_kernel<{kv}, {}>", head_dim / 32)
}

pub(crate) fn attention_split_kernel(kv: &str, head_dim: usize) -> String {
    format!(
        "attention_split_kernel<{kv}, {}, {ATTENTION_WARPS}>",
        head_dim / 32
    )
}

pub(crate) const ATTENTION_COMBINE_KERNEL: &str = "attention_combine_kernel";
pub(crate) const ATTENTION_COMBINE_AHEAD_KERNEL: &str = "attention_combine_ahead_kernel";

/// Warps per CTA, query rows per CTA (8 per warp) and cache positions per shared-memory tile
/// of the flash prefill kernel (`PREFILL_*` in `attention_prefill.cu`).
pub(crate) const PREFILL_WARPS: u32 = 8;
pub(crate) const PREFILL_ROWS: usize = 64;
pub(crate) const PREFILL_BK: usize = 64;

/// Dynamic shared memory of the flash prefill kernel (`prefill_shared_floats` there): q rows,
/// K rows padded by 4 floats, V rows, and each warp's probabilities.
pub(crate) const fn prefill_shared_bytes(head_dim: usize) -> usize {
    let floats = PREFILL_ROWS * head_dim
        + PREFILL_BK * (head_dim + 4)
        + PREFILL_BK * head_dim
        + PREFILL_WARPS as usize * PREFILL_BK * (PREFILL_ROWS / PREFILL_WARPS as usize);
    floats * 4
}

pub(crate) fn attention_prefill_kernel(kv: &str, head_dim: usize) -> String {
    format!("attention_prefill_kernel<{kv}, {head_dim}>")
}
