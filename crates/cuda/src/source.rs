//! The kernel modules: their `.cu` sources (embedded), the generated tables prepended, and
//! the template instantiations each one exports (NVRTC name expressions).

use crate::tables::tables_header;
use redlite_gguf::GgmlType;

const COMMON: &str = include_str!("../kernels/common.cuh");
const BLOCKS: &str = include_str!("../kernels/blocks.cuh");
const DEQUANTIZE: &str = include_str!("../kernels/dequantize.cu");
const MATVEC: &str = include_str!("../kernels/matvec.cu");
const REDUCE: &str = include_str!("../kernels/reduce.cuh");
const ELEMENTWISE: &str = include_str!("../kernels/elementwise.cu");
const MATMUL: &str = include_str!("../kernels/matmul.cu");
const GEMM: &str = include_str!("../kernels/gemm.cu");
const DELTANET: &str = include_str!("../kernels/deltanet.cu");
const DELTANET_CHUNKED: &str = include_str!("../kernels/deltanet_chunked.cu");
const ATTENTION: &str = include_str!("../kernels/attention.cu");
const ATTENTION_PREFILL: &str = include_str!("../kernels/attention_prefill.cu");
const MOE: &str = include_str!("../kernels/moe.cu");
const MOE_ROUTE: &str = include_str!("../kernels/moe_route.cu");
const MOE_DECODE: &str = include_str!("../kernels/moe_decode.cu");
const Q8DOT: &str = include_str!("../kernels/q8dot.cuh");
const EXPERT_COPY: &str = include_str!("../kernels/expert_copy.cuh");
const EXPERT_CACHE: &str = include_str!("../kernels/expert_cache.cu");
const MOE_CACHED: &str = include_str!("../kernels/moe_cached.cu");

/// Greedy sampling on the device (`elementwise.cu`, `greedy.rs`), and its values a thread.
pub(crate) const ARGMAX_KERNEL: &str = "argmax_kernel";
pub(crate) const IDS_OF_KEYS_KERNEL: &str = "ids_of_keys_kernel";
pub(crate) const ARGMAX_PER_THREAD: usize = 8;

/// The weighted sum of per-pair expert outputs (`moe.cu`).
pub(crate) const MOE_COMBINE_KERNEL: &str = "moe_combine_kernel";
/// The GPU expert cache's kernels (`expert_cache.cu`).
pub(crate) const EXPERT_CACHE_LOOKUP: &str = "expert_cache_lookup_kernel";
pub(crate) const EXPERT_CACHE_FILL: &str = "expert_cache_fill_kernel";
/// The benchmark-only skewed routing (`moe_route.cu`, `route_skew.rs`).
pub(crate) const MOE_ROUTE_SKEW_KERNEL: &str = "moe_route_skew_kernel";
const MMA_DECODE: &str = include_str!("../kernels/mma_decode.cuh");
const MMA: &str = include_str!("../kernels/mma.cu");

/// A weight type the kernels decode: its GGUF type, the struct in `blocks.cuh`, and the
/// number of thread items per block (`ITEMS` there).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct WeightKind {
    pub ty: GgmlType,
    pub cuda_name: &'static str,
    pub items_per_block: usize,
}

const fn kind(ty: GgmlType, cuda_name: &'static str, items_per_block: usize) -> WeightKind {
    WeightKind {
        ty,
        cuda_name,
        items_per_block,
    }
}

/// Every weight type with a dequantize and a matvec kernel.
pub const WEIGHT_KINDS: [WeightKind; 10] = [
    kind(GgmlType::F32, "F32", 1),
    kind(GgmlType::F16, "F16", 1),
    kind(GgmlType::Q8_0, "Q8_0", 4),
    kind(GgmlType::Q2K, "Q2K", 16),
    kind(GgmlType::Q4K, "Q4K", 8),
    kind(GgmlType::Q5K, "Q5K", 8),
    kind(GgmlType::Q6K, "Q6K", 8),
    kind(GgmlType::IQ2XXS, "IQ2XXS", 8),
    kind(GgmlType::IQ2XS, "IQ2XS", 8),
    kind(GgmlType::IQ1M, "IQ1M", 8),
];

