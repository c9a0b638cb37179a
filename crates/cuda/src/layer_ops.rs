//! Op entries of the qwen3next layer kernels: validate shapes, types and the limits of each
//! specialization, then hand over to `layer_launch`. Buffers are exact-length views;
//! shapes are outermost first (`[tokens][width]`).

use crate::cublas::{cublas_takes, matmul_cublas};
use crate::device::Device;
use crate::error::{CudaError, CudaOp};
use crate::layer_launch::{self as launch, DeltaDims};
use crate::mma::{matmul_mma, mma_takes, PrefillKernels};
use crate::ops::{check_matrix, fits, shape, WeightMatrix};
use crate::q8_input::{q8_rows_fit, Q8Rows, Q8RowsMut, Q8_BLOCK_VALUES};
use crate::raw::StepKeeps;
use crate::source::{CONV_KERNELS, DELTA_DK, DELTA_REPLAY_MAX_ROWS, ONE_TOKEN_KERNELS_MAX_TOKENS};
use cudarc::driver::{CudaView, CudaViewMut};

/// Grid y and z dimensions (tokens, experts per token) are at most this.
pub(crate) const MAX_GRID_YZ: u64 = 65_535;

/// A buffer that must hold at least `expected` values.
pub(crate) fn at_least(
    op: CudaOp,
    what: &'static str,
    expected: usize,
    found: usize,
) -> Result<(), CudaError> {
    match found < expected {
        true => Err(CudaError::Shape {
            op,
            what,
            expected,
            found,
        }),
        false => Ok(()),
    }
}

pub(crate) fn supported(
    op: CudaOp,
    what: &'static str,
    found: usize,
    list: &[usize],
    text: &'static str,
) -> Result<(), CudaError> {
    if list.contains(&found) {
        Ok(())
    } else {
        Err(CudaError::NoSpecialization {
            op,
            what,
            found,
            supported: text,
        })
    }
}

pub(crate) fn tokens_fit(op: CudaOp, tokens: usize) -> Result<(), CudaError> {
    fits(op, "tokens", tokens as u64, MAX_GRID_YZ)?;
    if tokens == 0 {
        return Err(CudaError::Shape {
            op,
            what: "tokens (at least 1)",
            expected: 1,
            found: 0,
        });
    }
    Ok(())
}

/// The token count of a product of a rows x cols matrix with `x_len` inputs into `y_len`
/// outputs (tokens x cols and tokens x rows), checked.
pub(crate) fn product_tokens(
    op: CudaOp,
    (rows, cols): (usize, usize),
    x_len: usize,
    y_len: usize,
) -> Result<usize, CudaError> {
    let tokens = x_len / cols.max(1);
    tokens_fit(op, tokens)?;
    shape(op, "x length (tokens x cols)", tokens * cols, x_len)?;
    shape(op, "y length (tokens x rows)", tokens * rows, y_len)?;
    Ok(tokens)
}

/// `x[t] = table[tokens[t]]` decoded to f32; `x` is tokens x cols. Ids past the table give
/// zeros (refuse them before calling).
pub fn embed(
    device: &Device,
    table: &WeightMatrix<'_>,
    tokens: &CudaView<'_, u32>,
    x: &mut CudaViewMut<'_, f32>,
) -> Result<(), CudaError> {
    let op = CudaOp::Embed;
    let (kind, _) = check_matrix(device, op, table)?;
    fits(op, "tokens", tokens.len() as u64, i32::MAX as u64)?;
    shape(
        op,
        "x length (tokens x cols)",
        tokens.len() * table.cols,
        x.len(),
    )?;
    if tokens.is_empty() {
        return Ok(());
    }
    launch::embed(
        device,
        kind,
        &table.bytes,
        tokens,
        x,
        (table.rows, table.cols),
    )
}

/// Row-wise `out = x · w / sqrt(mean(x²) + eps)`; rows of `w.len()` values.
pub fn rms_norm(
    device: &Device,
    x: &CudaView<'_, f32>,
    w: &CudaView<'_, f32>,
    out: &mut CudaViewMut<'_, f32>,
    eps: f32,
) -> Result<(), CudaError> {
    if !rms_norm_shapes(x.len(), w.len(), out.len())? {
        return Ok(());
    }
    launch::rms_norm(device, x, w, out, eps)
}

