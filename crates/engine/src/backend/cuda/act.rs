//! Device activations (the forward workspace's `x`, `h`, `mix`): `[max_tokens][width]` f32,
//! and for batches of decode size the Q8_K codes a norm wrote beside them, which the q8
//! products read instead of quantizing the rows again. `Backend::new_act` cannot fail, so an
//! allocation failure is kept and reported by the first op that uses the buffer.

use redlite_cuda::{CudaSlice, CudaView, CudaViewMut, Device, Q8Rows, Q8RowsMut};

use crate::backend::cuda::q8_buffers::Q8Buffers;
use crate::error::{EngineError, Result};

/// Activations `[max_tokens][width]` in device memory, and for batches of decode size
/// their Q8_K codes when a norm wrote them (`q8`).
pub struct CudaAct {
    pub(super) width: usize,
    pub(super) max_tokens: usize,
    data: std::result::Result<CudaSlice<f32>, String>,
    /// Room for the codes (`None`: not kept, or not allocated: the products quantize).
    q8: Option<Q8Buffers>,
    /// Leading rows whose codes are those of the f32 rows now: set by the norm that wrote
    /// both, reset by every other write (`rows_mut`, `row_range_mut`).
    q8_valid: usize,
}

impl CudaAct {
    /// `quantized`: keep the Q8_K codes of a batch of decode size (the backend's q8
    /// products; widths of whole 256-value blocks).
    pub(super) fn new(
        device: &Device,
        max_tokens: usize,
        width: usize,
        quantized: bool,
    ) -> CudaAct {
        let q8 = Q8Buffers::new(device, max_tokens, width, quantized).ok();
        CudaAct {
            width,
            max_tokens,
            data: device
                .alloc_zeros(max_tokens * width)
                .map_err(|e| e.to_string()),
            q8,
            q8_valid: 0,
        }
    }

    /// The first `tokens` rows and where their Q8_K codes go, when this buffer keeps codes
    /// for that many rows (`None`: a prompt, or no codes kept). The codes count as valid from
    /// here on: the caller writes both.
    pub(super) fn rows_mut_quantized(
        &mut self,
        tokens: usize,
    ) -> Result<(CudaViewMut<'_, f32>, Option<Q8RowsMut<'_>>)> {
        self.check(tokens)?;
        let quantized = self.norm_writes(tokens);
        let (width, max_tokens) = (self.width, self.max_tokens);
        let data = rows_of(&mut self.data, (max_tokens, width), 0..tokens)?;
        let q8 = match quantized {
            true => self.q8.as_mut().and_then(|q8| q8.rows_mut(tokens, width)),
            false => None,
        };
        Ok((data, q8))
    }

    /// Whether a norm writing `tokens` rows writes their Q8_K codes too.
    pub(super) fn keeps_codes(&self, tokens: usize) -> bool {
        self.q8
            .as_ref()
            .is_some_and(|q8| q8.fits(tokens, self.width))
    }

    /// A norm writes `tokens` rows (or a replayed graph recorded from that norm does):
    /// whether it writes their codes too, which then count as valid.
    pub(super) fn norm_writes(&mut self, tokens: usize) -> bool {
        let quantized = self.keeps_codes(tokens);
        self.q8_valid = if quantized { tokens } else { 0 };
        quantized
    }

    /// The Q8_K codes of rows `first..last` when the last write of those rows was a norm
    /// that also quantized them; `None` otherwise (the q8 products quantize the rows).
    pub(super) fn q8_range(&self, first: usize, last: usize) -> Option<Q8Rows<'_>> {
        if last > self.q8_valid {
            return None;
        }
        self.q8.as_ref()?.range((first, last), self.width)
    }

    fn check(&self, tokens: usize) -> Result<()> {
        if tokens > self.max_tokens {
            return Err(EngineError::BadConfig(format!(
                "a batch of {tokens} tokens exceeds the activation buffer of {}",
                self.max_tokens
            )));
        }
        Ok(())
    }

    /// The device address of the buffer (identity of a recorded decode step).
    pub(super) fn address(&self, device: &Device) -> Result<u64> {
        match &self.data {
            Ok(d) => Ok(device.address(d)),
            Err(msg) => Err(unallocated((self.max_tokens, self.width), msg)),
        }
    }

    /// The first `tokens` rows.
    pub(super) fn rows(&self, tokens: usize) -> Result<CudaView<'_, f32>> {
        self.row_range(0, tokens)
    }

    /// Rows `first..last`.
    pub(super) fn row_range(&self, first: usize, last: usize) -> Result<CudaView<'_, f32>> {
        self.check(last)?;
        match &self.data {
            Ok(d) => Ok(d.slice(first * self.width..last * self.width)),
            Err(msg) => Err(unallocated((self.max_tokens, self.width), msg)),
        }
    }

    /// Rows `first..last`, writable; their codes (if any) are stale from here on.
    pub(super) fn row_range_mut(
        &mut self,
        first: usize,
        last: usize,
    ) -> Result<CudaViewMut<'_, f32>> {
        self.check(last)?;
        self.q8_valid = 0;
        rows_of(&mut self.data, (self.max_tokens, self.width), first..last)
    }

    pub(super) fn rows_mut(&mut self, tokens: usize) -> Result<CudaViewMut<'_, f32>> {
        self.row_range_mut(0, tokens)
    }
}

/// Rows `rows` of an activation buffer of `max_tokens` x `width`, writable.
fn rows_of(
    data: &mut std::result::Result<CudaSlice<f32>, String>,
    (max_tokens, width): (usize, usize),
    rows: std::ops::Range<usize>,
) -> Result<CudaViewMut<'_, f32>> {
    match data {
        Ok(d) => Ok(d.slice_mut(rows.start * width..rows.end * width)),
        Err(msg) => Err(unallocated((max_tokens, width), msg)),
    }
}

fn unallocated((max_tokens, width): (usize, usize), msg: &str) -> EngineError {
    EngineError::Cuda(format!(
        "activation buffer of {max_tokens} x {width} was not allocated: {msg}"
    ))
}
