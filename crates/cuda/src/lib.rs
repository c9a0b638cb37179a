//! CUDA backend. Compiled only when the `cuda` feature of the `redlite` binary is on.
//!
//! The CUDA libraries are loaded at run time (cudarc's dynamic loading, CUDA 13 API):
//! building needs no toolkit, and [`Device::open`] answers [`CudaError::NoDriver`] or
//! [`CudaError::NoNvrtc`] on a machine without them, so callers fall back to the CPU.
//!
//! Kernels are `.cu` files under `kernels/`, embedded in the binary, prefixed with
//! `common.cuh`, the IQ tables generated from `redlite_quant::tables` and `blocks.cuh`,
//! and compiled by NVRTC for the device's architecture into a CUBIN cached on disk
//! ([`cache_dir`]), keyed by source, architecture, options and NVRTC version.
//!
//! Every kernel comes in three layers: a templated `__global__` kernel (`kernels/`), a
//! launcher that sizes the grid and picks the specialization (`launch`), and an op entry
//! that validates shapes (`ops`). All `unsafe` code is in `raw`.
//!
//! Ops: [`dequantize`] and [`matvec`] (y = W·x, f32 activation) for F32, F16,
//! Q8_0, Q2_K, Q4_K, Q5_K, Q6_K, IQ2_XXS, IQ2_XS and IQ1_M weights; and the qwen3next
//! layer ops (`layer_ops`): embedding gather, RMSNorm, add, batched matmul, the DeltaNet
//! steps (conv, q/k norm and gates, the recurrent delta rule, gated norm), attention
//! (q/k norm + RoPE + KV write, attention over the cache with the output gate) and the
//! MoE (`moe_ops`: routing on the GPU, fused gate/up SwiGLU, fused down + weighted sum). Products of
//! several tokens take int8 tensor-core kernels where they cover the matrix (`mma`:
//! [`matmul_mma`], and the routed experts grouped by expert, [`moe_gate_up_mma`] and
//! [`moe_down_mma`] over [`MmaTiles`]).

mod attention_ops;
mod attention_prefill;
mod cache;
mod compile;
mod copies;
mod cublas;
mod deltanet_launch;
mod deltanet_replay;
mod device;
mod error;
mod expert_cache;
mod graph;
mod greedy;
mod host_stage;
mod launch;
mod layer_launch;
mod layer_ops;
mod matmul_launch;
mod mma;
mod mma_groups;
mod moe_cached;
mod moe_groups;
mod moe_launch;
mod moe_ops;
mod moe_pairs;
mod ops;
mod profile;
mod q8_input;
mod raw;
mod route_gate;
mod route_skew;
mod router_topk;
mod source;
mod switch;
mod tables;
mod timeline;

pub use attention_ops::{
    attention, attention_max_splits, attention_on, attention_partials_len, attention_prep,
    AttentionKernels, AttentionShape, KvElement, Position,
};
pub use attention_prefill::FLASH_PREFILL_MIN_TOKENS;
pub use cache::cache_dir;
pub use compile::{check_arch, compile_all, nvrtc_version, KernelResources, ModuleCompiled};
pub use copies::copy_spans;
pub use cublas::{cublas_min_tokens, cublas_takes, matmul_cublas};
pub use cudarc::driver::{CudaSlice, CudaStream, CudaView, CudaViewMut};
pub use deltanet_launch::{DELTANET_ROW_GROUPS, DELTANET_WHOLE_GROUP};
pub use deltanet_replay::{deltanet_replay, ReplayLayer, ReplayTable};
pub use device::Device;
pub use error::{CudaError, CudaOp};
pub use expert_cache::{
    expert_cache_fill, expert_cache_lookup, CacheCounts, CachePolicy, CacheTables, FillTarget,
    LookupKind, MappedHost, CACHE_MAX_EXPERTS,
};
pub use graph::Graph;
pub use greedy::{
    argmax, argmax_rows, argmax_rows_queued, ids_of_keys, token_of_key, MAX_ARGMAX_ROWS,
};
pub use host_stage::{row_pieces, HostStage};
pub use layer_launch::COMBINE_AHEAD;
pub use layer_ops::{
    add, add_rms_norm, delta_rule, deltanet_conv, deltanet_prep, deltanet_split, deltanet_step,
    embed, gated_norm, matmul, matmul_quantized, matmul_with, mtp_concat_norms, replay_row_floats,
    rms_norm, DeltaNetParams, DeltaNetShape, StepRecord, StepStates, TokenWalk,
};
pub use mma::{
    matmul_mma, mma_min_tokens, mma_takes, moe_down_mma, moe_down_mma_combine, moe_down_mma_pairs,
    moe_gate_up_mma, PrefillKernels, MMA_MIN_ROWS,
};
pub use mma_groups::{MmaGroups, MmaTiles, MMA_TILE};
pub use moe_cached::{moe_gate_up_cached, moe_gate_up_cached_takes, CacheCopies};
pub use moe_groups::{moe_gate_up_grouped, ExpertTiles, GROUP_TILE};
pub use moe_launch::with_preload;
pub use moe_ops::{moe_down, moe_folds_shared, moe_gate_up, moe_route, SharedDown, SharedGateUp};
pub use moe_pairs::{moe_combine, SKIP_PAIR};
pub use ops::{dequantize, matvec, Dots, WeightMatrix};
pub use profile::{components_on, enable_components, profiling, take_components, ComponentTime};
pub use q8_input::{
    add_rms_norm_quantized, rms_norm_quantized, Q8Rows, Q8RowsMut, Q8_BLOCK_VALUES,
};
pub use route_gate::{moe_route_gate, moe_route_gate_takes};
pub use route_skew::{moe_route_skew, skew_permutation, RouteSkew};
pub use router_topk::{router_topk, router_topk_takes};
pub use source::{
    modules, weight_kind, ModuleSource, WeightKind, MMA_TYPES, ONE_TOKEN_KERNELS_MAX_TOKENS,
    Q8_DOT_TYPES, SMALL_BATCH_MAX_TOKENS, WEIGHT_KINDS,
};
pub use switch::Switch;

/// Whether this build carries the CUDA backend at all.
pub const BUILT_WITH_CUDA: bool = true;