/// The MTP block's input halves side by side: row r of `concat` ([rows][2 cols]) is
/// `[rms_norm(embedded[r], enorm) ; rms_norm(hidden[r], hnorm)]`, each half the bits of
/// [`rms_norm`], in one launch.
pub fn mtp_concat_norms(
    device: &Device,
    (embedded, hidden): (&CudaView<'_, f32>, &CudaView<'_, f32>),
    (enorm, hnorm): (&CudaView<'_, f32>, &CudaView<'_, f32>),
    concat: &mut CudaViewMut<'_, f32>,
    eps: f32,
) -> Result<(), CudaError> {
    let op = CudaOp::RmsNorm;
    shape(op, "hnorm length", enorm.len(), hnorm.len())?;
    shape(op, "hidden length", embedded.len(), hidden.len())?;
    shape(op, "concat length", 2 * embedded.len(), concat.len())?;
    if !rms_norm_shapes(embedded.len(), enorm.len(), embedded.len())? {
        return Ok(());
    }
    launch::mtp_concat_norms(device, (embedded, hidden), (enorm, hnorm), concat, eps)
}

/// Checks the norms' shapes (x and out whole rows of `w_len`); false when there is nothing
/// to do.
pub(crate) fn rms_norm_shapes(
    x_len: usize,
    w_len: usize,
    out_len: usize,
) -> Result<bool, CudaError> {
    let op = CudaOp::RmsNorm;
    let cols = w_len.max(1);
    shape(op, "x length (whole rows)", x_len / cols * cols, x_len)?;
    shape(op, "out length", x_len, out_len)?;
    fits(op, "rows", (x_len / cols) as u64, i32::MAX as u64)?;
    Ok(x_len > 0 && w_len > 0)
}

/// `x += y`, then row-wise `out = x · w / sqrt(mean(x²) + eps)`: [`add`] then [`rms_norm`]
/// in one launch, the same bits.
pub fn add_rms_norm(
    device: &Device,
    x: &mut CudaViewMut<'_, f32>,
    y: &CudaView<'_, f32>,
    w: &CudaView<'_, f32>,
    out: &mut CudaViewMut<'_, f32>,
    eps: f32,
) -> Result<(), CudaError> {
    shape(CudaOp::RmsNorm, "y length", x.len(), y.len())?;
    if !rms_norm_shapes(x.len(), w.len(), out.len())? {
        return Ok(());
    }
    launch::add_rms_norm(device, x, y, w, out, eps)
}

/// `x += y`.
pub fn add(
    device: &Device,
    x: &mut CudaViewMut<'_, f32>,
    y: &CudaView<'_, f32>,
) -> Result<(), CudaError> {
    let op = CudaOp::Add;
    shape(op, "y length", x.len(), y.len())?;
    fits(op, "length", x.len() as u64, i32::MAX as u64)?;
    if x.is_empty() {
        return Ok(());
    }
    launch::add(device, x, y)
}

/// `y[t] = W x[t]` for every token: x is tokens x cols, y tokens x rows. Long prompts take
/// cuBLAS ([`cublas_takes`]), several tokens the tensor-core product where it covers the
/// matrix (`REDLITE_PREFILL_MMA=0`: never).
pub fn matmul(
    device: &Device,
    matrix: &WeightMatrix<'_>,
    x: &CudaView<'_, f32>,
    y: &mut CudaViewMut<'_, f32>,
) -> Result<(), CudaError> {
    matmul_quantized(device, matrix, (x, None), y)
}

