//! The kernel modules: their `.cu` sources (embedded), the generated tables prepended, and
//! the template instantiations each one exports (NVRTC name expressions).

mod kinds;
mod names;

pub use kinds::*;
pub use names::*;

use crate::tables::tables_header;
use redlite_gguf::GgmlType;

const COMMON: &str = include_str!("../../kernels/common.cuh");
const BLOCKS: &str = include_str!("../../kernels/blocks.cuh");
const DEQUANTIZE: &str = include_str!("../../kernels/dequantize.cu");
const MATVEC: &str = include_str!("../../kernels/matvec.cu");
const REDUCE: &str = include_str!("../../kernels/reduce.cuh");
const ELEMENTWISE: &str = include_str!("../../kernels/elementwise.cu");
const MATMUL: &str = include_str!("../../kernels/matmul.cu");
const GEMM: &str = include_str!("../../kernels/gemm.cu");
const DELTANET: &str = include_str!("../../kernels/deltanet.cu");
const DELTANET_CHUNKED: &str = include_str!("../../kernels/deltanet_chunked.cu");
const DELTANET_REPLAY: &str = include_str!("../../kernels/deltanet_replay.cu");
const ATTENTION: &str = include_str!("../../kernels/attention.cu");
const ATTENTION_COMBINE: &str = include_str!("../../kernels/attention_combine.cu");
const ATTENTION_PREFILL: &str = include_str!("../../kernels/attention_prefill.cu");
const MOE: &str = include_str!("../../kernels/moe.cu");
const MOE_ROUTE: &str = include_str!("../../kernels/moe_route.cu");
const MOE_DECODE: &str = include_str!("../../kernels/moe_decode.cu");
const Q8DOT: &str = include_str!("../../kernels/q8dot.cuh");
const Q8DECODE: &str = include_str!("../../kernels/q8decode.cuh");
const EXPERT_COPY: &str = include_str!("../../kernels/expert_copy.cuh");
const EXPERT_CACHE: &str = include_str!("../../kernels/expert_cache.cu");
const MOE_CACHED: &str = include_str!("../../kernels/moe_cached.cu");
const MMA_DECODE: &str = include_str!("../../kernels/mma_decode.cuh");
const MMA: &str = include_str!("../../kernels/mma.cu");

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
    with_prelude(&[REDUCE, Q8DOT, Q8DECODE, body].join("\n"))
}

/// The head of the `moe_batch` module: the expert kernels for batches of two tokens or more
/// (an MTP verification, serving slots), built from the `moe` sources with the IQ2 codebooks
/// read from global memory whatever `REDLITE_Q8_SHARED_TABLES` says, and named apart
/// (`moe_gate_up_q8_batch_kernel`, `moe_down_q8_preload_batch_kernel`). On the H100
/// (fortieth session) the copies to shared memory made one token 3.5 % faster and batches of
/// 2-4 tokens 5-7 % slower: a batch's expert launches are several waves of CTAs, each paying
/// the copy and its barrier.
/// `shared`: the codebooks left where `REDLITE_Q8_SHARED_TABLES` puts them (the kernels of
/// `moe_batch_shared`: [`batch_gate_up_shared`]).
fn batch_tables_prefix(shared: bool) -> String {
    let tables = if shared {
        ""
    } else {
        "#undef REDLITE_Q8_SHARED_TABLES\n#define REDLITE_Q8_SHARED_TABLES 0\n"
    };
    format!(
        "{tables}#define REDLITE_MOE_BATCH 1\n\
         #define moe_gate_up_q8_kernel moe_gate_up_q8_batch_kernel\n\
         #define moe_down_q8_preload_kernel moe_down_q8_preload_batch_kernel\n"
    )
}

/// The batches' expert gate/up kernels are built in a module of their own
/// (`moe_batch_shared`) with the IQ2 codebooks copied to shared memory as one token's are, the
/// batches' down kernels still reading them from global memory; `REDLITE_BATCH_GATE_UP_SHARED=0`
/// (an A/B) keeps the gate/up in `moe_batch` on the global tables. A 4-row gate/up is three
/// waves of CTAs busy on codebook lookups (its L1 data pipe 66 % busy, fortieth session), and a
/// warp's lookups of a 2 KB global table touch up to 16 L1 lines where shared memory serves
/// them in a few wavefronts. With the sign masks computed (no sign table) the copies measured
/// faster: H100, forty-third session, MTP at 0.7 two drafts +0.7 %, three +1.6 %. The same bits
/// either way.
fn batch_gate_up_shared() -> bool {
    std::env::var("REDLITE_BATCH_GATE_UP_SHARED").as_deref() != Ok("0")
}

/// Whether batch kernel `name` (of `moe_q8_kernels(true)`) reads the codebooks from shared
/// memory, so is built in `moe_batch_shared` rather than `moe_batch`.
fn batch_kernel_shared(name: &str) -> bool {
    // The down on shared codebooks measured 5 % slower (forty-fourth session, docs/CUDA.md).
    name.starts_with("moe_gate_up") && batch_gate_up_shared()
}

