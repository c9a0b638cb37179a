//! Expert gate/up for prompts with the routed (token, slot) pairs grouped by expert: the
//! router's ids come to the host once per layer, the pairs of each expert are cut into tiles
//! of [`GROUP_TILE`], and one launch (`moe_gate_up_q8_grouped_kernel`) reads each expert's
//! rows once per tile instead of once per pair. Same values as [`crate::moe_gate_up`] with
//! the q8 dots, bit for bit (the kernel's comment says why).

use cudarc::driver::{CudaView, CudaViewMut};

use crate::device::Device;
use crate::error::{CudaError, CudaOp};
use crate::layer_launch::{config, q8_shared_bytes, to_i32, SHARED_MAX_BYTES};
use crate::layer_ops::MAX_GRID_YZ;
use crate::moe_ops::{check_gate_up, SharedGateUp};
use crate::ops::{check_matrix, fits, shape, WeightMatrix};
use crate::source::{self, LAYER_WARPS, MOE_LANES};
use crate::{moe_folds_shared, raw};

/// Pairs per tile (one CTA): at 512 prompt tokens, 10 of 512 experts each, an expert has ~10
/// pairs; more would leave tiles mostly empty.
pub const GROUP_TILE: usize = 8;

/// Tiles of pairs per expert, built from the router's ids by [`ExpertTiles::new`] (so every
/// expert and pair in them is in range).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ExpertTiles {
    /// Each tile's expert; -1 for the shared expert.
    experts: Vec<i32>,
    /// `GROUP_TILE` per tile: pairs `t * used + k` (tokens `t` for the shared expert), packed
    /// first, -1 after.
    pairs: Vec<i32>,
    tokens: usize,
    used: usize,
    n_expert: usize,
}

impl ExpertTiles {
    /// The tiles for `ids` (tokens x used, the router's choice), and one tile set for the
    /// shared expert over every token when `shared` is set. `None` when an id is out of range
    /// (the caller takes the ungrouped launch, which gives such pairs zeros) or the tiles are
    /// more than a launch's grid holds.
    pub fn new(ids: &[i32], used: usize, n_expert: usize, shared: bool) -> Option<ExpertTiles> {
        let tokens = ids.len() / used.max(1);
        let mut by_expert: Vec<Vec<i32>> = vec![Vec::new(); n_expert];
        for (pair, &e) in ids.iter().enumerate() {
            let list = usize::try_from(e).ok().and_then(|e| by_expert.get_mut(e))?;
            list.push(i32::try_from(pair).ok()?);
        }
        let mut tiles = ExpertTiles {
            experts: Vec::new(),
            pairs: Vec::new(),
            tokens,
            used,
            n_expert,
        };
        for (e, list) in by_expert.iter().enumerate() {
            tiles.push(i32::try_from(e).ok()?, list);
        }
        if shared {
            let all: Vec<i32> = (0..i32::try_from(tokens).ok()?).collect();
            tiles.push(-1, &all);
        }
        (tiles.len() as u64 <= MAX_GRID_YZ).then_some(tiles)
    }

    fn push(&mut self, expert: i32, pairs: &[i32]) {
        for chunk in pairs.chunks(GROUP_TILE) {
            self.experts.push(expert);
            self.pairs.extend_from_slice(chunk);
            self.pairs
                .extend(std::iter::repeat_n(-1, GROUP_TILE - chunk.len()));
        }
    }

    /// Number of tiles (CTAs per row group).
    pub fn len(&self) -> usize {
        self.experts.len()
    }

    pub fn is_empty(&self) -> bool {
        self.experts.is_empty()
    }
}

