//! Int8 tensor-core products for prompts (`mma.cu`): the dense projections of several
//! tokens, and the routed experts' gate/up (SwiGLU fused) and down with the pairs grouped by
//! expert. Activations are quantized to Q8_K once per product into device scratch (the codes
//! and scales the q8 kernels compute per CTA), weights are decoded per CTA into shared memory.
//! Same integer sums as the q8 (dp4a) kernels; the f32 order of the scaled sums differs.
//!
//! `REDLITE_PREFILL_MMA=0` keeps the q8 kernels for every product; fewer than
//! [`mma_min_tokens`] tokens (decode, MTP verification) never take these. Needs sm_80
//! (mma.sync on int8).

use std::sync::OnceLock;

use cudarc::driver::{CudaSlice, CudaView, CudaViewMut};

use crate::device::Device;
use crate::error::{CudaError, CudaOp};
use crate::layer_launch::{config, to_i32};
use crate::layer_ops::{product_tokens, tokens_fit, MAX_GRID_YZ};
use crate::mma_groups::{MmaGroups, MMA_WIDE_TILE};
use crate::moe_ops::check_gate_up;
use crate::ops::{check_matrix, fits, shape, WeightMatrix};
use crate::raw;
use crate::source::{
    self, MmaShape, WeightKind, MMA_COMBINE_KERNEL, MMA_DENSE, MMA_DOWN, MMA_DOWN_WIDE,
    MMA_GATE_UP, MMA_GATE_UP_WIDE, MMA_QUANTIZE_KERNEL, MMA_TYPES,
};

/// Which kernels a product of several tokens takes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum PrefillKernels {
    /// The q8 (dp4a) kernels: token tiles for dense products, per (token, slot) pairs for
    /// experts.
    Dp4a,
    /// The int8 tensor-core kernels where the type, the dots and the device allow.
    Mma,
}

impl PrefillKernels {
    /// `Mma` unless `REDLITE_PREFILL_MMA=0`.
    pub fn from_env() -> Self {
        static ON: OnceLock<bool> = OnceLock::new();
        match *ON.get_or_init(|| std::env::var("REDLITE_PREFILL_MMA").as_deref() != Ok("0")) {
            true => PrefillKernels::Mma,
            false => PrefillKernels::Dp4a,
        }
    }
}

const _: () = assert!(MMA_GATE_UP.tokens() == MMA_DOWN.tokens());
const _: () = assert!(MMA_GATE_UP_WIDE.tokens() == MMA_DOWN_WIDE.tokens());

/// Whether `matrix` has a tensor-core product on `device` for `tokens` tokens: at least
/// [`mma_min_tokens`] tokens, q8 dots on a covered type, at least [`MMA_MIN_ROWS`] rows,
/// sm_80 or newer.
pub fn mma_takes(device: &Device, matrix: &WeightMatrix<'_>, tokens: usize) -> bool {
    tokens >= mma_min_tokens()
        && matrix.rows >= MMA_MIN_ROWS
        && matrix.dots.quantizes(matrix.ty)
        && MMA_TYPES.contains(&matrix.ty)
        && arch_has_mma(device.arch())
}

/// Fewer rows (the shared-expert gate's one, DeltaNet's beta / alpha) keep the q8 token
/// tiles: a CTA of the dense shape decodes 128 rows, and such a matrix would run on
/// tokens / 64 CTAs only. A guess, to measure.
pub const MMA_MIN_ROWS: usize = 64;

/// Fewest tokens for the tensor-core products: 16 unless `REDLITE_PREFILL_MMA_MIN_TOKENS`
/// says otherwise (at least 2; one token is decode, always the q8 kernels). A handful of
/// tokens (MTP verification: 2 to 4) keeps the q8 token tiles, whose CTAs need no staging
/// and no quantization launch; where the crossover lies is to measure.
pub fn mma_min_tokens() -> usize {
    static MIN: OnceLock<usize> = OnceLock::new();
    *MIN.get_or_init(|| {
        std::env::var("REDLITE_PREFILL_MMA_MIN_TOKENS")
            .ok()
            .and_then(|v| v.parse().ok())
            .map_or(16, |v: usize| v.max(2))
    })
}