/// The q8 expert gate/up and preloading down instances of the `moe` module (`batch`: false)
/// or of `moe_batch` (the down also folded: `moe_decode.cu`).
fn moe_q8_kernels(batch: bool) -> impl Iterator<Item = String> {
    let folds: &'static [usize] = if batch {
        &MOE_DOWN_FOLDS
    } else {
        &MOE_DOWN_FOLDS[..1]
    };
    q8_kinds().flat_map(move |k| {
        MOE_LANES.iter().flat_map(move |&lanes| {
            let gate_up = MOE_Q8_ROWS
                .iter()
                .map(move |&rows| moe_gate_up_q8_kernel(k, lanes, rows, batch));
            let down = MOE_PRELOAD_ITEMS.iter().flat_map(move |&items| {
                preload_early_variants().iter().flat_map(move |&early| {
                    folds.iter().map(move |&fold| {
                        moe_down_q8_preload_kernel(k, lanes, items, (early, fold, batch))
                    })
                })
            });
            gate_up.chain(down)
        })
    })
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
        if module.kernels.is_empty() {
            // An optional family that this build's options leave out.
            continue;
        }
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
                        "mtp_concat_norms_kernel",
                        "add_kernel",
                        "add_rms_norm_kernel",
                        "rms_norm_q8_kernel",
                        "add_rms_norm_q8_kernel",
                        ARGMAX_KERNEL,
                        IDS_OF_KEYS_KERNEL,
                        COPY_SPANS_KERNEL,
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
                    (2..=SMALL_BATCH_MAX_TOKENS)
                        .map(move |t| matmul_splitk_q8_small_kernel(kind, t))
                }))
                .chain([WIDE_F32.0, WIDE_F16.0].into_iter().flat_map(|block| {
                    (2..=SMALL_BATCH_MAX_TOKENS).map(move |t| matmul_splitk_small_kernel(block, t))
                }))
                .chain(q8_kinds().flat_map(|kind| {
                    (2..=SMALL_BATCH_MAX_TOKENS).flat_map(move |t| {
                        SMALL_BATCH_ROWS.map(|rows| matmul_q8_small_kernel(kind, t, rows))
                    })
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
            name: "moe_batch".to_string(),
            source: format!(
                "{}{}",
                batch_tables_prefix(false),
                with_q8_dots(&[MOE, MOE_DECODE, MOE_ROUTE].join("\n"))
            ),
            kernels: moe_q8_kernels(true)
                .filter(|k| !batch_kernel_shared(k))
                .collect(),
        },
        ModuleSource {
            name: "moe_batch_shared".to_string(),
            source: format!(
                "{}{}",
                batch_tables_prefix(true),
                with_q8_dots(&[MOE, MOE_DECODE, MOE_ROUTE].join("\n"))
            ),
            kernels: moe_q8_kernels(true)
                .filter(|k| batch_kernel_shared(k))
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
                        MOE_Q8_ROWS
                            .iter()
                            .map(move |&rows| moe_down_q8_kernel(k, lanes, rows))
                    })
                }))
                .chain(moe_q8_kernels(false))
                .chain(q8_kinds().flat_map(|k| {
                    MOE_LANES
                        .iter()
                        .map(move |&lanes| moe_gate_up_q8_grouped_kernel(k, lanes))
                }))
                .chain([
                    "moe_route_kernel".to_string(),
                    route_v2_kernel(),
                    route_gate_kernel(WIDE_F32.0),
                    route_gate_kernel(WIDE_F16.0),
                    router_topk_kernel(),
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
            source: with_q8_dots(&[DELTANET, DELTANET_CHUNKED, DELTANET_REPLAY].join("\n")),
            kernels: CONV_KERNELS
                .iter()
                .flat_map(|&w| [conv_kernel(w), conv_tokens_kernel(w)])
                .chain(DELTA_DK.iter().map(|&dk| delta_rule_kernel(dk)))
                .chain(DELTA_DK.iter().map(|&dk| delta_chunked_kernel(dk)))
                .chain(DELTA_DK.iter().flat_map(|&dk| {
                    CONV_KERNELS.iter().flat_map(move |&w| {
                        DELTA_ROW_GROUPS.map(|g| deltanet_step_kernel(dk, w, g))
                    })
                }))
                .chain(DELTA_DK.iter().map(|&dk| deltanet_replay_kernel(dk)))
                .chain([
                    "deltanet_split_kernel".to_string(),
                    "deltanet_prep_kernel".to_string(),
                    gated_norm_kernel(),
                ])
                .collect(),
        },
        ModuleSource {
            name: "attention".to_string(),
            source: with_reduce(&[ATTENTION, ATTENTION_COMBINE, ATTENTION_PREFILL].join("\n")),
            kernels: KV_CUDA_TYPES
                .iter()
                .flat_map(|&kv| {
                    std::iter::once(attn_prep_kernel(kv)).chain(
                        ATTENTION_HEAD_DIMS.iter().flat_map(move |&hd| {
                            [
                                attention_kernel(kv, hd),
                                attention_split_kernel(kv, hd),
                                attention_split_depth_kernel(kv, hd),
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
                .chain([
                    ATTENTION_COMBINE_KERNEL.to_string(),
                    ATTENTION_COMBINE_AHEAD_KERNEL.to_string(),
                ])
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

    /// Every kernel launched with the PDL attribute (`raw/launcher.rs`) must wait in
    /// `pdl_begin` before it reads another kernel's output: each `__global__` body calls it
    /// (the norm kernels through `norm_row`, which does; from a lambda as `pdl_begin_as`).
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
            DELTANET_REPLAY,
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
                    kernel.contains("pdl_begin();")
                        || kernel.contains("pdl_begin_as(")
                        || kernel.contains("norm_row"),
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
