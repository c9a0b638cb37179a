//! The routed (token, slot) pairs of a prompt grouped by expert in tiles of [`MMA_TILE`] (or
//! [`MMA_WIDE_TILE`] for long prompts) for the tensor-core expert products: on the host from
//! the router's ids ([`MmaTiles`], tests and benchmarks) or on the device with no host round
//! trip ([`MmaGroups::on_device`], the engine). Either way the products read [`MmaGroups`]:
//! per tile (expert, first, count) into a list of the pairs ordered by expert. A pair's sums do
//! not depend on its tile's size or companions, so the tiling never changes a result.

use cudarc::driver::{CudaSlice, CudaView};

use crate::device::Device;
use crate::error::{CudaError, CudaOp};
use crate::layer_launch::{config, to_i32};
use crate::layer_ops::MAX_GRID_YZ;
use crate::ops::{fits, shape};
use crate::raw;
use crate::source::{MMA_GATE_UP, MMA_GATE_UP_WIDE, MMA_GROUP_KERNEL};
use std::sync::OnceLock;

/// Pairs (tokens) per expert tile: the gate/up and down shapes share the tiles.
pub const MMA_TILE: usize = MMA_GATE_UP.tokens();

/// Pairs per wide tile (long prompts; `REDLITE_MMA_WIDE_TILES=0`: never).
pub const MMA_WIDE_TILE: usize = MMA_GATE_UP_WIDE.tokens();

/// The tile size for `n_pairs` pairs over `n_expert` experts: wide where the experts average
/// at least [`WIDE_MIN_PAIRS`] pairs (pp2048: ~40; pp512: ~10 stays at 16).
fn tile_for(n_pairs: usize, n_expert: usize) -> usize {
    static WIDE: OnceLock<bool> = OnceLock::new();
    let wide = *WIDE.get_or_init(|| std::env::var("REDLITE_MMA_WIDE_TILES").as_deref() != Ok("0"));
    if wide && n_pairs >= WIDE_MIN_PAIRS * n_expert.max(1) {
        MMA_WIDE_TILE
    } else {
        MMA_TILE
    }
}

/// Fewest pairs per expert on average for wide tiles: below it most wide tiles would be
/// mostly empty (their staging and products are paid for all 64 pairs). A guess, to measure.
const WIDE_MIN_PAIRS: usize = 24;

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

/// A grouping on the device, as the expert products read it.
pub struct MmaGroups {
    /// (expert, first, count) per tile of the grid; count 0 for the empty tiles a device
    /// grouping leaves past its last one.
    pub(crate) info: CudaSlice<i32>,
    /// The pairs ordered by expert.
    pub(crate) pairs: CudaSlice<i32>,
    /// Tiles of the launch grid.
    pub(crate) tiles: usize,
    /// The router's ids when they were not checked on the host: the combine pass skips the
    /// slots out of range (they join no tile).
    pub(crate) ids: Option<CudaSlice<i32>>,
    pub(crate) tokens: usize,
    pub(crate) used: usize,
    pub(crate) n_expert: usize,
    /// Most pairs per tile: [`MMA_TILE`] or [`MMA_WIDE_TILE`] (which kernel shapes run).
    pub(crate) tile: usize,
}

impl MmaGroups {
    /// Host tiles copied to the device.
    pub fn upload(device: &Device, tiles: &MmaTiles) -> Result<MmaGroups, CudaError> {
        Ok(MmaGroups {
            info: device.upload(&tiles.info)?,
            pairs: device.upload(&tiles.pairs)?,
            tiles: tiles.len(),
            ids: None,
            tokens: tiles.tokens,
            used: tiles.used,
            n_expert: tiles.n_expert,
            tile: MMA_TILE,
        })
    }

    /// Groups `ids` (tokens x used, the router's choice) on the device: one launch, no sync.
    /// The grid holds the most tiles the pairs can need (a partial tile per expert at most).
    pub fn on_device(
        device: &Device,
        ids: &CudaView<'_, i32>,
        used: usize,
        n_expert: usize,
    ) -> Result<MmaGroups, CudaError> {
        let op = CudaOp::MoeRoute;
        let used = used.max(1);
        let n_pairs = ids.len();
        let tokens = n_pairs / used;
        shape(op, "ids length (tokens x used)", tokens * used, n_pairs)?;
        let tile = tile_for(n_pairs, n_expert);
        let tiles = n_pairs.div_ceil(tile) + n_expert;
        fits(op, "tiles", tiles as u64, MAX_GRID_YZ)?;
        let shared = 3 * n_expert * size_of::<i32>();
        fits(
            op,
            "experts (group shared memory)",
            shared as u64,
            48 * 1024,
        )?;
        let mut info = raw::scratch::<i32>(device.stream(), 3 * tiles)?;
        let mut pairs = raw::scratch::<i32>(device.stream(), n_pairs)?;
        let mut own_ids = raw::scratch::<i32>(device.stream(), n_pairs)?;
        device
            .stream()
            .memcpy_dtod(ids, &mut own_ids)
            .map_err(CudaError::driver("cuMemcpyDtoD"))?;
        let kernel = device.kernel(MMA_GROUP_KERNEL)?;
        let cfg = config((1, 1, 1), 1024, shared);
        raw::launch_mma_group(
            device.stream(),
            kernel,
            cfg,
            &own_ids,
            (&mut info, &mut pairs),
            (
                to_i32(n_pairs),
                to_i32(n_expert),
                to_i32(tiles),
                to_i32(tile),
            ),
        )?;
        Ok(MmaGroups {
            info,
            pairs,
            tiles,
            ids: Some(own_ids),
            tokens,
            used,
            n_expert,
            tile,
        })
    }

    /// Every token as one pair of a one-expert stack (the shared expert).
    pub fn dense(device: &Device, tokens: usize) -> Result<MmaGroups, CudaError> {
        let tiles = MmaTiles::dense(tokens).ok_or(CudaError::TooLarge {
            op: CudaOp::MoeGateUp,
            what: "tiles",
            limit: MAX_GRID_YZ as usize,
            found: tokens.div_ceil(MMA_TILE),
        })?;
        MmaGroups::upload(device, &tiles)
    }

    /// Tiles of the launch grid.
    pub fn tiles(&self) -> usize {
        self.tiles
    }
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
}
