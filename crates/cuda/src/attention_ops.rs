//! Op entries of the gated full-attention kernels (`attention.cu`, `attention_prefill.cu`):
//! validate shapes and the head dims the kernels are built for, then hand over to
//! `layer_launch` (per-token kernels) or `attention_prefill` (flash prefill).

use crate::attention_prefill as prefill;
use crate::device::Device;
use crate::error::{CudaError, CudaOp};
use crate::layer_launch::{self as launch, AttnDims, SplitKernel, SHARED_MAX_BYTES};
use crate::layer_ops::{supported, tokens_fit, MAX_GRID_YZ};
use crate::ops::{fits, shape};
use crate::source::{
    ATTENTION_HEADS_PER_CTA, ATTENTION_HEAD_DIMS, ATTENTION_MAX_SPLITS, SMALL_BATCH_MAX_TOKENS,
};
use cudarc::driver::{CudaView, CudaViewMut, DeviceRepr};
use std::sync::OnceLock;

/// An element type of the KV cache: f32, or f16 stored as its bits (`u16`).
pub trait KvElement: DeviceRepr {
    /// The kernels' spelling of the type.
    const CUDA_TYPE: &'static str;
}

impl KvElement for f32 {
    const CUDA_TYPE: &'static str = "float";
}

impl KvElement for u16 {
    const CUDA_TYPE: &'static str = "u16";
}

/// The largest head `attn_prep_kernel` takes: its 32 lanes hold ROPE_PER_LANE values each.
const PREP_MAX_HEAD_DIM: usize = 256;

/// Sizes of one attention call.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct AttentionShape {
    pub tokens: usize,
    /// Position of the first token.
    pub pos0: usize,
    pub heads: usize,
    pub kv_heads: usize,
    pub head_dim: usize,
    pub rope_dim: usize,
    pub rope_base: f32,
    pub eps: f32,
    /// Positions the caches hold.
    pub capacity: usize,
}

impl AttentionShape {
    fn check(&self, op: CudaOp) -> Result<AttnDims, CudaError> {
        tokens_fit(op, self.tokens)?;
        fits(
            op,
            "heads",
            (self.heads + self.kv_heads) as u64,
            MAX_GRID_YZ,
        )?;
        fits(
            op,
            "last position",
            (self.pos0 + self.tokens) as u64,
            self.capacity as u64,
        )?;
        fits(op, "positions", self.capacity as u64, i32::MAX as u64)?;
        fits(op, "rope dims", self.rope_dim as u64, self.head_dim as u64)?;
        if self.kv_heads == 0 || !self.heads.is_multiple_of(self.kv_heads) {
            return Err(CudaError::Shape {
                op,
                what: "heads (a multiple of kv_heads)",
                expected: self.kv_heads,
                found: self.heads,
            });
        }
        Ok(AttnDims {
            tokens: self.tokens,
            pos0: self.pos0,
            heads: self.heads,
            kv_heads: self.kv_heads,
            head_dim: self.head_dim,
            rope_dim: self.rope_dim,
            rope_base: self.rope_base,
            eps: self.eps,
        })
    }

    fn cache_len(&self) -> usize {
        self.capacity * self.kv_heads * self.head_dim
    }
}

/// Where the kernels take the position of a one-token batch from.
#[derive(Clone, Copy)]
pub enum Position<'a, 'b> {
    /// `AttentionShape::pos0`, fixed at launch.
    Host,
    /// A u32 in device memory, read when the kernel runs (a captured decode step replayed at
    /// every position). The shape's `pos0` is only checked; the caller guarantees that the
    /// position it writes there stays below the capacity.
    Device(&'a CudaView<'b, u32>),
}

impl<'a, 'b> Position<'a, 'b> {
    fn check(self, op: CudaOp, tokens: usize) -> Result<Option<&'a CudaView<'b, u32>>, CudaError> {
        match self {
            Position::Host => Ok(None),
            Position::Device(view) => {
                fits(
                    op,
                    "tokens (device position)",
                    tokens as u64,
                    SMALL_BATCH_MAX_TOKENS as u64,
                )?;
                shape(op, "device position length", 1, view.len())?;
                Ok(Some(view))
            }
        }
    }
}