/// sm_80 and newer (`sm_XY` or `sm_XYZ`, an optional letter after).
fn arch_has_mma(arch: &str) -> bool {
    let digits: String = arch
        .trim_start_matches("sm_")
        .chars()
        .take_while(char::is_ascii_digit)
        .collect();
    digits.parse::<u32>().is_ok_and(|v| v >= 80)
}

/// Activations quantized to Q8_K: a scale per 256 values and the int8 codes.
struct Quantized {
    d: CudaSlice<f32>,
    q: CudaSlice<i8>,
}

/// `x` (whole 256-value blocks) quantized into fresh scratch.
fn quantize(device: &Device, x: &CudaView<'_, f32>) -> Result<Quantized, CudaError> {
    let blocks = x.len() / 256;
    let mut d = raw::scratch::<f32>(device.stream(), blocks)?;
    let mut q = raw::scratch::<i8>(device.stream(), blocks * 256)?;
    if blocks > 0 {
        let kernel = device.kernel(MMA_QUANTIZE_KERNEL)?;
        let cfg = config((blocks.div_ceil(16), 1, 1), 128, 0);
        raw::launch_mma_quantize(
            device.stream(),
            kernel,
            cfg,
            x,
            &mut d,
            &mut q,
            to_i32(blocks),
        )?;
    }
    Ok(Quantized { d, q })
}

/// The covered kernel kind of `matrix`, or the error naming its type.
fn mma_kind(
    device: &Device,
    op: CudaOp,
    matrix: &WeightMatrix<'_>,
) -> Result<WeightKind, CudaError> {
    let (kind, _) = check_matrix(device, op, matrix)?;
    if !MMA_TYPES.contains(&matrix.ty) || !matrix.dots.quantizes(matrix.ty) {
        return Err(CudaError::UnsupportedType { op, ty: matrix.ty });
    }
    if !arch_has_mma(device.arch()) {
        let arch = device.arch().to_string();
        return Err(CudaError::NeedsArch { op, arch });
    }
    Ok(kind)
}

/// `y[t] = W x[t]` through the tensor cores (x tokens x cols, y tokens x rows); refuses a
/// type without an mma product.
pub fn matmul_mma(
    device: &Device,
    matrix: &WeightMatrix<'_>,
    x: &CudaView<'_, f32>,
    y: &mut CudaViewMut<'_, f32>,
) -> Result<(), CudaError> {
    let op = CudaOp::Matmul;
    let kind = mma_kind(device, op, matrix)?;
    let (rows, cols) = (matrix.rows, matrix.cols);
    let tokens = product_tokens(op, (rows, cols), x.len(), y.len())?;
    if rows == 0 {
        return Ok(());
    }
    let quantized = quantize(device, x)?;
    let s = MMA_DENSE;
    let kernel = device.kernel(&source::mma_matmul_kernel(kind, s))?;
    let grid = (rows.div_ceil(s.rows()), tokens.div_ceil(s.tokens()), 1);
    let cfg = config(grid, s.threads(), s.shared_bytes());
    crate::profile::label(|| format!("matmul mma {} {rows}x{cols} t{tokens}", kind.cuda_name));
    raw::launch_mma_matmul(
        device.stream(),
        kernel,
        cfg,
        (&matrix.bytes, None, 0),
        None,
        (&quantized.q, &quantized.d),
        y,
        (to_i32(rows), to_i32(cols), to_i32(tokens)),
    )
}

/// `act[t * used + k] = silu(gate_e x[t]) * up_e x[t]` for the pairs of `tiles` (e the pair's
/// expert): `gate` / `up` are stacks of n_expert x ff rows, act tokens x used x ff.
pub fn moe_gate_up_mma(
    device: &Device,
    gate: &WeightMatrix<'_>,
    up: &WeightMatrix<'_>,
    ff: usize,
    tiles: &MmaGroups,
    x: &CudaView<'_, f32>,
    act: &mut CudaViewMut<'_, f32>,
) -> Result<(), CudaError> {
    let op = CudaOp::MoeGateUp;
    let kind = mma_kind(device, op, gate)?;
    mma_kind(device, op, up)?;
    let (tokens, used) = (tiles.tokens, tiles.used);
    let counts = (tokens, used);
    check_gate_up(
        op,
        (gate, up),
        (ff, tiles.n_expert),
        counts,
        (x.len(), act.len()),
    )?;
    fits(op, "tiles", tiles.tiles as u64, MAX_GRID_YZ)?;
    if tiles.tiles == 0 || ff == 0 {
        return Ok(());
    }
    let grouped = Grouped {
        kind,
        shape: if tiles.tile == MMA_WIDE_TILE {
            MMA_GATE_UP_WIDE
        } else {
            MMA_GATE_UP
        },
        name: "moe_gate_up",
        stacks: (&gate.bytes, Some(&up.bytes)),
        rows: ff,
        cols: gate.cols,
        outputs: (used, tokens),
    };
    grouped.launch(device, tiles, x, act)
}