/// [`matmul`] with x also given quantized to Q8_K (`rms_norm_quantized`), which its q8
/// kernels read instead of quantizing x in each CTA (the same codes: the same bits).
pub fn matmul_quantized(
    device: &Device,
    matrix: &WeightMatrix<'_>,
    (x, q8): (&CudaView<'_, f32>, Option<&Q8Rows<'_>>),
    y: &mut CudaViewMut<'_, f32>,
) -> Result<(), CudaError> {
    let tokens = x.len() / matrix.cols.max(1);
    if cublas_takes(device, matrix, tokens) {
        return matmul_cublas(device, matrix, x, y);
    }
    // Decode-sized batches: the q8 kernels, whose rows are the bits of one token's.
    let kernels = match tokens <= ONE_TOKEN_KERNELS_MAX_TOKENS {
        true => PrefillKernels::Dp4a,
        false => PrefillKernels::from_env(),
    };
    matmul_kernels(device, matrix, (x, q8), y, kernels)
}

/// [`matmul`] with the prompt kernels chosen by the caller (tests and benchmarks compare
/// them; never cuBLAS): `Mma` falls back to the q8 kernels where [`mma_takes`] says no.
pub fn matmul_with(
    device: &Device,
    matrix: &WeightMatrix<'_>,
    x: &CudaView<'_, f32>,
    y: &mut CudaViewMut<'_, f32>,
    kernels: PrefillKernels,
) -> Result<(), CudaError> {
    matmul_kernels(device, matrix, (x, None), y, kernels)
}

fn matmul_kernels(
    device: &Device,
    matrix: &WeightMatrix<'_>,
    (x, q8): (&CudaView<'_, f32>, Option<&Q8Rows<'_>>),
    y: &mut CudaViewMut<'_, f32>,
    kernels: PrefillKernels,
) -> Result<(), CudaError> {
    let op = CudaOp::Matmul;
    let tokens = x.len() / matrix.cols.max(1);
    if kernels == PrefillKernels::Mma && mma_takes(device, matrix, tokens) {
        return matmul_mma(device, matrix, x, y);
    }
    let (kind, _) = check_matrix(device, op, matrix)?;
    tokens_fit(op, tokens)?;
    shape(
        op,
        "x length (tokens x cols)",
        tokens * matrix.cols,
        x.len(),
    )?;
    shape(
        op,
        "y length (tokens x rows)",
        tokens * matrix.rows,
        y.len(),
    )?;
    if matrix.rows == 0 {
        return Ok(());
    }
    let q8 = q8_rows_fit(op, q8, tokens, matrix.cols)?;
    launch::matmul(
        device,
        kind,
        matrix.dots,
        &matrix.bytes,
        x,
        q8,
        y,
        (matrix.rows, matrix.cols, tokens),
    )
}

/// Sizes of one DeltaNet call (dk = dv = head_dim).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct DeltaNetShape {
    pub tokens: usize,
    pub k_heads: usize,
    pub v_heads: usize,
    pub head_dim: usize,
}

impl DeltaNetShape {
    /// q | k | v channels of the conv.
    pub fn channels(&self) -> usize {
        2 * self.k_heads * self.head_dim + self.inner()
    }

    /// v (and z, o) width.
    pub fn inner(&self) -> usize {
        self.v_heads * self.head_dim
    }

    pub(crate) fn check(&self, op: CudaOp) -> Result<DeltaDims, CudaError> {
        tokens_fit(op, self.tokens)?;
        if self.k_heads == 0 || !self.v_heads.is_multiple_of(self.k_heads) {
            return Err(CudaError::Shape {
                op,
                what: "v_heads (a multiple of k_heads)",
                expected: self.k_heads * (self.v_heads / self.k_heads.max(1)).max(1),
                found: self.v_heads,
            });
        }
        fits(op, "channels", self.channels() as u64, i32::MAX as u64)?;
        Ok(DeltaDims {
            tokens: self.tokens,
            k_heads: self.k_heads,
            v_heads: self.v_heads,
            head_dim: self.head_dim,
        })
    }
}

/// Legacy `ssm_in` output `p` (tokens x (channels + inner), grouped per key head) split into
/// `qkv` (tokens x channels) and `z` (tokens x inner).
pub fn deltanet_split(
    device: &Device,
    s: &DeltaNetShape,
    p: &CudaView<'_, f32>,
    qkv: &mut CudaViewMut<'_, f32>,
    z: &mut CudaViewMut<'_, f32>,
) -> Result<(), CudaError> {
    let op = CudaOp::DeltaNet;
    let d = s.check(op)?;
    shape(
        op,
        "p length",
        s.tokens * (s.channels() + s.inner()),
        p.len(),
    )?;
    shape(op, "qkv length", s.tokens * s.channels(), qkv.len())?;
    shape(op, "z length", s.tokens * s.inner(), z.len())?;
    launch::deltanet_split(device, &d, p, qkv, z)
}

