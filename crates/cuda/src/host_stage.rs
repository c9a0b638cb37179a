//! Page-locked host memory for what the host reads back after every decode step (the
//! logits of a token: 151,936 floats, 608 KB, for Qwen3-Next). A copy into pageable memory
//! goes through the driver's own staging buffer, a DMA and a host copy in pieces, each
//! waited for; into page-locked memory it is one DMA at the link's rate, then one host copy
//! into the caller's buffer.

use std::ops::Range;
use std::sync::Arc;

use cudarc::driver::{CudaEvent, CudaStream, CudaView, PinnedHostSlice};

use crate::device::Device;
use crate::error::{CudaError, CudaOp};
use crate::raw;

/// A page-locked buffer, grown to the largest copy it has taken.
#[derive(Default)]
pub struct HostStage {
    floats: Option<PinnedHostSlice<f32>>,
    /// The pieces queued since `begin_pieces`, in order (`queue_piece`).
    pieces: Vec<Range<usize>>,
    /// The stream the pieces' copies run on and each piece's events (made on first use).
    copies: Option<PieceCopies>,
}

struct PieceCopies {
    stream: Arc<CudaStream>,
    /// Piece i's (computed on the main stream, copied to the page-locked buffer).
    events: Vec<(CudaEvent, CudaEvent)>,
}

impl HostStage {
    pub fn new() -> HostStage {
        HostStage::default()
    }

    /// Appends `src` to `out` through the page-locked buffer; waits for the work queued on
    /// the device's stream before the copy.
    pub fn append_to_host(
        &mut self,
        device: &Device,
        src: &CudaView<'_, f32>,
        out: &mut Vec<f32>,
    ) -> Result<(), CudaError> {
        let n = src.len();
        self.settle()?;
        self.grow(device, n)?;
        let Some(floats) = self.floats.as_mut() else {
            return Ok(());
        };
        let host = floats
            .as_mut_slice()
            .map_err(CudaError::driver("cuEventSynchronize"))?;
        // Into the first n floats only: a copy into the whole buffer would read as many
        // floats from `src`, past its end once the buffer has grown larger.
        let stream = device.stream();
        stream
            .memcpy_dtoh(src, &mut host[..n])
            .map_err(CudaError::driver("cuMemcpyDtoHAsync"))?;
        // The stream's wait spins (the context's default scheduling) where the buffer's own
        // event would block the thread and wake it late.
        stream
            .synchronize()
            .map_err(CudaError::driver("cuStreamSynchronize"))?;
        out.extend_from_slice(&host[..n]);
        Ok(())
    }
}

/// One row's logits in pieces: the caller queues each piece's product on the main stream and
/// then `queue_piece`, whose copy to the page-locked buffer runs on a stream of its own as
/// soon as that product is done; `finish_pieces` appends each piece to the caller's buffer
/// as its copy lands. The copies and the host's appends of the first pieces run while the
/// GPU computes the later ones, where one copy and one append after the whole product
/// followed it (608 KB for Qwen3-Next: a DMA, then a host copy of about as long).
impl HostStage {
    /// Starts a row of `total` floats.
    pub fn begin_pieces(&mut self, device: &Device, total: usize) -> Result<(), CudaError> {
        self.settle()?;
        self.grow(device, total)?;
        if self.copies.is_none() {
            let stream = device
                .context()
                .new_stream()
                .map_err(CudaError::driver("cuStreamCreate"))?;
            self.copies = Some(PieceCopies {
                stream,
                events: Vec::new(),
            });
        }
        Ok(())
    }

    /// Queues the copy of `src`, floats `range` of the row, after the work queued on the
    /// device's stream so far (its product).
    pub fn queue_piece(
        &mut self,
        device: &Device,
        src: &CudaView<'_, f32>,
        range: Range<usize>,
    ) -> Result<(), CudaError> {
        let (Some(floats), Some(copies)) = (self.floats.as_mut(), self.copies.as_mut()) else {
            return Err(CudaError::Shape {
                op: CudaOp::Matmul,
                what: "logits pieces before begin_pieces",
                expected: 1,
                found: 0,
            });
        };
        if range.end > floats.len() || range.len() != src.len() {
            return Err(CudaError::Shape {
                op: CudaOp::Matmul,
                what: "logits piece",
                expected: floats.len().min(range.len()),
                found: src.len(),
            });
        }
        let i = self.pieces.len();
        if copies.events.len() == i {
            let event = || {
                device
                    .context()
                    .new_event(None)
                    .map_err(CudaError::driver("cuEventCreate"))
            };
            copies.events.push((event()?, event()?));
        }
        let (computed, copied) = &copies.events[i];
        computed
            .record(device.stream())
            .map_err(CudaError::driver("cuEventRecord"))?;
        copies
            .stream
            .wait(computed)
            .map_err(CudaError::driver("cuStreamWaitEvent"))?;
        let host = floats
            .as_mut_slice()
            .map_err(CudaError::driver("cuEventSynchronize"))?;
        copies
            .stream
            .memcpy_dtoh(src, &mut host[range.clone()])
            .map_err(CudaError::driver("cuMemcpyDtoHAsync"))?;
        copied
            .record(&copies.stream)
            .map_err(CudaError::driver("cuEventRecord"))?;
        self.pieces.push(range);
        Ok(())
    }