/// RMSNorm + RoPE of every query head of `qg` (tokens x heads x [query | gate]) into `q`
/// (tokens x heads x hd), and of every key head of `k` (tokens x kv_heads x hd) into the K
/// cache at positions pos0.., with `v` copied into the V cache.
#[allow(clippy::too_many_arguments)]
pub fn attention_prep<T: KvElement>(
    device: &Device,
    s: &AttentionShape,
    qg: &CudaView<'_, f32>,
    k: &CudaView<'_, f32>,
    v: &CudaView<'_, f32>,
    (q_norm, k_norm): (&CudaView<'_, f32>, &CudaView<'_, f32>),
    q: &mut CudaViewMut<'_, f32>,
    k_cache: &mut CudaViewMut<'_, T>,
    v_cache: &mut CudaViewMut<'_, T>,
    pos: Position<'_, '_>,
) -> Result<(), CudaError> {
    let op = CudaOp::AttentionPrep;
    let d = s.check(op)?;
    let pos = pos.check(op, s.tokens)?;
    let hd = s.head_dim;
    shape(op, "qg length", s.tokens * s.heads * 2 * hd, qg.len())?;
    shape(op, "k length", s.tokens * s.kv_heads * hd, k.len())?;
    shape(op, "v length", s.tokens * s.kv_heads * hd, v.len())?;
    shape(op, "q_norm length", hd, q_norm.len())?;
    shape(op, "k_norm length", hd, k_norm.len())?;
    shape(op, "q length", s.tokens * s.heads * hd, q.len())?;
    shape(op, "k cache length", s.cache_len(), k_cache.len())?;
    shape(op, "v cache length", s.cache_len(), v_cache.len())?;
    fits(
        op,
        "head dim (shared memory bytes)",
        (hd * 4) as u64,
        SHARED_MAX_BYTES as u64,
    )?;
    fits(op, "head dim", hd as u64, PREP_MAX_HEAD_DIM as u64)?;
    launch::attention_prep(
        device,
        T::CUDA_TYPE,
        &d,
        [qg, k, v, q_norm, k_norm],
        q,
        k_cache,
        v_cache,
        pos,
    )
}

/// Floats of the flash-decoding scratch that lets `tokens` tokens use every split; a
/// shorter `partials` buffer uses fewer splits, and one too short for two runs the
/// single-pass kernel.
pub fn attention_partials_len(tokens: usize, heads: usize, head_dim: usize) -> usize {
    tokens * heads * attention_max_splits() * (head_dim + 2)
}

/// Most KV-length splits a token's attention takes: [`ATTENTION_MAX_SPLITS`], or
/// `REDLITE_ATTN_MAX_SPLITS=N` (2 to 256), a measurement switch (the planner counts the
/// default's scratch). More splits shorten each split CTA's walk over the cache (at depth 4096
/// each warp of 64 splits walks 5 groups of 4 positions, of 128 splits 3) and lengthen the
/// combine's.
pub fn attention_max_splits() -> usize {
    static MOST: OnceLock<usize> = OnceLock::new();
    *MOST.get_or_init(|| {
        std::env::var("REDLITE_ATTN_MAX_SPLITS")
            .ok()
            .and_then(|v| v.parse().ok())
            .filter(|n| (2..=256).contains(n))
            .unwrap_or(ATTENTION_MAX_SPLITS)
    })
}

/// The kernels that run a batch's attention (the same result to f32 rounding).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum AttentionKernels {
    /// One CTA per (token, head) walking the cache, the KV length split over several CTAs
    /// when long (flash decoding): the decode graph's kernels (four query heads per split CTA
    /// unless `REDLITE_ATTN_HEADS_PER_CTA` says otherwise).
    PerToken,
    /// [`PerToken`](Self::PerToken) with this many query heads per split CTA (1, 2, 4 or 8,
    /// dividing the query heads of a KV head): the same bits for every count.
    PerTokenHeads(usize),
    /// [`PerToken`](Self::PerToken) with the split kernel chosen per token by its length
    /// (`REDLITE_ATTN_LONG_FROM`): tokens shorter than this take four query heads and four
    /// warps a CTA (the bits of `PerTokenHeads(4)`), the others eight and eight. Needs eight
    /// query heads to a KV head.
    PerTokenDepth(usize),
    /// Tiles of query rows (tokens x the query heads of one KV head) over K/V tiles in shared
    /// memory (`attention_prefill.cu`): prompts. Needs the position from the host.
    FlashPrefill,
}