/// How the conv and the delta rule walk a call's tokens. Both forms compute the same
/// recurrences: the conv writes the same bits, the delta rule agrees up to rounding.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum TokenWalk {
    /// One token after the other: the reference, and the form for single tokens.
    Sequential,
    /// The conv with the tokens split across threads, the delta rule in chunks of 64 tokens
    /// (`deltanet_chunked.cu`): the prompt form.
    Chunked,
}

/// Causal depthwise conv + SiLU over qkv (tokens x channels) in place, continuing from and
/// updating `state` ((width - 1) x channels); `w` is channels x width.
pub fn deltanet_conv(
    device: &Device,
    s: &DeltaNetShape,
    walk: TokenWalk,
    w: &CudaView<'_, f32>,
    state: &mut CudaViewMut<'_, f32>,
    qkv: &mut CudaViewMut<'_, f32>,
) -> Result<(), CudaError> {
    let op = CudaOp::DeltaNet;
    let d = s.check(op)?;
    let channels = s.channels();
    let width = w.len() / channels.max(1);
    supported(op, "conv kernel width", width, &CONV_KERNELS, "4")?;
    shape(op, "conv weight length", channels * width, w.len())?;
    shape(op, "conv state length", channels * (width - 1), state.len())?;
    shape(op, "qkv length", s.tokens * channels, qkv.len())?;
    launch::deltanet_conv(device, &d, walk, width, w, state, qkv)
}

/// The DeltaNet parameters of one layer as the fused decode step reads them.
pub struct DeltaNetParams<'a, 'b> {
    /// Conv taps, channels x width.
    pub conv_w: &'a CudaView<'b, f32>,
    pub a: &'a CudaView<'b, f32>,
    pub dt_bias: &'a CudaView<'b, f32>,
    /// Gated-norm weight, head_dim.
    pub norm_w: &'a CudaView<'b, f32>,
}

/// What a several-row DeltaNet step keeps for an MTP verification's rollback: the conv
/// window after each row but the last, `conv` `[rows - 1][width - 1][channels]`, and the
/// recurrent state either as it is after each of those rows or as the inputs to rebuild it
/// (`deltanet_replay`). Longer views keep their tail untouched.
pub struct StepRecord<'a> {
    pub conv: CudaViewMut<'a, f32>,
    pub recurrent: StepStates<'a>,
}

/// The recurrent half of a `StepRecord`.
pub enum StepStates<'a> {
    /// The state after each row but the last, `[rows - 1][v_heads][dk][dv]`.
    Rows(CudaViewMut<'a, f32>),
    /// The state before the step (`[v_heads][dk][dv]`, stored first, under PDL while the
    /// previous kernel runs) and each row's delta-rule inputs but the last's
    /// (`[rows - 1][replay_row_floats]`): a verification then writes one state instead of one
    /// a row, and a rollback recomputes the rows it keeps.
    Replay {
        snapshot: CudaViewMut<'a, f32>,
        inputs: CudaViewMut<'a, f32>,
    },
}

/// Floats of one row of a `StepStates::Replay`'s inputs: the normalized k of every key head,
/// the value after the conv of every value head, α and β of every value head.
pub fn replay_row_floats(s: &DeltaNetShape) -> usize {
    (s.k_heads + s.v_heads) * s.head_dim + 2 * s.v_heads
}