/// One grouped product over the expert tiles of an [`MmaGroups`]: `rows` rows of each tile's
/// expert in `stacks` (gate and up for gate/up), rows of `cols` values; `outputs` = (output
/// slots per token the kernel indexes by, token count it is given).
struct Grouped<'a, 'b> {
    kind: WeightKind,
    shape: MmaShape,
    name: &'static str,
    stacks: (&'a CudaView<'b, u8>, Option<&'a CudaView<'b, u8>>),
    rows: usize,
    cols: usize,
    outputs: (usize, usize),
}

impl Grouped<'_, '_> {
    /// Quantizes `x` (the tiles' inputs) and launches the product into `out`.
    fn launch(
        &self,
        device: &Device,
        tiles: &MmaGroups,
        x: &CudaView<'_, f32>,
        out: &mut CudaViewMut<'_, f32>,
    ) -> Result<(), CudaError> {
        let (kind, s, rows, cols) = (self.kind, self.shape, self.rows, self.cols);
        let quantized = quantize(device, x)?;
        let kernel = device.kernel(&source::mma_matmul_kernel(kind, s))?;
        let grid = (rows.div_ceil(s.rows()), tiles.tiles, 1);
        let cfg = config(grid, s.threads(), s.shared_bytes());
        let expert_bytes = rows * cols / kind.ty.block_values() * kind.ty.block_bytes();
        let name = self.name;
        crate::profile::label(|| format!("{name} mma {} {rows}x{cols}", kind.cuda_name));
        let (slots, tokens) = self.outputs;
        raw::launch_mma_matmul(
            device.stream(),
            kernel,
            cfg,
            (self.stacks.0, self.stacks.1, expert_bytes as i64),
            Some((&tiles.info.as_view(), &tiles.pairs.as_view(), to_i32(slots))),
            (&quantized.q, &quantized.d),
            out,
            (to_i32(rows), to_i32(cols), to_i32(tokens)),
        )
    }
}

/// `out[t] = (accumulate ? out[t] : 0) + Σ_k weights[t][k] down_e act[t * used + k]` for the
/// pairs of `tiles`: `down` a stack of n_expert x rows rows of ff values, act tokens x used x
/// ff, out tokens x rows. Two passes: the products per pair into scratch (tokens x used x
/// rows, [`moe_down_mma_pairs`]), then the weighted sum in slot order
/// ([`moe_down_mma_combine`]), so the result does not depend on the order tiles finish in (an
/// atomicAdd scatter would).
#[allow(clippy::too_many_arguments)]
pub fn moe_down_mma(
    device: &Device,
    down: &WeightMatrix<'_>,
    rows: usize,
    tiles: &MmaGroups,
    weights: &CudaView<'_, f32>,
    act: &CudaView<'_, f32>,
    out: &mut CudaViewMut<'_, f32>,
    accumulate: bool,
) -> Result<(), CudaError> {
    let (tokens, used) = (tiles.tokens, tiles.used);
    let mut per_pair = raw::scratch::<f32>(device.stream(), tokens * used * rows)?;
    let mut view = per_pair.slice_mut(..tokens * used * rows);
    moe_down_mma_pairs(device, down, rows, tiles, act, &mut view)?;
    let ids = tiles.ids.as_ref().map(|ids| ids.as_view());
    let skip = ids.as_ref().map(|ids| (ids, tiles.n_expert));
    moe_down_mma_combine(device, &view.as_view(), weights, skip, out, accumulate)
}