pub fn weight_kind(ty: GgmlType) -> Option<WeightKind> {
    WEIGHT_KINDS.iter().copied().find(|k| k.ty == ty)
}

/// The weight types with integer dots against Q8_K activations (`Q8Dot` in `q8dot.cuh`):
/// those whose CPU dot type is Q8_K.
pub const Q8_DOT_TYPES: [GgmlType; 7] = [
    GgmlType::Q2K,
    GgmlType::Q4K,
    GgmlType::Q5K,
    GgmlType::Q6K,
    GgmlType::IQ2XXS,
    GgmlType::IQ2XS,
    GgmlType::IQ1M,
];

/// The weight types with an int8 tensor-core product (`MmaDecode` in `mma_decode.cuh`):
/// every type with q8 dots (all have 256-value blocks, one Q8_K scale per block).
pub const MMA_TYPES: [GgmlType; 7] = Q8_DOT_TYPES;

/// Warps (WM x WN) and fragments per warp (FM x FN, 16 rows x 8 tokens each) of one
/// `mma_matmul_kernel` specialization, and its weight matrices (2: gate and up, SwiGLU).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct MmaShape {
    pub warps_m: usize,
    pub warps_n: usize,
    pub frags_m: usize,
    pub frags_n: usize,
    pub mats: usize,
}

impl MmaShape {
    /// Weight rows per CTA.
    pub const fn rows(self) -> usize {
        self.warps_m * self.frags_m * 16
    }

    /// Tokens (or expert pairs) per CTA.
    pub const fn tokens(self) -> usize {
        self.warps_n * self.frags_n * 8
    }

    pub const fn threads(self) -> u32 {
        (self.warps_m * self.warps_n * 32) as u32
    }

    /// Dynamic shared memory (`mma_shared_bytes` in `mma.cu`).
    pub const fn shared_bytes(self) -> usize {
        // MMA_ROW_BYTES and MMA_SCALES of mma.cu.
        const ROW: usize = 272;
        const SCALES: usize = 17;
        let (mt, nt) = (self.rows(), self.tokens());
        self.mats * mt * ROW
            + nt * ROW
            + 2 * self.mats * mt * SCALES * 4
            + nt * SCALES * 4
            + 3 * nt * 4
    }
}

const fn mma_shape(
    warps_m: usize,
    warps_n: usize,
    frags_m: usize,
    frags_n: usize,
    mats: usize,
) -> MmaShape {
    MmaShape {
        warps_m,
        warps_n,
        frags_m,
        frags_n,
        mats,
    }
}

/// Dense prompt projections: 128 rows x 64 tokens per CTA, 8 warps of 32 x 32.
pub(crate) const MMA_DENSE: MmaShape = mma_shape(4, 2, 2, 4, 1);
/// Expert gate/up: an expert has ~10 pairs at pp512, so 16 pairs per tile, 64 rows of gate
/// and of up per CTA (the shared-memory codes of both).
pub(crate) const MMA_GATE_UP: MmaShape = mma_shape(4, 1, 1, 2, 2);
/// Expert down: 128 rows x 16 pairs.
pub(crate) const MMA_DOWN: MmaShape = mma_shape(4, 1, 2, 2, 1);
/// Wide expert tiles for long prompts (pp2048: ~40 pairs per expert): 64 pairs per tile, so
/// each expert's weights are decoded once per 64 pairs instead of per 16. Gate/up: 64 rows of
/// each; down: the dense shape (128 rows x 64).
pub(crate) const MMA_GATE_UP_WIDE: MmaShape = mma_shape(4, 2, 1, 4, 2);
pub(crate) const MMA_DOWN_WIDE: MmaShape = MMA_DENSE;
const MMA_SHAPES: [MmaShape; 4] = [MMA_DENSE, MMA_GATE_UP, MMA_DOWN, MMA_GATE_UP_WIDE];

