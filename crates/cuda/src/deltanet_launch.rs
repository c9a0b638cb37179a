//! Launchers of the DeltaNet layer's kernels (split, conv, prep, delta rule, the fused step,
//! gated norm): pick the specialization, size the grid and the dynamic shared memory for a
//! shape the op entry (`layer_ops`) already validated.

use crate::device::Device;
use crate::error::CudaError;
use crate::layer_launch::{config, to_i32, to_u32, warps_grid, FLAT_THREADS, ROW_THREADS};
use crate::layer_ops::TokenWalk;
use crate::raw;
use crate::source::{
    self, delta_chunked_shared_bytes, CONV_TOKENS_THREADS, DELTA_CHUNK_COLS, DELTA_CHUNK_THREADS,
    DELTA_COLS, DELTA_ROW_GROUPS, DELTA_WHOLE_GROUPS, LAYER_WARPS,
};
use crate::switch::Switch;
use cudarc::driver::{CudaView, CudaViewMut};

pub(crate) struct DeltaDims {
    pub tokens: usize,
    pub k_heads: usize,
    pub v_heads: usize,
    pub head_dim: usize,
}

impl DeltaDims {
    fn channels(&self) -> usize {
        2 * self.k_heads * self.head_dim + self.v_heads * self.head_dim
    }
}

pub(crate) fn deltanet_split(
    device: &Device,
    d: &DeltaDims,
    p: &CudaView<'_, f32>,
    qkv: &mut CudaViewMut<'_, f32>,
    z: &mut CudaViewMut<'_, f32>,
) -> Result<(), CudaError> {
    let kernel = device.kernel("deltanet_split_kernel")?;
    let width = d.channels() + d.v_heads * d.head_dim;
    let cfg = config(
        (width.div_ceil(FLAT_THREADS as usize), d.tokens, 1),
        FLAT_THREADS,
        0,
    );
    let r = d.v_heads / d.k_heads;
    let dims = [d.k_heads, d.head_dim, r, d.head_dim].map(to_i32);
    raw::launch_deltanet_split(device.stream(), kernel, cfg, p, qkv, z, dims)
}

/// Sequential: one thread per channel. Chunked: one CTA per 32 channels, 32 token ranges.
pub(crate) fn deltanet_conv(
    device: &Device,
    d: &DeltaDims,
    walk: TokenWalk,
    width: usize,
    w: &CudaView<'_, f32>,
    state: &mut CudaViewMut<'_, f32>,
    qkv: &mut CudaViewMut<'_, f32>,
) -> Result<(), CudaError> {
    let channels = d.channels();
    let (kernel, cfg) = match walk {
        TokenWalk::Sequential => (
            device.kernel(&source::conv_kernel(width))?,
            config(
                (channels.div_ceil(FLAT_THREADS as usize), 1, 1),
                FLAT_THREADS,
                0,
            ),
        ),
        TokenWalk::Chunked => (
            device.kernel(&source::conv_tokens_kernel(width))?,
            config((channels.div_ceil(32), 1, 1), CONV_TOKENS_THREADS, 0),
        ),
    };
    let dims = (to_i32(channels), to_i32(d.tokens));
    raw::launch_conv(device.stream(), kernel, cfg, qkv, state, w, dims)
}

#[allow(clippy::too_many_arguments)]
pub(crate) fn deltanet_prep(
    device: &Device,
    d: &DeltaDims,
    eps: f32,
    qkv: &mut CudaViewMut<'_, f32>,
    ba: &CudaView<'_, f32>,
    a: &CudaView<'_, f32>,
    dt_bias: &CudaView<'_, f32>,
    beta: &mut CudaViewMut<'_, f32>,
    g: &mut CudaViewMut<'_, f32>,
) -> Result<(), CudaError> {
    let kernel = device.kernel("deltanet_prep_kernel")?;
    let cfg = config((d.tokens, 1, 1), ROW_THREADS, 0);
    let dims = [d.channels(), d.k_heads, d.v_heads, d.head_dim].map(to_i32);
    let q_scale = 1.0 / (d.head_dim as f32).sqrt();
    raw::launch_deltanet_prep(
        device.stream(),
        kernel,
        cfg,
        qkv,
        ba,
        a,
        dt_bias,
        beta,
        g,
        dims,
        (eps, q_scale),
    )
}

