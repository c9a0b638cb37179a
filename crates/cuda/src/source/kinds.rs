//! The weight types the kernels decode and the shapes of the tensor-core products.

use redlite_gguf::GgmlType;

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
pub(super) const MMA_SHAPES: [MmaShape; 4] = [MMA_DENSE, MMA_GATE_UP, MMA_DOWN, MMA_GATE_UP_WIDE];