/// The whole DeltaNet step of `s.tokens` tokens between their projections, one row after the
/// other: conv + SiLU of `qkv` (tokens x channels, the projection output; not modified), q/k
/// L2 norms, β and g from `ba` (tokens x 2 v_heads), the delta rule on `recurrent`
/// (v_heads x dk x dv) and the gated RMSNorm with `z` (tokens x inner), into `out`
/// (tokens x inner); with `record`, the state after each row but the last is kept there.
/// Row t gives the bits of a one-row call on the state after row t - 1. Needs dk = dv
/// (`head_dim`) of 32, 64 or 128 and a conv of width 4; the same math as `deltanet_conv`,
/// `deltanet_prep`, `delta_rule` and `gated_norm` in turn. With `out_q8` (a key head's value
/// heads of 256 values in all), `out` is also quantized to Q8_K there, for the output
/// projection to read (`matmul_quantized`: the same bits as quantizing `out` itself).
#[allow(clippy::too_many_arguments)]
pub fn deltanet_step(
    device: &Device,
    s: &DeltaNetShape,
    eps: f32,
    p: &DeltaNetParams<'_, '_>,
    (qkv, z, ba): (&CudaView<'_, f32>, &CudaView<'_, f32>, &CudaView<'_, f32>),
    conv_state: &mut CudaViewMut<'_, f32>,
    recurrent: &mut CudaViewMut<'_, f32>,
    (out, out_q8): (&mut CudaViewMut<'_, f32>, Option<&mut Q8RowsMut<'_>>),
    mut record: Option<StepRecord<'_>>,
) -> Result<(), CudaError> {
    let op = CudaOp::DeltaNet;
    let d = s.check(op)?;
    fits(op, "tokens (fused step)", s.tokens as u64, i32::MAX as u64)?;
    let t = s.tokens;
    let dk = s.head_dim;
    supported(op, "head dim", dk, &DELTA_DK, "32, 64, 128")?;
    let channels = s.channels();
    let width = p.conv_w.len() / channels.max(1);
    supported(op, "conv kernel width", width, &CONV_KERNELS, "4")?;
    fits(
        op,
        "threads per key head (v_heads / k_heads x head_dim)",
        (s.v_heads / s.k_heads * dk) as u64,
        256,
    )?;
    shape(op, "conv weight length", channels * width, p.conv_w.len())?;
    let conv_len = channels * (width - 1);
    shape(op, "conv state length", conv_len, conv_state.len())?;
    shape(op, "qkv length", t * channels, qkv.len())?;
    shape(op, "z length", t * s.inner(), z.len())?;
    shape(op, "ba length", t * 2 * s.v_heads, ba.len())?;
    shape(op, "ssm_a length", s.v_heads, p.a.len())?;
    shape(op, "dt_bias length", s.v_heads, p.dt_bias.len())?;
    shape(op, "norm weight length", dk, p.norm_w.len())?;
    let state_len = s.v_heads * dk * dk;
    shape(op, "state length", state_len, recurrent.len())?;
    shape(op, "out length", t * s.inner(), out.len())?;
    if t == 0 {
        return Ok(());
    }
    // The records need room for tokens - 1 rows; longer ones keep their tail.
    let rows = t - 1;
    let record = match &mut record {
        Some(StepRecord { conv, recurrent }) => {
            let what = "conv record length (at least)";
            at_least(op, what, rows * conv_len, conv.len())?;
            Some(match recurrent {
                StepStates::Rows(states) => {
                    let what = "state record length (at least)";
                    at_least(op, what, rows * state_len, states.len())?;
                    StepKeeps::Rows(conv, states)
                }
                StepStates::Replay { snapshot, inputs } => {
                    let what = "rows kept for a replay (tokens - 1)";
                    fits(op, what, rows as u64, DELTA_REPLAY_MAX_ROWS as u64)?;
                    shape(op, "state snapshot length", state_len, snapshot.len())?;
                    let what = "replay inputs length (at least)";
                    at_least(op, what, rows * replay_row_floats(s), inputs.len())?;
                    StepKeeps::Replay(conv, snapshot, inputs)
                }
            })
        }
        None => None,
    };
    let out_q8 = match out_q8 {
        Some(q8) => {
            // Each CTA's outputs (a key head's value heads) are one Q8_K block.
            let block = s.v_heads / s.k_heads * dk;
            shape(
                op,
                "threads per key head (Q8_K output)",
                Q8_BLOCK_VALUES,
                block,
            )?;
            shape(op, "Q8_K output scales", t * s.k_heads, q8.scales.len())?;
            shape(op, "Q8_K output codes", t * s.inner(), q8.codes.len())?;
            Some((&mut q8.scales, &mut q8.codes))
        }
        None => None,
    };
    launch::deltanet_step(
        device,
        &d,
        width,
        eps,
        [qkv, z, ba, p.conv_w, p.a, p.dt_bias, p.norm_w],
        (conv_state, recurrent, out),
        record,
        out_q8,
    )
}

/// In place on qkv: L2-normalized q and k heads (q scaled by 1/sqrt(head_dim)); from `ba`
/// (tokens x 2 v_heads, grouped per key head) `beta = sigmoid(b)` and
/// `g = a · softplus(a_in + dt_bias)` (tokens x v_heads).
#[allow(clippy::too_many_arguments)]
pub fn deltanet_prep(
    device: &Device,
    s: &DeltaNetShape,
    eps: f32,
    qkv: &mut CudaViewMut<'_, f32>,
    ba: &CudaView<'_, f32>,
    a: &CudaView<'_, f32>,
    dt_bias: &CudaView<'_, f32>,
    beta: &mut CudaViewMut<'_, f32>,
    g: &mut CudaViewMut<'_, f32>,
) -> Result<(), CudaError> {
    let op = CudaOp::DeltaNet;
    let d = s.check(op)?;
    shape(op, "qkv length", s.tokens * s.channels(), qkv.len())?;
    shape(op, "ba length", s.tokens * 2 * s.v_heads, ba.len())?;
    shape(op, "ssm_a length", s.v_heads, a.len())?;
    shape(op, "dt_bias length", s.v_heads, dt_bias.len())?;
    shape(op, "beta length", s.tokens * s.v_heads, beta.len())?;
    shape(op, "g length", s.tokens * s.v_heads, g.len())?;
    launch::deltanet_prep(device, &d, eps, qkv, ba, a, dt_bias, beta, g)
}

/// The delta rule over the tokens, token by token or in chunks (`walk`): reads q, k, v from
/// qkv, updates `state` (v_heads x dk x dv) and writes `out` (tokens x v_heads x dv).
#[allow(clippy::too_many_arguments)]
pub fn delta_rule(
    device: &Device,
    s: &DeltaNetShape,
    walk: TokenWalk,
    qkv: &CudaView<'_, f32>,
    beta: &CudaView<'_, f32>,
    g: &CudaView<'_, f32>,
    state: &mut CudaViewMut<'_, f32>,
    out: &mut CudaViewMut<'_, f32>,
) -> Result<(), CudaError> {
    let op = CudaOp::DeltaRule;
    let d = s.check(op)?;
    supported(op, "head dim", s.head_dim, &DELTA_DK, "32, 64, 128")?;
    shape(op, "qkv length", s.tokens * s.channels(), qkv.len())?;
    shape(op, "beta length", s.tokens * s.v_heads, beta.len())?;
    shape(op, "g length", s.tokens * s.v_heads, g.len())?;
    shape(
        op,
        "state length",
        s.v_heads * s.head_dim * s.head_dim,
        state.len(),
    )?;
    shape(op, "out length", s.tokens * s.inner(), out.len())?;
    launch::delta_rule(device, &d, walk, (qkv, beta, g), state, out)
}

/// Per (token, v-head): `o ← RMSNorm(o) · w · silu(z)`; o and z tokens x inner, w head_dim.
pub fn gated_norm(
    device: &Device,
    s: &DeltaNetShape,
    eps: f32,
    o: &mut CudaViewMut<'_, f32>,
    z: &CudaView<'_, f32>,
    w: &CudaView<'_, f32>,
) -> Result<(), CudaError> {
    let op = CudaOp::DeltaNet;
    let d = s.check(op)?;
    shape(op, "o length", s.tokens * s.inner(), o.len())?;
    shape(op, "z length", s.tokens * s.inner(), z.len())?;
    shape(op, "norm length", s.head_dim, w.len())?;
    launch::gated_norm(device, &d, eps, o, z, w)
}
