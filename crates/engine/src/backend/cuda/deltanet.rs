//! One Gated DeltaNet mixer on the GPU (spec §3.2), mirroring `cpu::deltanet`: projections,
//! legacy split, conv + SiLU, L2-normalized q/k and gates, the delta rule, gated RMSNorm,
//! output projection. Seven launches per layer. A prompt's conv splits the tokens across
//! threads and its delta rule runs in chunks of 64 tokens (`TokenWalk::Chunked`);
//! `REDLITE_DELTA_CHUNKED=0` walks them one after the other as a single token does.
//! One token and small batches (an MTP verification: up to `SMALL_BATCH_MAX_TOKENS` rows)
//! run the conv, norms, gates, delta rule and gated norm of all their rows as one launch
//! (`deltanet_step`), which also keeps a verification's per-row states;
//! `REDLITE_FUSED_DELTANET=0` runs the four kernels instead (docs/PERF.md: the fused step
//! is 4-6 % faster end to end on the H200).

use std::sync::OnceLock;

use redlite_cuda::{
    delta_rule, deltanet_conv, deltanet_prep, deltanet_split, deltanet_step, gated_norm, matmul,
    matmul_quantized, CudaView, CudaViewMut, DeltaNetParams, DeltaNetShape, Device, Q8Rows,
    StepRecord, StepStates, TokenWalk, Q8_BLOCK_VALUES, SMALL_BATCH_MAX_TOKENS,
};

use crate::backend::cuda::beside;
use crate::backend::cuda::scratch::Scratch;
use crate::backend::cuda::state::{DeltaState, RecordedRows, RecordedStates};
use crate::backend::cuda::weights::DeltaNetWeights;
use crate::error::{EngineError, Result};
use crate::model::config::HybridConfig;

/// `h`: `[T][n_embd]` (normed input) → `out`: `[T][n_embd]`. With `record` (a speculative
/// verification) the recurrence runs row by row and keeps the state after each row but the
/// last in `record`, for a rollback without re-running. One token and small batches take
/// the fused step (one launch for the rows), whose rows are each the bits of a one-token
/// step.
#[allow(clippy::too_many_arguments)]
pub fn forward(
    device: &Device,
    c: &HybridConfig,
    w: &DeltaNetWeights,
    s: &mut Scratch,
    (h, h_q8): (&CudaView<'_, f32>, Option<&Q8Rows<'_>>),
    state: &mut DeltaState,
    mut record: Option<&mut RecordedRows>,
    out: &mut CudaViewMut<'_, f32>,
) -> Result<()> {
    let t = h.len() / c.n_embd;
    let shape = DeltaNetShape {
        tokens: t,
        k_heads: c.ssm_k_heads,
        v_heads: c.ssm_v_heads,
        head_dim: c.ssm_head_dim,
    };
    let (channels, inner) = (shape.channels(), shape.inner());
    let mut qkv = s.qkv.slice_mut(..t * channels);
    let mut z = s.z.slice_mut(..t * inner);
    let mut ba = s.ba.slice_mut(..t * 2 * c.ssm_v_heads);
    // A legacy file's combined qkvz product, split after it.
    let mut proj = s.proj.slice_mut(..t * (channels + inner));
    device.mark("DeltaNet projections");
    let first = match w.gate_proj {
        Some(_) => &mut qkv,
        None => &mut proj,
    };
    beside::products3(
        device,
        t,
        || {
            Ok(matmul_quantized(
                device,
                &w.in_proj.view(),
                (h, h_q8),
                first,
            )?)
        },
        || {
            if let Some(gate) = &w.gate_proj {
                matmul_quantized(device, &gate.view(), (h, h_q8), &mut z)?;
            }
            Ok(())
        },
        || Ok(matmul_quantized(device, &w.ba.view(), (h, h_q8), &mut ba)?),
    )?;
    if w.gate_proj.is_none() {
        deltanet_split(device, &shape, &proj.as_view(), &mut qkv, &mut z)?;
    }
    let mut o = s.o.slice_mut(..t * inner);
    device.mark("DeltaNet recurrence and tail");
    if t <= SMALL_BATCH_MAX_TOKENS && fused() {
        let params = DeltaNetParams {
            conv_w: &w.conv.as_view(),
            a: &w.a.as_view(),
            dt_bias: &w.dt_bias.as_view(),
            norm_w: &w.norm.as_view(),
        };
        let kept = record.map(|rows| StepRecord {
            conv: rows.conv.as_view_mut(),
            recurrent: match &mut rows.recurrent {
                RecordedStates::Rows(states) => StepStates::Rows(states.as_view_mut()),
                RecordedStates::Replay { snapshot, inputs } => StepStates::Replay {
                    snapshot: snapshot.as_view_mut(),
                    inputs: inputs.as_view_mut(),
                },
            },
        });
        // The step quantizes its output where a key head's value heads fill a Q8_K block.
        let block = c.ssm_v_heads / c.ssm_k_heads.max(1) * c.ssm_head_dim;
        let mut q8 = match block == Q8_BLOCK_VALUES {
            true => s.o_q8.rows_mut(t, inner),
            false => None,
        };
        let quantized = q8.is_some();
        deltanet_step(
            device,
            &shape,
            c.rms_eps,
            &params,
            (&qkv.as_view(), &z.as_view(), &ba.as_view()),
            &mut state.conv.as_view_mut(),
            &mut state.recurrent.as_view_mut(),
            (&mut o, q8.as_mut()),
            kept,
        )?;
        device.mark("DeltaNet ssm_out");
        let q8 = s.o_q8.range((0, t), inner).filter(|_| quantized);
        matmul_quantized(device, &w.out.view(), (&o.as_view(), q8.as_ref()), out)?;
        return Ok(());
    }
    let mut beta = s.beta.slice_mut(..t * c.ssm_v_heads);
    let mut g = s.g.slice_mut(..t * c.ssm_v_heads);
    // The conv and the delta rule carry state from row to row: a recording call runs them
    // one row at a time, keeping each row's state; the gates depend on nothing but their row.
    let one = DeltaNetShape { tokens: 1, ..shape };
    let walk = if t > 1 && chunked() {
        TokenWalk::Chunked
    } else {
        TokenWalk::Sequential
    };
    match record.as_deref_mut() {
        None => deltanet_conv(
            device,
            &shape,
            walk,
            &w.conv.as_view(),
            &mut state.conv.as_view_mut(),
            &mut qkv,
        )?,
        Some(record) => {
            for r in 0..t {
                deltanet_conv(
                    device,
                    &one,
                    TokenWalk::Sequential,
                    &w.conv.as_view(),
                    &mut state.conv.as_view_mut(),
                    &mut qkv.slice_mut(r * channels..(r + 1) * channels),
                )?;
                if r + 1 < t {
                    keep_row(device, state, record, r, Part::Conv)?;
                }
            }
        }
    }
    deltanet_prep(
        device,
        &shape,
        c.rms_eps,
        &mut qkv,
        &ba.as_view(),
        &w.a.as_view(),
        &w.dt_bias.as_view(),
        &mut beta,
        &mut g,
    )?;
    match record {
        None => delta_rule(
            device,
            &shape,
            walk,
            &qkv.as_view(),
            &beta.as_view(),
            &g.as_view(),
            &mut state.recurrent.as_view_mut(),
            &mut o,
        )?,
        Some(record) => {
            let nv = c.ssm_v_heads;
            for r in 0..t {
                delta_rule(
                    device,
                    &one,
                    TokenWalk::Sequential,
                    &qkv.slice(r * channels..(r + 1) * channels),
                    &beta.slice(r * nv..(r + 1) * nv),
                    &g.slice(r * nv..(r + 1) * nv),
                    &mut state.recurrent.as_view_mut(),
                    &mut o.slice_mut(r * inner..(r + 1) * inner),
                )?;
                if r + 1 < t {
                    keep_row(device, state, record, r, Part::Recurrent)?;
                }
            }
        }
    }
    gated_norm(
        device,
        &shape,
        c.rms_eps,
        &mut o,
        &z.as_view(),
        &w.norm.as_view(),
    )?;
    device.mark("DeltaNet ssm_out");
    matmul(device, &w.out.view(), &o.as_view(), out)?;
    Ok(())
}