/// [`crate::moe_gate_up`] with the pairs grouped by expert (`tiles`, from this call's ids):
/// for the types and dots that quantize activations (`Dots::Q8K`); others are refused.
#[allow(clippy::too_many_arguments)]
pub fn moe_gate_up_grouped(
    device: &Device,
    gate: &WeightMatrix<'_>,
    up: &WeightMatrix<'_>,
    ff: usize,
    tiles: &ExpertTiles,
    x: &CudaView<'_, f32>,
    act: &mut CudaViewMut<'_, f32>,
    shared: Option<SharedGateUp<'_, '_>>,
) -> Result<(), CudaError> {
    let op = CudaOp::MoeGateUp;
    let (kind, _) = check_matrix(device, op, gate)?;
    check_matrix(device, op, up)?;
    if !gate.dots.quantizes(gate.ty) {
        return Err(CudaError::UnsupportedType { op, ty: gate.ty });
    }
    let cols = gate.cols;
    let (tokens, used) = (tiles.tokens, tiles.used);
    let counts = (tokens, used);
    check_gate_up(
        op,
        (gate, up),
        (ff, tiles.n_expert),
        counts,
        (x.len(), act.len()),
    )?;
    let tile_bytes = q8_shared_bytes(GROUP_TILE * cols);
    fits(op, "tile bytes", tile_bytes as u64, SHARED_MAX_BYTES as u64)?;
    fits(op, "tiles", tiles.len() as u64, MAX_GRID_YZ)?;
    let has_shared = tiles.experts.last() == Some(&-1);
    let shared = match (shared, has_shared) {
        (None, false) => None,
        (Some((s_gate, s_up, s_act)), true) => {
            if !moe_folds_shared(gate, s_gate) || !moe_folds_shared(up, s_up) {
                return Err(CudaError::UnsupportedType { op, ty: s_gate.ty });
            }
            shape(op, "shared up rows", s_gate.rows, s_up.rows)?;
            shape(op, "shared act length", tokens * s_gate.rows, s_act.len())?;
            Some((&s_gate.bytes, &s_up.bytes, s_act, s_gate.rows))
        }
        _ => {
            return Err(CudaError::Shape {
                op,
                what: "shared expert (tiles and arguments disagree)",
                expected: usize::from(has_shared),
                found: 1 - usize::from(has_shared),
            })
        }
    };
    if tiles.is_empty() || ff == 0 {
        return Ok(());
    }
    let items = cols / kind.ty.block_values() * kind.items_per_block;
    // The ungrouped q8 kernel's lanes per row, so each (pair, row) sums in its order.
    let lanes = if items <= MOE_LANES[0] {
        MOE_LANES[0]
    } else {
        MOE_LANES[1]
    };
    let kernel = device.kernel(&source::moe_gate_up_q8_grouped_kernel(kind, lanes))?;
    let rows = shared.as_ref().map_or(ff, |s| ff.max(s.3));
    let rows_per_cta = LAYER_WARPS as usize * 32 / lanes;
    let cfg = config(
        (rows.div_ceil(rows_per_cta), tiles.len(), 1),
        LAYER_WARPS * 32,
        tile_bytes,
    );
    let experts = device.upload(&tiles.experts)?;
    let pairs = device.upload(&tiles.pairs)?;
    crate::profile::label(|| format!("moe_gate_up grouped {} {ff}x{cols}", kind.cuda_name));
    raw::launch_moe_gate_up_grouped(
        device.stream(),
        kernel,
        cfg,
        (
            &gate.bytes,
            &up.bytes,
            &experts.as_view(),
            &pairs.as_view(),
            x,
        ),
        act,
        (to_i32(ff), to_i32(cols), to_i32(used)),
        shared,
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pairs_are_grouped_by_expert_in_tiles() {
        // 3 tokens, 2 slots, 4 experts: expert 1 takes 3 pairs, expert 2 two, expert 0 one.
        let ids = [1, 2, 1, 0, 2, 1];
        let tiles = ExpertTiles::new(&ids, 2, 4, true).unwrap();
        assert_eq!(tiles.experts, vec![0, 1, 2, -1]);
        let tile = |i: usize| &tiles.pairs[i * GROUP_TILE..][..4];
        assert_eq!(tile(0), &[3, -1, -1, -1]);
        assert_eq!(tile(1), &[0, 2, 5, -1]);
        assert_eq!(tile(2), &[1, 4, -1, -1]);
        assert_eq!(tile(3), &[0, 1, 2, -1]);
    }

    #[test]
    fn full_experts_take_several_tiles_and_bad_ids_none() {
        let ids = vec![0; GROUP_TILE + 1];
        let tiles = ExpertTiles::new(&ids, 1, 2, false).unwrap();
        assert_eq!(tiles.experts, vec![0, 0]);
        assert_eq!(tiles.pairs[GROUP_TILE], GROUP_TILE as i32);
        assert_eq!(tiles.pairs[GROUP_TILE + 1], -1);
        assert!(ExpertTiles::new(&[0, 5], 1, 2, false).is_none());
        assert!(ExpertTiles::new(&[-1], 1, 2, false).is_none());
    }
}
