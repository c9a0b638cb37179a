//! The kernel modules: their `.cu` sources (embedded), the generated tables prepended, and
//! the template instantiations each one exports (NVRTC name expressions).

use crate::tables::tables_header;
use redlite_gguf::GgmlType;

const COMMON: &str = include_str!("../kernels/common.cuh");
const BLOCKS: &str = include_str!("../kernels/blocks.cuh");
const DEQUANTIZE: &str = include_str!("../kernels/dequantize.cu");
const MATVEC: &str = include_str!("../kernels/matvec.cu");

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

/// Rows per CTA of the matvec kernel (one warp each).
pub(crate) const MATVEC_WARPS: u32 = 4;

pub(crate) fn dequantize_kernel(kind: WeightKind) -> String {
    format!("dequantize_kernel<{}>", kind.cuda_name)
}

pub(crate) fn matvec_kernel(kind: WeightKind, x_shared: bool) -> String {
    format!(
        "matvec_kernel<{}, {MATVEC_WARPS}, {x_shared}>",
        kind.cuda_name
    )
}

/// One NVRTC program: its full source and the kernels (name expressions) it exports.
pub struct ModuleSource {
    pub name: &'static str,
    pub source: String,
    pub kernels: Vec<String>,
}

fn with_prelude(body: &str) -> String {
    [COMMON, &tables_header(), BLOCKS, body].join("\n")
}

/// Every kernel module of the crate.
pub fn modules() -> Vec<ModuleSource> {
    vec![
        ModuleSource {
            name: "dequantize",
            source: with_prelude(DEQUANTIZE),
            kernels: WEIGHT_KINDS.iter().map(|&k| dequantize_kernel(k)).collect(),
        },
        ModuleSource {
            name: "matvec",
            source: with_prelude(MATVEC),
            kernels: WEIGHT_KINDS
                .iter()
                .flat_map(|&k| [matvec_kernel(k, true), matvec_kernel(k, false)])
                .collect(),
        },
    ]
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn kinds_agree_with_gguf_block_geometry() {
        for kind in WEIGHT_KINDS {
            let values = kind.ty.block_values();
            assert!(values.is_multiple_of(kind.items_per_block), "{:?}", kind.ty);
            let needle = format!("struct {} {{", kind.cuda_name);
            let typedef = format!("> {};", kind.cuda_name);
            assert!(
                BLOCKS.contains(&needle) || BLOCKS.contains(&typedef),
                "{} missing from blocks.cuh",
                kind.cuda_name
            );
        }
    }
}
