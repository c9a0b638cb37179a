//! Launcher of the flash prefill attention (`attention_prefill.cu`): the tile and split plan
//! for a shape the op entry (`attention_ops`) validated, and the switch that keeps prompts on
//! the per-token kernels.

use crate::device::Device;
use crate::error::{CudaError, CudaOp};
use crate::layer_launch::{combine_config, combine_kernel, config, to_i32, AttnDims};
use crate::ops::fits;
use crate::raw;
use crate::source::{
    self, prefill_shared_bytes, ATTENTION_MAX_SPLITS, PREFILL_BK, PREFILL_ROWS, PREFILL_WARPS,
};
use cudarc::driver::{CudaView, CudaViewMut, DeviceRepr};
use std::sync::OnceLock;

/// Fewest tokens that take the flash prefill kernel. A CTA's 64 query rows are 8 tokens x
/// the 8 query heads of a Qwen3-Next KV head, so from 16 tokens on every CTA is full and each
/// K/V row read from L2 serves 64 rows instead of one; shorter batches (decode, speculative
/// steps) keep the per-token kernels of the decode graph.
pub const FLASH_PREFILL_MIN_TOKENS: usize = 16;

/// `REDLITE_FLASH_PREFILL=0`: prompts take the per-token kernels too.
fn flash_prefill_enabled() -> bool {
    static ON: OnceLock<bool> = OnceLock::new();
    *ON.get_or_init(|| std::env::var("REDLITE_FLASH_PREFILL").as_deref() != Ok("0"))
}

/// Whether the default path runs `d` with the flash prefill kernel: enough tokens, the
/// position from the host, the switch on, and a shape the kernel takes on this device.
pub(crate) fn flash_prefill_default(device: &Device, d: &AttnDims, host_position: bool) -> bool {
    host_position
        && d.tokens >= FLASH_PREFILL_MIN_TOKENS
        && flash_prefill_enabled()
        && check(device, CudaOp::Attention, d).is_ok()
}

/// What the kernel needs beyond the op entry's checks: a KV group that fits the CTA's rows
/// and shared memory the device grants one CTA.
pub(crate) fn check(device: &Device, op: CudaOp, d: &AttnDims) -> Result<(), CudaError> {
    fits(
        op,
        "query heads per KV head (flash prefill rows)",
        (d.heads / d.kv_heads.max(1)) as u64,
        PREFILL_ROWS as u64,
    )?;
    fits(
        op,
        "flash prefill shared memory bytes",
        prefill_shared_bytes(d.head_dim) as u64,
        device.shared_per_block_optin() as u64,
    )
}

/// Query tiles, KV splits and positions per split for `d`. Without splits the grid has
/// tiles x kv_heads CTAs of one per multiprocessor (the shared memory allows no second); a
/// short batch far into the cache splits the positions (at least two K/V tiles per split)
/// until the grid fills the device, as far as `partials_len` floats hold the partial sums.
fn plan(d: &AttnDims, multiprocessors: usize, partials_len: usize) -> (usize, usize, usize) {
    let per_tile = PREFILL_ROWS / (d.heads / d.kv_heads);
    let tiles = d.tokens.div_ceil(per_tile);
    let len = d.pos0 + d.tokens;
    let per_split = d.tokens * d.heads * (d.head_dim + 2);
    let splits = multiprocessors
        .div_ceil(tiles * d.kv_heads)
        .min(len.div_ceil(2 * PREFILL_BK))
        .min(ATTENTION_MAX_SPLITS)
        .min(partials_len / per_split.max(1))
        .max(1);
    let chunk = len.div_ceil(splits).next_multiple_of(PREFILL_BK);
    (tiles, len.div_ceil(chunk), chunk)
}

/// Flash prefill attention of `d` (checked by the op entry and by [`check`]): the kernel
/// alone, or with splits the kernel's partials merged by `attention_combine_kernel`.
#[allow(clippy::too_many_arguments)]
pub(crate) fn attention_prefill<T: DeviceRepr>(
    device: &Device,
    kv_type: &str,
    d: &AttnDims,
    (q, qg): (&CudaView<'_, f32>, &CudaView<'_, f32>),
    (k_cache, v_cache): (&CudaView<'_, T>, &CudaView<'_, T>),
    partials: &mut CudaViewMut<'_, f32>,
    o: &mut CudaViewMut<'_, f32>,
) -> Result<(), CudaError> {
    let (tiles, splits, chunk) = plan(d, device.multiprocessors() as usize, partials.len());
    let kernel = device.kernel(&source::attention_prefill_kernel(kv_type, d.head_dim))?;
    let cfg = config(
        (tiles, d.kv_heads, splits),
        PREFILL_WARPS * 32,
        prefill_shared_bytes(d.head_dim),
    );
    let dims = [d.tokens, d.pos0, d.heads, d.kv_heads, chunk].map(to_i32);
    let scale = 1.0 / (d.head_dim as f32).sqrt();
    raw::launch_attention_prefill(
        device.stream(),
        kernel,
        cfg,
        (q, qg),
        (k_cache, v_cache),
        o,
        partials,
        dims,
        scale,
    )?;
    if splits == 1 {
        return Ok(());
    }
    let combine = device.kernel(combine_kernel())?;
    let cfg = combine_config(d.tokens, d.heads, splits, d.head_dim);
    let dims = [d.heads, d.head_dim, splits].map(to_i32);
    raw::launch_attention_combine(
        device.stream(),
        combine,
        cfg,
        &partials.as_view(),
        qg,
        o,
        dims,
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    fn dims(tokens: usize, pos0: usize) -> AttnDims {
        AttnDims {
            tokens,
            pos0,
            heads: 16,
            kv_heads: 2,
            head_dim: 256,
            rope_dim: 64,
            rope_base: 1e7,
            eps: 1e-6,
        }
    }

    #[test]
    fn splits_cover_every_position_and_fit_the_partials() {
        for (tokens, pos0) in [(16, 0), (16, 8000), (100, 37), (300, 1000), (8192, 0)] {
            let d = dims(tokens, pos0);
            for partials_len in [0, 1 << 20, 1 << 30] {
                let (tiles, splits, chunk) = plan(&d, 132, partials_len);
                assert!(tiles * 8 >= tokens);
                assert!(splits * chunk >= pos0 + tokens);
                assert!((splits - 1) * chunk < pos0 + tokens, "an empty split");
                assert!(chunk.is_multiple_of(PREFILL_BK));
                assert!(splits == 1 || splits * tokens * 16 * 258 <= partials_len);
                assert!(splits <= ATTENTION_MAX_SPLITS);
            }
        }
        assert_eq!(plan(&dims(8192, 0), 132, 1 << 30).1, 1);
        assert!(plan(&dims(16, 8000), 132, 1 << 30).1 > 8);
    }
}
