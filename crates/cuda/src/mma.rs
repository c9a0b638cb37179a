//! Int8 tensor-core products for prompts (`mma.cu`): the dense projections of several
//! tokens, and the routed experts' gate/up (SwiGLU fused) and down with the pairs grouped by
//! expert. Activations are quantized to Q8_K once per product into device scratch (the codes
//! and scales the q8 kernels compute per CTA), weights are decoded per CTA into shared memory.
//! Same integer sums as the q8 (dp4a) kernels; the f32 order of the scaled sums differs.
//!
//! `REDLITE_PREFILL_MMA=0` keeps the q8 kernels for every product; one token (decode) never
//! takes these. Needs sm_80 (mma.sync on int8).

use std::sync::OnceLock;

use cudarc::driver::{CudaSlice, CudaView, CudaViewMut};

use crate::device::Device;
use crate::error::{CudaError, CudaOp};
use crate::layer_launch::{config, to_i32};
use crate::layer_ops::{tokens_fit, MAX_GRID_YZ};
use crate::ops::{check_matrix, fits, shape, WeightMatrix};
use crate::raw;
use crate::source::{
    self, WeightKind, MMA_COMBINE_KERNEL, MMA_DENSE, MMA_DOWN, MMA_GATE_UP, MMA_QUANTIZE_KERNEL,
    MMA_TYPES,
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

/// Pairs (tokens) per expert tile: the gate/up and down shapes share the tiles.
pub const MMA_TILE: usize = MMA_GATE_UP.tokens();
const _: () = assert!(MMA_GATE_UP.tokens() == MMA_DOWN.tokens());

/// Whether `matrix` has a tensor-core product on `device` for `tokens` tokens: several
/// tokens, q8 dots on a covered type, at least [`MMA_MIN_ROWS`] rows, sm_80 or newer.
pub fn mma_takes(device: &Device, matrix: &WeightMatrix<'_>, tokens: usize) -> bool {
    tokens > 1
        && matrix.rows >= MMA_MIN_ROWS
        && matrix.dots.quantizes(matrix.ty)
        && MMA_TYPES.contains(&matrix.ty)
        && arch_has_mma(device.arch())
}

/// Fewer rows (the shared-expert gate's one, DeltaNet's beta / alpha) keep the q8 token
/// tiles: a CTA of the dense shape decodes 128 rows, and such a matrix would run on
/// tokens / 64 CTAs only. A guess, to measure.
pub const MMA_MIN_ROWS: usize = 64;

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
        return Err(CudaError::UnsupportedType { op, ty: matrix.ty });
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
    let tokens = x.len() / cols.max(1);
    tokens_fit(op, tokens)?;
    shape(op, "x length (tokens x cols)", tokens * cols, x.len())?;
    shape(op, "y length (tokens x rows)", tokens * rows, y.len())?;
    if rows == 0 || tokens == 0 {
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

/// The (token, slot) pairs of one call grouped by expert, in tiles of [`MMA_TILE`]: built on
/// the host from the router's ids, so every expert and pair in them is in range.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct MmaTiles {
    /// (expert, first, count) per tile; `first` indexes `pairs`.
    info: Vec<i32>,
    /// The pairs `t * used + k` ordered by expert (stable: by pair within an expert).
    pairs: Vec<i32>,
    tokens: usize,
    used: usize,
    n_expert: usize,
}

impl MmaTiles {
    /// Tiles for `ids` (tokens x used). `None` when an id is out of range (callers take the
    /// per-pair kernels, which give such pairs zeros) or the tiles exceed a launch's grid.
    pub fn new(ids: &[i32], used: usize, n_expert: usize) -> Option<MmaTiles> {
        let used = used.max(1);
        let mut by_expert: Vec<Vec<i32>> = vec![Vec::new(); n_expert];
        for (pair, &e) in ids.iter().enumerate() {
            let list = usize::try_from(e).ok().and_then(|e| by_expert.get_mut(e))?;
            list.push(i32::try_from(pair).ok()?);
        }
        let mut tiles = MmaTiles {
            info: Vec::new(),
            pairs: Vec::with_capacity(ids.len()),
            tokens: ids.len() / used,
            used,
            n_expert,
        };
        for (expert, list) in by_expert.iter().enumerate() {
            for chunk in list.chunks(MMA_TILE) {
                let first = i32::try_from(tiles.pairs.len()).ok()?;
                let count = i32::try_from(chunk.len()).ok()?;
                tiles
                    .info
                    .extend([i32::try_from(expert).ok()?, first, count]);
                tiles.pairs.extend_from_slice(chunk);
            }
        }
        (tiles.len() as u64 <= MAX_GRID_YZ).then_some(tiles)
    }

    /// Every token as one pair of a one-expert stack (the shared expert).
    pub fn dense(tokens: usize) -> Option<MmaTiles> {
        MmaTiles::new(&vec![0; tokens], 1, 1)
    }

    /// Number of tiles.
    pub fn len(&self) -> usize {
        self.info.len() / 3
    }

    pub fn is_empty(&self) -> bool {
        self.info.is_empty()
    }

    pub fn tokens(&self) -> usize {
        self.tokens
    }

    pub fn used(&self) -> usize {
        self.used
    }
}

/// `act[t * used + k] = silu(gate_e x[t]) * up_e x[t]` for the pairs of `tiles` (e the pair's
/// expert): `gate` / `up` are stacks of n_expert x ff rows, act tokens x used x ff.
pub fn moe_gate_up_mma(
    device: &Device,
    gate: &WeightMatrix<'_>,
    up: &WeightMatrix<'_>,
    ff: usize,
    tiles: &MmaTiles,
    x: &CudaView<'_, f32>,
    act: &mut CudaViewMut<'_, f32>,
) -> Result<(), CudaError> {
    let op = CudaOp::MoeGateUp;
    let kind = mma_kind(device, op, gate)?;
    mma_kind(device, op, up)?;
    if up.ty != gate.ty {
        return Err(CudaError::UnsupportedType { op, ty: up.ty });
    }
    shape(op, "up rows", gate.rows, up.rows)?;
    shape(op, "up cols", gate.cols, up.cols)?;
    shape(
        op,
        "stack rows (experts x ff)",
        tiles.n_expert * ff,
        gate.rows,
    )?;
    let cols = gate.cols;
    let (tokens, used) = (tiles.tokens, tiles.used);
    tokens_fit(op, tokens)?;
    shape(op, "x length (tokens x cols)", tokens * cols, x.len())?;
    shape(
        op,
        "act length (tokens x used x ff)",
        tokens * used * ff,
        act.len(),
    )?;
    fits(op, "tiles", tiles.len() as u64, MAX_GRID_YZ)?;
    if tiles.is_empty() || ff == 0 {
        return Ok(());
    }
    let quantized = quantize(device, x)?;
    let info = device.upload(&tiles.info)?;
    let pairs = device.upload(&tiles.pairs)?;
    let s = MMA_GATE_UP;
    let kernel = device.kernel(&source::mma_matmul_kernel(kind, s))?;
    let cfg = config(
        (ff.div_ceil(s.rows()), tiles.len(), 1),
        s.threads(),
        s.shared_bytes(),
    );
    let expert_bytes = ff * cols / kind.ty.block_values() * kind.ty.block_bytes();
    crate::profile::label(|| format!("moe_gate_up mma {} {ff}x{cols}", kind.cuda_name));
    raw::launch_mma_matmul(
        device.stream(),
        kernel,
        cfg,
        (&gate.bytes, Some(&up.bytes), expert_bytes as i64),
        Some((&info.as_view(), &pairs.as_view(), to_i32(used))),
        (&quantized.q, &quantized.d),
        act,
        (to_i32(ff), to_i32(cols), to_i32(tokens)),
    )
}

/// `out[t] = (accumulate ? out[t] : 0) + Σ_k weights[t][k] down_e act[t * used + k]` for the
/// pairs of `tiles`: `down` a stack of n_expert x rows rows of ff values, act tokens x used x
/// ff, out tokens x rows. Two passes: the products per pair into scratch (tokens x used x
/// rows), then the weighted sum in slot order, so the result does not depend on the order
/// tiles finish in (an atomicAdd scatter would).
#[allow(clippy::too_many_arguments)]
pub fn moe_down_mma(
    device: &Device,
    down: &WeightMatrix<'_>,
    rows: usize,
    tiles: &MmaTiles,
    weights: &CudaView<'_, f32>,
    act: &CudaView<'_, f32>,
    out: &mut CudaViewMut<'_, f32>,
    accumulate: bool,
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
        "weights length (tokens x used)",
        tokens * used,
        weights.len(),
    )?;
    shape(
        op,
        "act length (tokens x used x ff)",
        tokens * used * ff,
        act.len(),
    )?;
    shape(op, "out length (tokens x rows)", tokens * rows, out.len())?;
    fits(op, "tiles", tiles.len() as u64, MAX_GRID_YZ)?;
    if tokens == 0 || rows == 0 {
        return Ok(());
    }
    let quantized = quantize(device, act)?;
    let mut per_pair = raw::scratch::<f32>(device.stream(), tokens * used * rows)?;
    if !tiles.is_empty() {
        let info = device.upload(&tiles.info)?;
        let pairs = device.upload(&tiles.pairs)?;
        let s = MMA_DOWN;
        let kernel = device.kernel(&source::mma_matmul_kernel(kind, s))?;
        let cfg = config(
            (rows.div_ceil(s.rows()), tiles.len(), 1),
            s.threads(),
            s.shared_bytes(),
        );
        let expert_bytes = rows * ff / kind.ty.block_values() * kind.ty.block_bytes();
        crate::profile::label(|| format!("moe_down mma {} {rows}x{ff}", kind.cuda_name));
        raw::launch_mma_matmul(
            device.stream(),
            kernel,
            cfg,
            (&down.bytes, None, expert_bytes as i64),
            Some((&info.as_view(), &pairs.as_view(), 1)),
            (&quantized.q, &quantized.d),
            &mut per_pair.as_view_mut(),
            (to_i32(rows), to_i32(ff), to_i32(tokens * used)),
        )?;
    }
    let kernel = device.kernel(MMA_COMBINE_KERNEL)?;
    let cfg = config((rows.div_ceil(256), tokens, 1), 256, 0);
    crate::profile::label(|| format!("moe_down mma combine {rows} used{used}"));
    raw::launch_mma_combine(
        device.stream(),
        kernel,
        cfg,
        &per_pair,
        weights,
        out,
        (to_i32(rows), to_i32(used), i32::from(accumulate)),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pairs_are_grouped_by_expert_in_tiles() {
        // 3 tokens, 2 slots, 4 experts: expert 1 takes pairs 0, 2, 5; expert 2 pairs 1, 4.
        let ids = [1, 2, 1, 0, 2, 1];
        let tiles = MmaTiles::new(&ids, 2, 4).unwrap();
        assert_eq!(tiles.info, vec![0, 0, 1, 1, 1, 3, 2, 4, 2]);
        assert_eq!(tiles.pairs, vec![3, 0, 2, 5, 1, 4]);
        assert_eq!((tiles.tokens(), tiles.used()), (3, 2));
    }

    #[test]
    fn full_experts_take_several_tiles_and_bad_ids_none() {
        let tiles = MmaTiles::dense(MMA_TILE + 1).unwrap();
        assert_eq!(tiles.len(), 2);
        assert_eq!(&tiles.info[3..], &[0, MMA_TILE as i32, 1]);
        assert!(MmaTiles::new(&[0, 5], 1, 2).is_none());
        assert!(MmaTiles::new(&[-1], 1, 2).is_none());
    }

    #[test]
    fn mma_needs_sm80() {
        assert!(arch_has_mma("sm_80") && arch_has_mma("sm_90a") && arch_has_mma("sm_120"));
        assert!(!arch_has_mma("sm_75") && !arch_has_mma("bogus"));
    }
}