/// Which half of a DeltaNet state.
#[derive(Clone, Copy)]
enum Part {
    Conv,
    Recurrent,
}

/// Copies that part of `state` into row `row` of `record`, within device memory.
fn keep_row(
    device: &Device,
    state: &DeltaState,
    record: &mut RecordedRows,
    row: usize,
    part: Part,
) -> Result<()> {
    let (src, all) = match (part, &mut record.recurrent) {
        (Part::Conv, _) => (&state.conv, &mut record.conv),
        (Part::Recurrent, RecordedStates::Rows(states)) => (&state.recurrent, states),
        (Part::Recurrent, RecordedStates::Replay { .. }) => {
            return Err(EngineError::BadConfig(
                "a replay recording outside the fused DeltaNet step".to_string(),
            ))
        }
    };
    let len = src.len();
    if row >= record.rows {
        return Err(EngineError::BadConfig(format!(
            "DeltaNet row state {row}: the recording holds {} rows",
            record.rows
        )));
    }
    let mut dst = all.slice_mut(row * len..(row + 1) * len);
    device
        .stream()
        .memcpy_dtod(src, &mut dst)
        .map_err(|e| EngineError::Cuda(format!("DeltaNet row state copy: {e}")))
}

/// The fused one-token step (conv, norms, gates, delta rule and gated norm in one launch per
/// layer) unless `REDLITE_FUSED_DELTANET=0` (the four kernels of a prompt's path). H200,
/// IQ2_XXS file, same call: tg128 278.5 against 263.0 t/s, tg128 @ d4096 256.0 against 243.6.
fn fused() -> bool {
    static ON: OnceLock<bool> = OnceLock::new();
    *ON.get_or_init(|| std::env::var("REDLITE_FUSED_DELTANET").as_deref() != Ok("0"))
}

/// Rows from which a verification keeps its DeltaNet states for a replay. With two rows the
/// snapshot costs what the one state after row 0 does: one draft at acceptance 0.7 measured
/// 469.45 t/s with the replay against 472.35 without, three drafts 440.19 against 433.35
/// (H100, forty-first session).
pub(super) const REPLAY_MIN_ROWS: usize = 3;

/// Whether a verification of `tokens` rows may keep its DeltaNet states for a replay (the state
/// before the step and the rows' inputs; `deltanet_replay` recomputes the kept rows) rather
/// than the state after each row: the fused step's batches, unless `REDLITE_MTP_REPLAY=0`.
pub(super) fn replays(tokens: usize) -> bool {
    static ON: OnceLock<bool> = OnceLock::new();
    let on = *ON.get_or_init(|| std::env::var("REDLITE_MTP_REPLAY").as_deref() != Ok("0"));
    on && tokens <= SMALL_BATCH_MAX_TOKENS && fused()
}

/// Prompts walk the conv and the delta rule in chunks unless `REDLITE_DELTA_CHUNKED=0`.
fn chunked() -> bool {
    static ON: OnceLock<bool> = OnceLock::new();
    *ON.get_or_init(|| std::env::var("REDLITE_DELTA_CHUNKED").as_deref() != Ok("0"))
}
