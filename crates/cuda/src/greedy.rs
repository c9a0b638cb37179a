//! Greedy sampling on the device (`argmax_kernel`, `elementwise.cu`): the token of a row of
//! logits without copying the row to the host (151,936 floats a token for Qwen3-Next), only
//! the 8-byte key of its largest finite value. Ties go to the lower index and NaN and
//! infinities are never chosen, as on the host (`sampling::greedy_argmax`).

use cudarc::driver::{CudaSlice, CudaView, CudaViewMut};

use crate::device::Device;
use crate::error::{CudaError, CudaOp};
use crate::layer_launch::{config, to_i32};
use crate::raw;
use crate::source::{ARGMAX_KERNEL, ARGMAX_PER_THREAD, IDS_OF_KEYS_KERNEL};

/// Threads per CTA of the argmax.
const ARGMAX_THREADS: u32 = 256;

/// The index of the largest finite value of `x`, the lower on ties; `None` when no value is
/// finite. `key`: one u64 of scratch. Waits for the work queued before it.
pub fn argmax(
    device: &Device,
    x: &CudaView<'_, f32>,
    key: &mut CudaSlice<u64>,
) -> Result<Option<u32>, CudaError> {
    let mut best = [None];
    argmax_rows(device, x, key, &mut best)?;
    Ok(best[0])
}

/// [`argmax`] of each of the `best.len()` rows of `x` (equal lengths) into `best`, in one
/// launch and one read of their keys. `keys`: at least `best.len()` u64 of scratch.
pub fn argmax_rows(
    device: &Device,
    x: &CudaView<'_, f32>,
    keys: &mut CudaSlice<u64>,
    best: &mut [Option<u32>],
) -> Result<(), CudaError> {
    let rows = best.len();
    if keys.len() < rows {
        return Err(keys_too_few(rows, keys.len()));
    }
    let mut keys = keys.slice_mut(..rows);
    argmax_rows_queued(device, x, &mut keys)?;
    // Into an array: a greedy decode step allocates nothing.
    let mut found = [0u64; MAX_ARGMAX_ROWS];
    device.copy_to_host(&keys.as_view(), &mut found[..rows])?;
    for (b, &key) in best.iter_mut().zip(&found[..rows]) {
        *b = token_of_key(key);
    }
    Ok(())
}

/// The argmax keys of the `keys.len()` rows of `x` (equal lengths) into `keys`, queued: the
/// host reads them later ([`token_of_key`]), or [`ids_of_keys`] hands the tokens on to a
/// kernel without the host (chained greedy steps).
pub fn argmax_rows_queued(
    device: &Device,
    x: &CudaView<'_, f32>,
    keys: &mut CudaViewMut<'_, u64>,
) -> Result<(), CudaError> {
    let rows = keys.len();
    let n = x.len() / rows.max(1);
    if rows == 0 || n == 0 || n * rows != x.len() || u32::try_from(n).is_err() {
        return Err(CudaError::Shape {
            op: CudaOp::Argmax,
            what: "values a row (1 to 2^32 - 1, equal rows)",
            expected: n.max(1) * rows.max(1),
            found: x.len(),
        });
    }
    if rows > MAX_ARGMAX_ROWS {
        return Err(keys_too_few(rows, MAX_ARGMAX_ROWS));
    }
    device.zero(keys)?;
    let kernel = device.kernel(ARGMAX_KERNEL)?;
    let per_cta = ARGMAX_THREADS as usize * ARGMAX_PER_THREAD;
    let cfg = config((n.div_ceil(per_cta), rows, 1), ARGMAX_THREADS, 0);
    raw::launch_argmax(device.stream(), kernel, cfg, x, to_i32(n), keys)
}

/// The token each of `keys` names (0 where a key is 0: no finite value) into `ids` (as
/// many), queued: the ids of an embedding that follows a greedy pick on the device.
pub fn ids_of_keys(
    device: &Device,
    keys: &CudaView<'_, u64>,
    ids: &mut CudaViewMut<'_, u32>,
) -> Result<(), CudaError> {
    if keys.len() != ids.len() || keys.is_empty() {
        return Err(CudaError::Shape {
            op: CudaOp::Argmax,
            what: "ids (one a key)",
            expected: keys.len().max(1),
            found: ids.len(),
        });
    }
    let kernel = device.kernel(IDS_OF_KEYS_KERNEL)?;
    let n = keys.len();
    let cfg = config((n.div_ceil(32), 1, 1), 32, 0);
    raw::launch_ids_of_keys(device.stream(), kernel, cfg, keys, to_i32(n), ids)
}

fn keys_too_few(rows: usize, found: usize) -> CudaError {
    CudaError::Shape {
        op: CudaOp::Argmax,
        what: "keys (one a row, at most MAX_ARGMAX_ROWS rows)",
        expected: rows,
        found,
    }
}

/// Most rows [`argmax_rows`] takes at once (an MTP verification has at most 4).
pub const MAX_ARGMAX_ROWS: usize = 16;

/// The index a key of `argmax_kernel` names (its low half is 2^32 - 1 - index); 0: none.
pub fn token_of_key(key: u64) -> Option<u32> {
    (key != 0).then(|| u32::MAX - (key & 0xffff_ffff) as u32)
}

#[cfg(test)]
mod tests {
    use super::token_of_key;

    #[test]
    fn a_key_names_its_index() {
        assert_eq!(token_of_key(0), None);
        assert_eq!(
            token_of_key((0x8000_0000u64 << 32) | u64::from(u32::MAX)),
            Some(0)
        );
        assert_eq!(
            token_of_key((1u64 << 32) | u64::from(u32::MAX - 151_935)),
            Some(151_935)
        );
    }
}