/// Both forms: grid (v_heads, dv / 32), 32 value columns per CTA; sequential with a thread
/// per column, chunked with 256 threads and its shared memory (above the default limit).
pub(crate) fn delta_rule(
    device: &Device,
    d: &DeltaDims,
    walk: TokenWalk,
    (qkv, beta, g): (&CudaView<'_, f32>, &CudaView<'_, f32>, &CudaView<'_, f32>),
    state: &mut CudaViewMut<'_, f32>,
    out: &mut CudaViewMut<'_, f32>,
) -> Result<(), CudaError> {
    // The chunked form needs ~124 KiB of shared memory at head dim 128: GPUs that cannot
    // give a CTA that much (sm_86 / sm_89: ~99 KiB) walk the tokens one by one.
    let walk = match walk {
        TokenWalk::Chunked
            if delta_chunked_shared_bytes(d.head_dim) > device.shared_per_block_optin() =>
        {
            TokenWalk::Sequential
        }
        walk => walk,
    };
    let (kernel, cfg) = match walk {
        TokenWalk::Sequential => (
            device.kernel(&source::delta_rule_kernel(d.head_dim))?,
            config(
                (d.v_heads, d.head_dim / DELTA_COLS as usize, 1),
                DELTA_COLS,
                0,
            ),
        ),
        TokenWalk::Chunked => (
            device.kernel(&source::delta_chunked_kernel(d.head_dim))?,
            config(
                (d.v_heads, d.head_dim / DELTA_CHUNK_COLS, 1),
                DELTA_CHUNK_THREADS,
                delta_chunked_shared_bytes(d.head_dim),
            ),
        ),
    };
    let dims = [d.tokens, d.k_heads, d.v_heads, d.head_dim].map(to_i32);
    raw::launch_delta_rule(device.stream(), kernel, cfg, qkv, beta, g, state, out, dims)
}

/// `REDLITE_DELTANET_ROW_GROUPS=0`: the fused DeltaNet step takes the rows of a batch (an MTP
/// verification) one at a time, each behind its own loads and barriers, instead of in pairs
/// whose loads, convolutions, norms and gates issue together (the same bits either way).
pub static DELTANET_ROW_GROUPS: Switch = Switch::new("REDLITE_DELTANET_ROW_GROUPS", true);

/// `REDLITE_DELTANET_WHOLE_GROUP=1`: a batch of 3 or 4 rows as one group of all its rows
/// instead of the step's pairs and single rows (the same bits; GPU test and host emulator).
/// Off: no faster on an H100 (forty-third session, MTP at 0.7: two drafts +0.2 %, three ±0).
pub static DELTANET_WHOLE_GROUP: Switch = Switch::new("REDLITE_DELTANET_WHOLE_GROUP", false);

/// The fused step's row group for a batch of `tokens`: the whole batch where a group of that
/// size is built for it (`DELTA_WHOLE_GROUPS`), else the largest of the others that divides
/// it (the kernel builds no partial group).
fn deltanet_row_group(tokens: usize) -> usize {
    if !DELTANET_ROW_GROUPS.on() {
        return 1;
    }
    if DELTANET_WHOLE_GROUP.on() && DELTA_WHOLE_GROUPS.contains(&tokens) {
        return tokens;
    }
    DELTA_ROW_GROUPS
        .iter()
        .rev()
        .copied()
        .filter(|g| !DELTA_WHOLE_GROUPS.contains(g))
        .find(|&g| tokens.is_multiple_of(g))
        .unwrap_or(1)
}

#[allow(clippy::too_many_arguments)]
pub(crate) fn deltanet_step(
    device: &Device,
    d: &DeltaDims,
    width: usize,
    eps: f32,
    inputs: [&CudaView<'_, f32>; 7],
    (conv_state, recurrent, out): (
        &mut CudaViewMut<'_, f32>,
        &mut CudaViewMut<'_, f32>,
        &mut CudaViewMut<'_, f32>,
    ),
    record: Option<raw::StepKeeps<'_, '_>>,
    out_q8: Option<(&mut CudaViewMut<'_, f32>, &mut CudaViewMut<'_, i8>)>,
) -> Result<(), CudaError> {
    let kernel = device.kernel(&source::deltanet_step_kernel(
        d.head_dim,
        width,
        deltanet_row_group(d.tokens),
    ))?;
    let threads = d.v_heads / d.k_heads * d.head_dim;
    let cfg = config((d.k_heads, 1, 1), to_u32(threads), 0);
    let dims = [d.tokens, d.k_heads, d.v_heads].map(to_i32);
    let q_scale = 1.0 / (d.head_dim as f32).sqrt();
    raw::launch_deltanet_step(
        device.stream(),
        kernel,
        cfg,
        inputs,
        (conv_state, recurrent, out),
        record,
        out_q8,
        dims,
        (eps, q_scale),
    )
}

pub(crate) fn gated_norm(
    device: &Device,
    d: &DeltaDims,
    eps: f32,
    o: &mut CudaViewMut<'_, f32>,
    z: &CudaView<'_, f32>,
    w: &CudaView<'_, f32>,
) -> Result<(), CudaError> {
    let kernel = device.kernel(&source::gated_norm_kernel())?;
    let rows = d.tokens * d.v_heads;
    let cfg = config((warps_grid(rows), 1, 1), LAYER_WARPS * 32, 0);
    let dims = (to_i32(rows), to_i32(d.head_dim));
    raw::launch_gated_norm(device.stream(), kernel, cfg, o, z, w, dims, eps)
}