pub(crate) fn mma_matmul_kernel(kind: WeightKind, s: MmaShape) -> String {
    format!(
        "mma_matmul_kernel<{}, {}, {}, {}, {}, {}>",
        kind.cuda_name, s.warps_m, s.warps_n, s.frags_m, s.frags_n, s.mats
    )
}

pub(crate) const MMA_QUANTIZE_KERNEL: &str = "mma_quantize_kernel";
pub(crate) const MMA_COMBINE_KERNEL: &str = "mma_combine_kernel";
pub(crate) const MMA_GROUP_KERNEL: &str = "mma_group_kernel";

fn q8_kinds() -> impl Iterator<Item = WeightKind> {
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
/// Most KV-length splits of the flash-decoding attention (per token and head).
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

/// The token tiles for a small batch: exactly `tokens` tokens per CTA and one row per warp
/// (each warp then does `tokens` dots per weight item, the work of a few rows of one token).
pub(crate) fn matmul_q8_small_kernel(kind: WeightKind, tokens: usize) -> String {
    format!(
        "matmul_q8_tiles_kernel<{}, {MATMUL_V2_WARPS}, 1, {tokens}>",
        kind.cuda_name
    )
}

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

/// Rows per lane group the q8 expert matvecs are built for.
pub(crate) const MOE_Q8_ROWS: [usize; 3] = [1, 2, 4];

pub(crate) fn moe_gate_up_q8_kernel(kind: WeightKind, lanes: usize, rows: usize) -> String {
    format!(
        "moe_gate_up_q8_kernel<{}, {LAYER_WARPS}, {lanes}, {rows}>",
        kind.cuda_name
    )
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

/// `early`: the ids and weights loaded before the PDL wait (resident experts; `moe_decode.cu`).
pub(crate) fn moe_down_q8_preload_kernel(
    kind: WeightKind,
    lanes: usize,
    items: usize,
    early: bool,
) -> String {
    format!(
        "moe_down_q8_preload_kernel<{}, {LAYER_WARPS}, {lanes}, {items}, {early}>",
        kind.cuda_name
    )
}

/// The `early` variants of the preloading down that are built: both unless `REDLITE_PDL=0`.
fn preload_early_variants() -> &'static [bool] {
    match crate::raw::pdl_requested() {
        true => &[false, true],
        false => &[false],
    }
}

/// The block structs the version-2 matmul is instantiated for.
fn matmul_v2_blocks() -> Vec<&'static str> {
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

/// The fused decode router and routing (`router_topk.rs`), for a shared-expert gate row in
/// the split-K matmul's wide float block `gate_block`.
pub(crate) fn router_topk_kernel(gate_block: &str) -> String {
    format!("router_topk_kernel<{ROUTE_V2_PER_LANE}, {MATMUL_SPLITK_WARPS}, {gate_block}>")
}

/// [`router_topk_kernel`] with the post-mixer add + norm before it in the same launch.
pub(crate) fn router_topk_norm_kernel(gate_block: &str) -> String {
    format!("router_topk_norm_kernel<{ROUTE_V2_PER_LANE}, {MATMUL_SPLITK_WARPS}, {gate_block}>")
}

/// Threads of the CTA whose norm `router_topk_norm_kernel` reproduces (`ROUTER_NORM_THREADS`
/// in `moe_route.cu`): the quantizing norms' launch (`layer_launch::ROW_THREADS`).
pub(crate) const ROUTER_NORM_THREADS: usize = 256;
/// Float4 chunks a thread of that norm keeps (`ROUTER_NORM_CHUNKS`, norm_row's `NORM_CHUNKS`).
pub(crate) const ROUTER_NORM_CHUNKS: usize = 4;

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

pub(crate) fn deltanet_step_kernel(dk: usize, width: usize) -> String {
    format!("deltanet_step_kernel<{dk}, {width}>")
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

pub(crate) fn attention_split_kernel(kv: &str, head_dim: usize) -> String {
    format!(
        "attention_split_kernel<{kv}, {}, {ATTENTION_WARPS}>",
        head_dim / 32
    )
}

pub(crate) const ATTENTION_COMBINE_KERNEL: &str = "attention_combine_kernel";

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

/// One NVRTC program: its full source and the kernels (name expressions) it exports.
pub struct ModuleSource {
    pub name: String,
    pub source: String,
    pub kernels: Vec<String>,
}

fn with_prelude(body: &str) -> String {
    [COMMON, &tables_header(), BLOCKS, body].join("\n")
}

fn with_reduce(body: &str) -> String {
    with_prelude(&[REDUCE, body].join("\n"))
}

/// The prelude, the reductions and the Q8_K integer dots.
fn with_q8_dots(body: &str) -> String {
    with_prelude(&[REDUCE, Q8DOT, body].join("\n"))
}

/// Kernels per compiled module at most: NVRTC's time grows with the template instances it
/// emits, so a large family (the q8 MoE kernels: over a minute alone) is split into modules
/// of the same source, each instantiating a share of it, compiled side by side.
const KERNELS_PER_MODULE: usize = 12;

/// Every kernel module of the crate, the large ones split (see [`KERNELS_PER_MODULE`]).
pub fn modules() -> Vec<ModuleSource> {
    let mut split = Vec::new();
    let probe = probe_exit();
    for mut module in module_families() {
        if probe & probed_families(&module.name) != 0 {
            module.source = format!("#define REDLITE_PROBE_EXIT {probe}\n{}", module.source);
        }
        if module.kernels.len() <= KERNELS_PER_MODULE {
            split.push(module);
            continue;
        }
        let shards = module.kernels.len().div_ceil(KERNELS_PER_MODULE);
        // Interleaved, so each shard gets a mix of the family's cheap and costly kernels.
        for shard in 0..shards {
            split.push(ModuleSource {
                name: format!("{}.{shard}", module.name),
                source: module.source.clone(),
                kernels: module
                    .kernels
                    .iter()
                    .skip(shard)
                    .step_by(shards)
                    .cloned()
                    .collect(),
            });
        }
    }
    split
}

/// Measurement probe, `REDLITE_PROBE_EXIT=MASK` (wrong results on purpose): the kernels of
/// the families in MASK return at once, their launches kept (`PROBE_*` in `common.cuh`: 1
/// dense q8 products, 2 expert gate/up, 4 expert down, 8 DeltaNet step, 16 quantizing norms,
/// 32 split-K float products, 64 routing with the gate row, 128 attention decode; parts of
/// kernels: 256 the expert down's input quantization, 512 the routing's ids read by the
/// expert kernels), so that a benchmark shows what their work costs a decode step. Only the
/// probed families' sources change, so only they are compiled again.
fn probe_exit() -> u32 {
    std::env::var("REDLITE_PROBE_EXIT")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(0)
}

/// The probe bits whose kernels are in family `name`.
fn probed_families(name: &str) -> u32 {
    match name {
        "matmul" => 1 | 32,
        "moe" => 2 | 4 | 64 | 256 | 512,
        "deltanet" => 8,
        "elementwise" => 16,
        "attention" => 128,
        _ => 0,
    }
}

/// The kernel modules by family, one source each.
fn module_families() -> Vec<ModuleSource> {
    vec![
        ModuleSource {
            name: "dequantize".to_string(),
            source: with_prelude(DEQUANTIZE),
            kernels: WEIGHT_KINDS
                .iter()
                .flat_map(|&k| [dequantize_kernel(k), dequantize_f16_kernel(k)])
                .chain([TO_F16_KERNEL.to_string()])
                .collect(),
        },
        ModuleSource {
            name: "matvec".to_string(),
            source: with_prelude(MATVEC),
            kernels: WEIGHT_KINDS
                .iter()
                .flat_map(|&k| [matvec_kernel(k, true), matvec_kernel(k, false)])
                .collect(),
        },
        ModuleSource {
            name: "elementwise".to_string(),
            source: with_q8_dots(ELEMENTWISE),
            kernels: WEIGHT_KINDS
                .iter()
                .map(|&k| embed_kernel(k))
                .chain(
                    [
                        "rms_norm_kernel",
                        "add_kernel",
                        "add_rms_norm_kernel",
                        "rms_norm_q8_kernel",
                        "add_rms_norm_q8_kernel",
                        ARGMAX_KERNEL,
                        IDS_OF_KEYS_KERNEL,
                    ]
                    .map(String::from),
                )
                .collect(),
        },
        ModuleSource {
            name: "matmul".to_string(),
            source: with_q8_dots(MATMUL),
            kernels: WEIGHT_KINDS
                .iter()
                .flat_map(|&k| [matmul_kernel(k, true), matmul_kernel(k, false)])
                .chain(matmul_v2_blocks().into_iter().flat_map(|block| {
                    MATMUL_V2_ROWS.iter().flat_map(move |&rows| {
                        [true, false].map(|shared| matmul_v2_kernel(block, rows, shared))
                    })
                }))
                .chain(q8_kinds().flat_map(|k| {
                    MATMUL_V2_ROWS
                        .iter()
                        .map(move |&rows| matmul_q8_kernel(k, rows))
                }))
                .chain(
                    matmul_v2_blocks()
                        .into_iter()
                        .map(|block| matmul_splitk_kernel(block, false)),
                )
                .chain(q8_kinds().map(|k| matmul_splitk_kernel(k.cuda_name, true)))
                .chain(q8_kinds().map(matmul_q8_tiles_kernel))
                .chain(q8_kinds().flat_map(|kind| {
                    (2..=SMALL_BATCH_MAX_TOKENS).map(move |t| matmul_q8_small_kernel(kind, t))
                }))
                .collect(),
        },
        ModuleSource {
            name: "gemm".to_string(),
            source: [COMMON, GEMM].join("\n"),
            kernels: [GgmlType::F32, GgmlType::F16]
                .into_iter()
                .flat_map(|ty| GEMM_TILES.map(|tile| gemm_float_kernel(ty, tile)))
                .flatten()
                .collect(),
        },
        ModuleSource {
            name: "moe".to_string(),
            source: with_q8_dots(&[MOE, MOE_DECODE, MOE_ROUTE].join("\n")),
            kernels: WEIGHT_KINDS
                .iter()
                .flat_map(|&k| [moe_gate_up_kernel(k), moe_down_kernel(k)])
                .chain(WEIGHT_KINDS.iter().flat_map(|&k| {
                    MOE_LANES.iter().flat_map(move |&lanes| {
                        [
                            moe_gate_up_v2_kernel(k, lanes),
                            moe_down_v2_kernel(k, lanes),
                        ]
                    })
                }))
                .chain(
                    WEIGHT_KINDS
                        .iter()
                        .flat_map(|&k| [moe_gate_up_v3_kernel(k), moe_down_v3_kernel(k)]),
                )
                .chain(q8_kinds().flat_map(|k| {
                    MOE_LANES.iter().flat_map(move |&lanes| {
                        MOE_Q8_ROWS.iter().flat_map(move |&rows| {
                            [
                                moe_gate_up_q8_kernel(k, lanes, rows),
                                moe_down_q8_kernel(k, lanes, rows),
                            ]
                        })
                    })
                }))
                .chain(q8_kinds().flat_map(|k| {
                    MOE_LANES
                        .iter()
                        .map(move |&lanes| moe_gate_up_q8_grouped_kernel(k, lanes))
                }))
                .chain(q8_kinds().flat_map(|k| {
                    MOE_LANES.iter().flat_map(move |&lanes| {
                        MOE_PRELOAD_ITEMS.iter().flat_map(move |&items| {
                            preload_early_variants().iter().map(move |&early| {
                                moe_down_q8_preload_kernel(k, lanes, items, early)
                            })
                        })
                    })
                }))
                .chain([
                    "moe_route_kernel".to_string(),
                    route_v2_kernel(),
                    route_gate_kernel(WIDE_F32.0),
                    route_gate_kernel(WIDE_F16.0),
                    router_topk_kernel(WIDE_F32.0),
                    router_topk_kernel(WIDE_F16.0),
                    router_topk_norm_kernel(WIDE_F32.0),
                    router_topk_norm_kernel(WIDE_F16.0),
                    MOE_ROUTE_SKEW_KERNEL.to_string(),
                    MOE_COMBINE_KERNEL.to_string(),
                ])
                .collect(),
        },
        ModuleSource {
            name: "mma".to_string(),
            source: with_q8_dots(&[MMA_DECODE, MMA].join("\n")),
            kernels: WEIGHT_KINDS
                .into_iter()
                .filter(|k| MMA_TYPES.contains(&k.ty))
                .flat_map(|k| MMA_SHAPES.map(|s| mma_matmul_kernel(k, s)))
                .chain(
                    [MMA_QUANTIZE_KERNEL, MMA_COMBINE_KERNEL, MMA_GROUP_KERNEL].map(String::from),
                )
                .collect(),
        },
        ModuleSource {
            name: "deltanet".to_string(),
            source: with_q8_dots(&[DELTANET, DELTANET_CHUNKED].join("\n")),
            kernels: CONV_KERNELS
                .iter()
                .flat_map(|&w| [conv_kernel(w), conv_tokens_kernel(w)])
                .chain(DELTA_DK.iter().map(|&dk| delta_rule_kernel(dk)))
                .chain(DELTA_DK.iter().map(|&dk| delta_chunked_kernel(dk)))
                .chain(DELTA_DK.iter().flat_map(|&dk| {
                    CONV_KERNELS
                        .iter()
                        .map(move |&w| deltanet_step_kernel(dk, w))
                }))
                .chain([
                    "deltanet_split_kernel".to_string(),
                    "deltanet_prep_kernel".to_string(),
                    gated_norm_kernel(),
                ])
                .collect(),
        },
        ModuleSource {
            name: "attention".to_string(),
            source: with_reduce(&[ATTENTION, ATTENTION_PREFILL].join("\n")),
            kernels: KV_CUDA_TYPES
                .iter()
                .flat_map(|&kv| {
                    std::iter::once(attn_prep_kernel(kv)).chain(
                        ATTENTION_HEAD_DIMS.iter().flat_map(move |&hd| {
                            [
                                attention_kernel(kv, hd),
                                attention_split_kernel(kv, hd),
                                attention_prefill_kernel(kv, hd),
                            ]
                            .into_iter()
                            .chain(
                                ATTENTION_HEADS_PER_CTA.iter().flat_map(move |&hpc| {
                                    ATTENTION_SPLIT_WARPS.map(|warps| {
                                        attention_split_heads_kernel(kv, hd, hpc, warps)
                                    })
                                }),
                            )
                        }),
                    )
                })
                .chain([ATTENTION_COMBINE_KERNEL.to_string()])
                .collect(),
        },
        ModuleSource {
            name: "expert_cache".to_string(),
            source: [COMMON, EXPERT_COPY, EXPERT_CACHE].join("\n"),
            kernels: vec![EXPERT_CACHE_LOOKUP.into(), EXPERT_CACHE_FILL.into()],
        },
        ModuleSource {
            name: "moe_cached".to_string(),
            source: with_q8_dots(&[MOE, EXPERT_COPY, MOE_CACHED].join("\n")),
            kernels: q8_kinds()
                .flat_map(|k| {
                    MOE_LANES.iter().flat_map(move |&lanes| {
                        MOE_Q8_ROWS
                            .iter()
                            .map(move |&rows| moe_gate_up_q8_cached_kernel(k, lanes, rows))
                    })
                })
                .collect(),
        },
    ]
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn split_modules_keep_every_kernel_once() {
        let mut families: Vec<String> = module_families()
            .into_iter()
            .flat_map(|m| m.kernels)
            .collect();
        let mut split: Vec<String> = modules().into_iter().flat_map(|m| m.kernels).collect();
        for module in modules() {
            let count = module.kernels.len();
            assert!(
                (1..=KERNELS_PER_MODULE).contains(&count),
                "{}: {count}",
                module.name
            );
        }
        families.sort();
        split.sort();
        assert_eq!(families, split);
    }

    /// The argmax launch sizes its grid by the kernel's values a thread.
    #[test]
    fn the_argmax_grid_matches_the_kernel() {
        let define = format!("#define ARGMAX_PER_THREAD {ARGMAX_PER_THREAD}\n");
        assert!(
            ELEMENTWISE.contains(&define),
            "elementwise.cu lacks {define:?}"
        );
    }

    /// The router's own norm reproduces the quantizing norms' launch: its thread count and
    /// chunks a thread must be theirs, or its bits would not be the norm's.
    #[test]
    fn the_router_norm_plays_the_norm_kernels_threads() {
        assert_eq!(
            ROUTER_NORM_THREADS,
            crate::layer_launch::ROW_THREADS as usize
        );
        for define in [
            format!("#define ROUTER_NORM_THREADS {ROUTER_NORM_THREADS}\n"),
            format!("#define ROUTER_NORM_CHUNKS {ROUTER_NORM_CHUNKS} "),
        ] {
            assert!(MOE_ROUTE.contains(&define), "moe_route.cu lacks {define:?}");
        }
        let norm = format!("#define NORM_CHUNKS {ROUTER_NORM_CHUNKS}\n");
        assert!(ELEMENTWISE.contains(&norm), "elementwise.cu lacks {norm:?}");
        assert_eq!(2 * MATMUL_SPLITK_WARPS as usize * 32, ROUTER_NORM_THREADS);
    }

    /// Every kernel launched with the PDL attribute (`raw/launcher.rs`) must wait in
    /// `pdl_begin` before it reads another kernel's output: each `__global__` body calls it
    /// (the norm kernels through `norm_row`, which does).
    #[test]
    fn every_kernel_waits_for_the_previous_one() {
        let sources = [
            DEQUANTIZE,
            MATVEC,
            ELEMENTWISE,
            MATMUL,
            GEMM,
            DELTANET,
            DELTANET_CHUNKED,
            ATTENTION,
            ATTENTION_PREFILL,
            MOE,
            MOE_ROUTE,
            MOE_DECODE,
            EXPERT_CACHE,
            MOE_CACHED,
            MMA,
        ];
        for source in sources {
            for kernel in source.split("__global__").skip(1) {
                let name = kernel.split('(').next().unwrap_or(kernel).trim();
                assert!(
                    kernel.contains("pdl_begin();") || kernel.contains("norm_row"),
                    "{name}: no pdl_begin()"
                );
            }
        }
    }

    #[test]
    fn kinds_agree_with_gguf_block_geometry() {
        for kind in WEIGHT_KINDS {
            let values = kind.ty.block_values();
            assert!(values.is_multiple_of(kind.items_per_block), "{:?}", kind.ty);
            let needle = format!("struct {} ", kind.cuda_name);
            let typedef = format!("> {};", kind.cuda_name);
            assert!(
                BLOCKS.contains(&needle) || BLOCKS.contains(&typedef),
                "{} missing from blocks.cuh",
                kind.cuda_name
            );
        }
    }
}