/// Causal attention of `q` (tokens x heads x hd) over the cache positions 0..=pos0 + t,
/// times sigmoid of the gate half of `qg`, into `o` (tokens x heads x hd). `partials`
/// (any length; see [`attention_partials_len`]) holds the per-split partial sums when the
/// KV length is split over several CTAs per head; its contents are overwritten. Batches of
/// at least [`FLASH_PREFILL_MIN_TOKENS`](crate::FLASH_PREFILL_MIN_TOKENS) tokens at a host
/// position take the flash prefill kernel (`REDLITE_FLASH_PREFILL=0`: never), others the
/// per-token kernels.
#[allow(clippy::too_many_arguments)]
pub fn attention<T: KvElement>(
    device: &Device,
    s: &AttentionShape,
    q: &CudaView<'_, f32>,
    qg: &CudaView<'_, f32>,
    k_cache: &CudaView<'_, T>,
    v_cache: &CudaView<'_, T>,
    partials: &mut CudaViewMut<'_, f32>,
    o: &mut CudaViewMut<'_, f32>,
    pos: Position<'_, '_>,
) -> Result<(), CudaError> {
    attention_on(device, None, s, q, qg, k_cache, v_cache, partials, o, pos)
}

/// [`attention`] with the kernels chosen by the caller (`None`: as [`attention`] chooses);
/// [`AttentionKernels::FlashPrefill`] refuses a device position and a shape it has no room
/// for.
#[allow(clippy::too_many_arguments)]
pub fn attention_on<T: KvElement>(
    device: &Device,
    kernels: Option<AttentionKernels>,
    s: &AttentionShape,
    q: &CudaView<'_, f32>,
    qg: &CudaView<'_, f32>,
    k_cache: &CudaView<'_, T>,
    v_cache: &CudaView<'_, T>,
    partials: &mut CudaViewMut<'_, f32>,
    o: &mut CudaViewMut<'_, f32>,
    pos: Position<'_, '_>,
) -> Result<(), CudaError> {
    let op = CudaOp::Attention;
    let d = s.check(op)?;
    let pos = pos.check(op, s.tokens)?;
    let hd = s.head_dim;
    supported(op, "head dim", hd, &ATTENTION_HEAD_DIMS, "64, 128, 256")?;
    shape(op, "q length", s.tokens * s.heads * hd, q.len())?;
    shape(op, "qg length", s.tokens * s.heads * 2 * hd, qg.len())?;
    shape(op, "k cache length", s.cache_len(), k_cache.len())?;
    shape(op, "v cache length", s.cache_len(), v_cache.len())?;
    shape(op, "o length", s.tokens * s.heads * hd, o.len())?;
    let kernels = kernels.unwrap_or(
        if prefill::flash_prefill_default(device, &d, pos.is_none()) {
            AttentionKernels::FlashPrefill
        } else {
            AttentionKernels::PerToken
        },
    );
    let group = s.heads / s.kv_heads.max(1);
    let split = match kernels {
        AttentionKernels::PerToken => Some(SplitKernel::Chosen),
        AttentionKernels::PerTokenDepth(from) => {
            if from == 0 || !group.is_multiple_of(8) || !s.heads.is_multiple_of(8) {
                return Err(CudaError::NoSpecialization {
                    op,
                    what: "query heads to a KV head for the split by depth",
                    found: group,
                    supported: "multiples of 8, from a length of at least 1",
                });
            }
            Some(SplitKernel::Depth(from))
        }
        AttentionKernels::PerTokenHeads(hpc) => {
            if hpc != 1 && !(ATTENTION_HEADS_PER_CTA.contains(&hpc) && group.is_multiple_of(hpc)) {
                return Err(CudaError::NoSpecialization {
                    op,
                    what: "query heads per split CTA",
                    found: hpc,
                    supported: "1, 2, 4, 8 dividing the query heads of a KV head",
                });
            }
            Some(SplitKernel::Heads(hpc))
        }
        AttentionKernels::FlashPrefill => None,
    };
    if let Some(split) = split {
        return launch::attention(
            device,
            T::CUDA_TYPE,
            &d,
            split,
            q,
            qg,
            k_cache,
            v_cache,
            partials,
            o,
            pos,
        );
    }
    if pos.is_some() {
        return Err(CudaError::Shape {
            op,
            what: "flash prefill positions in device memory (it takes the host's)",
            expected: 0,
            found: 1,
        });
    }
    prefill::check(device, op, &d)?;
    prefill::attention_prefill(
        device,
        T::CUDA_TYPE,
        &d,
        (q, qg),
        (k_cache, v_cache),
        partials,
        o,
    )
}