    /// Appends every queued piece to `out`, in order, each once its copy has landed.
    pub fn finish_pieces(&mut self, out: &mut Vec<f32>) -> Result<(), CudaError> {
        let HostStage {
            floats,
            pieces,
            copies,
        } = self;
        let (Some(floats), Some(copies)) = (floats.as_mut(), copies.as_ref()) else {
            pieces.clear();
            return Ok(());
        };
        let host = floats
            .as_mut_slice()
            .map_err(CudaError::driver("cuEventSynchronize"))?;
        out.reserve(pieces.iter().map(|r| r.len()).sum());
        for (range, (_, copied)) in pieces.iter().zip(&copies.events) {
            copied
                .synchronize()
                .map_err(CudaError::driver("cuEventSynchronize"))?;
            out.extend_from_slice(&host[range.clone()]);
        }
        // Cleared only now (an error above leaves them for `settle`), keeping the capacity
        // for the next row's ranges.
        pieces.clear();
        Ok(())
    }

    /// Waits for the copies of pieces a failed row left queued (an error between
    /// `queue_piece` and `finish_pieces`), so that none lands in the buffer while it is reused
    /// or replaced.
    fn settle(&mut self) -> Result<(), CudaError> {
        if self.pieces.is_empty() {
            return Ok(());
        }
        self.pieces.clear();
        match &self.copies {
            Some(copies) => copies
                .stream
                .synchronize()
                .map_err(CudaError::driver("cuStreamSynchronize")),
            None => Ok(()),
        }
    }

    /// The page-locked buffer holds at least `n` floats.
    fn grow(&mut self, device: &Device, n: usize) -> Result<(), CudaError> {
        if self.floats.as_ref().map_or(0, |f| f.len()) < n {
            // Dropped first: the old buffer's pages are unpinned before new ones are pinned.
            self.floats = None;
            self.floats = Some(raw::alloc_host_floats(device.context(), n)?);
        }
        Ok(())
    }
}

/// `rows` rows in at most `n` consecutive pieces, each starting at a multiple of 64 rows (so
/// that a quantized matrix's rows of a piece start 16-byte aligned), together every row once,
/// computed as they are taken (no allocation on a decode step). Equal pieces, or with
/// `halving` a half, a quarter, ... and the rest last, so that the last pieces, whose copies
/// follow the whole product, are the small ones. One piece when `n` < 2, `n` > 16 or the rows
/// are fewer than 64 a piece (equal) or 64 << `n` (halving).
pub fn row_pieces(rows: usize, n: usize, halving: bool) -> impl Iterator<Item = Range<usize>> {
    let least = if halving {
        64usize << n.min(16)
    } else {
        64 * n
    };
    let n = if (2..=16).contains(&n) && rows >= least {
        n
    } else {
        1
    };
    let equal = rows.div_ceil(n).next_multiple_of(64);
    let mut start = 0;
    (0..n).map_while(move |i| {
        let rest = rows - start;
        let len = match (i + 1 == n, halving) {
            _ if rest == 0 => return None,
            (true, _) => rest,
            (false, true) => (rest / 2).next_multiple_of(64),
            (false, false) => equal.min(rest),
        };
        let piece = start..start + len;
        start += len;
        Some(piece)
    })
}

#[cfg(test)]
mod tests {
    use super::row_pieces;
    use std::ops::Range;

    #[test]
    fn row_pieces_cover_every_row_once_from_multiples_of_64() {
        let cases = [
            (151_936, 4),
            (151_936, 8),
            (151_936, 16),
            (1000, 4),
            (257, 4),
            (64, 1),
        ];
        let pieces = |rows, n, halving| row_pieces(rows, n, halving).collect::<Vec<_>>();
        let both = cases.iter().flat_map(|&(rows, n)| {
            [pieces(rows, n, false), pieces(rows, n, true)].map(|p| (rows, n, p))
        });
        for (rows, n, pieces) in both {
            assert!(pieces.len() <= n.max(1), "{rows} rows in {n}: {pieces:?}");
            let mut next = 0;
            for piece in &pieces {
                assert_eq!(piece.start, next, "{rows} rows in {n}: {pieces:?}");
                assert_eq!(piece.start % 64, 0, "{rows} rows in {n}: {pieces:?}");
                assert!(!piece.is_empty());
                next = piece.end;
            }
            assert_eq!(next, rows, "{rows} rows in {n}: {pieces:?}");
        }
        assert_eq!(pieces(151_936, 4, false).len(), 4);
        let lens: Vec<usize> = pieces(151_936, 5, true).iter().map(|r| r.len()).collect();
        assert_eq!(lens, [75_968, 38_016, 19_008, 9_472, 9_472]);
        let one: Vec<Range<usize>> = std::iter::once(0..200).collect();
        assert_eq!(pieces(200, 4, false), one);
    }
}
