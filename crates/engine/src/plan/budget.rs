//! Everything but the experts: resident dense weights, KV cache, DeltaNet state,
//! activations, and the memory CUDA itself takes. What is left goes to the experts.

use serde::Serialize;

use crate::plan::activations::{activations, Activations};
use crate::plan::settings::{kv_value_bytes, PlanSettings};
use crate::plan::shape::ModelShape;
use crate::plan::units::MIB;

/// The CUDA context of the process: measured 526 MiB for a bare primary context on the
/// H200 (driver 580, `cuMemGetInfo` before and after `cuDevicePrimaryCtxRetain`), plus
/// 50 MiB for the NVRTC-compiled kernel modules and their constant tables.
pub const CUDA_CONTEXT_BYTES: u64 = 576 * MIB;

/// The rest of CUDA's share: rounding by the stream-ordered allocator (measured +9.6 MiB over
/// 336 buffers of 2-36 MiB, none for small buffers; the engine holds ~900 buffers), the
/// captured decode graphs (a few MiB each), cuBLAS's own workspace, and headroom so the
/// last allocation of a full plan does not fail on fragmentation. 192 MiB fell 25 MB short
/// on the H200 (Q4_K_M file, 24 GiB, an expert cache under uniform routing): the limit
/// counts what the driver reports in use, itemized or not.
pub const CUDA_WORKSPACE_BYTES: u64 = 256 * MIB;

/// The memory a plan spends before the experts.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct Budget {
    pub gpu_limit: u64,
    /// Weights uploaded once (all but the routed experts), the MTP block's when counted.
    pub dense_weights: u64,
    /// Of which the MTP block.
    pub mtp_weights: u64,
    /// Attention layers with a KV cache (the MTP block has its own).
    pub kv_layers: u64,
    /// K and V of one position over those layers.
    pub kv_bytes_per_position: u64,
    /// `slots x ctx x kv_bytes_per_position`.
    pub kv_cache: u64,
    /// One sequence's DeltaNet conv and recurrent state (f32, any length).
    pub deltanet_state_per_slot: u64,
    /// Copies per slot: with MTP, 1 + drafts (a verification records the state after each
    /// of its rows but the last, for a rollback without re-running).
    pub deltanet_copies: u64,
    /// `slots x copies x deltanet_state_per_slot`.
    pub deltanet_state: u64,
    /// KV positions one slot's DeltaNet state is worth.
    pub deltanet_state_positions: u64,
    pub activations: Activations,
    pub cuda_context: u64,
    pub cuda_workspace: u64,
}

impl Budget {
    /// Bytes before the experts.
    pub fn before_experts(&self) -> u64 {
        [
            self.dense_weights,
            self.kv_cache,
            self.deltanet_state,
            self.activations.total(),
            self.cuda_context,
            self.cuda_workspace,
        ]
        .iter()
        .fold(0u64, |acc, &b| acc.saturating_add(b))
    }

    /// What the limit leaves for the experts (negative when the rest alone exceeds it).
    pub fn available_for_experts(&self) -> i128 {
        i128::from(self.gpu_limit) - i128::from(self.before_experts())
    }
}

/// Sizes every line for these settings; the MTP block must be present when asked for
/// (checked by the caller).
pub fn budget(shape: &ModelShape, s: &PlanSettings) -> Budget {
    let c = &shape.config;
    let mtp_weights = shape.mtp.as_ref().filter(|_| s.mtp).map_or(0, |m| m.dense);
    let kv_layers = c.attention_layers() as u64 + u64::from(s.mtp);
    let kv_bytes_per_position =
        kv_layers * 2 * (c.n_head_kv * c.head_dim) as u64 * kv_value_bytes(s.kv);
    let slots = s.slots as u64;
    let deltanet_state_per_slot = c.deltanet_state_bytes();
    // A step holds every decoding slot's tokens (its drafts too with MTP) and up to `chunk`
    // prompt tokens (the serve scheduler's rule; a single session holds `chunk`).
    let draft_rows = 1 + if s.mtp { s.draft as u64 } else { 0 };
    let deltanet_copies = draft_rows;
    let rows = (s.chunk as u64).saturating_add(slots.saturating_mul(draft_rows));
    Budget {
        gpu_limit: s.gpu_limit,
        dense_weights: shape.dense.total() + mtp_weights,
        mtp_weights,
        kv_layers,
        kv_bytes_per_position,
        kv_cache: slots
            .saturating_mul(s.ctx as u64)
            .saturating_mul(kv_bytes_per_position),
        deltanet_state_per_slot,
        deltanet_copies,
        deltanet_state: slots
            .saturating_mul(deltanet_copies)
            .saturating_mul(deltanet_state_per_slot),
        deltanet_state_positions: deltanet_state_per_slot / kv_bytes_per_position.max(1),
        activations: activations(c, rows, slots.saturating_mul(draft_rows), s.mtp),
        cuda_context: CUDA_CONTEXT_BYTES,
        cuda_workspace: CUDA_WORKSPACE_BYTES,
    }
}