/// The first pass of [`moe_down_mma`]: `per_pair[t * used + k] = down_e act[t * used + k]`
/// (tokens x used x rows) for the pairs of `tiles`; the others are left as they are, so
/// launches over disjoint groupings (an expert cache's waves) fill one buffer.
pub fn moe_down_mma_pairs(
    device: &Device,
    down: &WeightMatrix<'_>,
    rows: usize,
    tiles: &MmaGroups,
    act: &CudaView<'_, f32>,
    per_pair: &mut CudaViewMut<'_, f32>,
) -> Result<(), CudaError> {
    let op = CudaOp::MoeDown;
    let kind = mma_kind(device, op, down)?;
    let ff = down.cols;
    let (tokens, used) = (tiles.tokens, tiles.used);
    shape(
        op,
        "stack rows (experts x rows)",
        tiles.n_expert * rows,
        down.rows,
    )?;
    tokens_fit(op, tokens)?;
    shape(
        op,
        "act length (tokens x used x ff)",
        tokens * used * ff,
        act.len(),
    )?;
    shape(
        op,
        "per-pair length (tokens x used x rows)",
        tokens * used * rows,
        per_pair.len(),
    )?;
    fits(op, "tiles", tiles.tiles as u64, MAX_GRID_YZ)?;
    if tokens == 0 || rows == 0 || tiles.tiles == 0 {
        return Ok(());
    }
    // Each pair is its own output row: one slot per "token", tokens x used of them.
    let grouped = Grouped {
        kind,
        shape: if tiles.tile == MMA_WIDE_TILE {
            MMA_DOWN_WIDE
        } else {
            MMA_DOWN
        },
        name: "moe_down",
        stacks: (&down.bytes, None),
        rows,
        cols: ff,
        outputs: (1, tokens * used),
    };
    grouped.launch(device, tiles, act, per_pair)
}

/// The second pass of [`moe_down_mma`]: `out[t] = (accumulate ? out[t] : 0) + Σ_k
/// weights[t][k] per_pair[t * used + k]`, k in order; with `skip` = (ids, n_expert) the slots
/// whose id is outside [0, n_expert) are left out (they joined no tile).
pub fn moe_down_mma_combine(
    device: &Device,
    per_pair: &CudaView<'_, f32>,
    weights: &CudaView<'_, f32>,
    skip: Option<(&CudaView<'_, i32>, usize)>,
    out: &mut CudaViewMut<'_, f32>,
    accumulate: bool,
) -> Result<(), CudaError> {
    let op = CudaOp::MoeDown;
    let tokens_rows = out.len();
    let pairs = weights.len();
    let rows = per_pair.len().checked_div(pairs).unwrap_or(0);
    let tokens = tokens_rows.checked_div(rows).unwrap_or(0);
    if tokens == 0 {
        return Ok(());
    }
    tokens_fit(op, tokens)?;
    let used = pairs / tokens;
    shape(op, "weights length (tokens x used)", tokens * used, pairs)?;
    shape(op, "out length (tokens x rows)", tokens * rows, tokens_rows)?;
    shape(op, "per-pair length", pairs * rows, per_pair.len())?;
    if let Some((ids, _)) = &skip {
        shape(op, "ids length (tokens x used)", pairs, ids.len())?;
    }
    let kernel = device.kernel(MMA_COMBINE_KERNEL)?;
    let cfg = config((rows.div_ceil(256), tokens, 1), 256, 0);
    crate::profile::label(|| format!("moe_down mma combine {rows} used{used}"));
    let (ids, n_expert) = match skip {
        Some((ids, n)) => (Some(ids), n),
        None => (None, 0),
    };
    raw::launch_mma_combine(
        device.stream(),
        kernel,
        cfg,
        (per_pair, weights, ids),
        out,
        (
            to_i32(rows),
            to_i32(used),
            to_i32(n_expert),
            i32::from(accumulate),
        ),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn mma_needs_sm80() {
        assert!(arch_has_mma("sm_80") && arch_has_mma("sm_90a") && arch_has_mma("sm_120"));
        assert!(!arch_has_mma("sm_75") && !arch_has_mma("bogus"));
    }
}
