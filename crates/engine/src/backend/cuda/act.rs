//! Device activations (the forward workspace's `x`, `h`, `mix`): `[max_tokens][width]` f32,
//! and for batches of decode size the Q8_K codes a norm wrote beside them, which the q8
//! products read instead of quantizing the rows again. `Backend::new_act` cannot fail, so an
//! allocation failure is kept and reported by the first op that uses the buffer.

use redlite_cuda::{
    CudaSlice, CudaView, CudaViewMut, Device, Q8Rows, Q8RowsMut, ONE_TOKEN_KERNELS_MAX_TOKENS,
    Q8_BLOCK_VALUES,
};

use crate::error::{EngineError, Result};

/// Activations `[max_tokens][width]` in device memory, and for batches of decode size
/// their Q8_K codes when a norm wrote them (`q8`).
pub struct CudaAct {
    pub(super) width: usize,
    pub(super) max_tokens: usize,
    data: std::result::Result<CudaSlice<f32>, String>,
    q8: Option<Q8Side>,
}

/// The Q8_K codes of an activation buffer's first rows (`Q8Rows`' layout), written by the
/// norms (`rms_norm_quantized`) for the q8 products that read the buffer.
struct Q8Side {
    scales: CudaSlice<f32>,
    codes: CudaSlice<i8>,
    /// Rows the buffers hold: a batch of decode size at most.
    capacity: usize,
    /// Leading rows whose codes are those of the f32 rows now: set by the norm that wrote
    /// both, reset by every other write (`rows_mut`, `row_range_mut`).
    valid: usize,
}

impl CudaAct {
    /// `quantized`: keep the Q8_K codes of up to `ONE_TOKEN_KERNELS_MAX_TOKENS` rows (the
    /// backend's q8 products; widths of whole 256-value blocks).
    pub(super) fn new(
        device: &Device,
        max_tokens: usize,
        width: usize,
        quantized: bool,
    ) -> CudaAct {
        let capacity = max_tokens.min(ONE_TOKEN_KERNELS_MAX_TOKENS);
        let q8 = (quantized && width.is_multiple_of(Q8_BLOCK_VALUES) && capacity > 0)
            .then(|| {
                Some(Q8Side {
                    scales: device
                        .alloc_zeros(capacity * width / Q8_BLOCK_VALUES)
                        .ok()?,
                    codes: device.alloc_zeros(capacity * width).ok()?,
                    capacity,
                    valid: 0,
                })
            })
            .flatten();
        CudaAct {
            width,
            max_tokens,
            data: device
                .alloc_zeros(max_tokens * width)
                .map_err(|e| e.to_string()),
            q8,
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
        let quantizes = self.quantizes(tokens);
        let width = self.width;
        let data = match &mut self.data {
            Ok(d) => d.slice_mut(..tokens * width),
            Err(msg) => {
                return Err(EngineError::Cuda(format!(
                    "activation buffer of {} x {width} was not allocated: {msg}",
                    self.max_tokens
                )))
            }
        };
        let q8 = self
            .q8
            .as_mut()
            .filter(|_| quantizes)
            .map(|side| Q8RowsMut {
                scales: side.scales.slice_mut(..tokens * width / Q8_BLOCK_VALUES),
                codes: side.codes.slice_mut(..tokens * width),
            });
        Ok((data, q8))
    }

    /// Whether a norm of `tokens` rows into this buffer also quantizes them: what
    /// `rows_mut_quantized` will hand out, and what a replayed graph did when it recorded
    /// the norm (whose codes count as valid then too).
    pub(super) fn quantizes(&mut self, tokens: usize) -> bool {
        match &mut self.q8 {
            Some(side) if tokens <= side.capacity => {
                side.valid = tokens;
                true
            }
            Some(side) => {
                side.valid = 0;
                false
            }
            None => false,
        }
    }

    /// The Q8_K codes of rows `first..last` when the last write of those rows was a norm
    /// that also quantized them; `None` otherwise (the q8 products quantize the rows).
    pub(super) fn q8_range(&self, first: usize, last: usize) -> Option<Q8Rows<'_>> {
        let side = self.q8.as_ref()?;
        if first >= last || last > side.valid {
            return None;
        }
        let blocks = self.width / Q8_BLOCK_VALUES;
        Some(Q8Rows {
            scales: side.scales.slice(first * blocks..last * blocks),
            codes: side.codes.slice(first * self.width..last * self.width),
        })
    }

    /// Anything but a quantizing norm is about to write the rows: their codes are stale.
    fn forget_codes(&mut self) {
        if let Some(side) = &mut self.q8 {
            side.valid = 0;
        }
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
            Err(msg) => Err(self.unallocated(msg)),
        }
    }

    fn unallocated(&self, msg: &str) -> EngineError {
        EngineError::Cuda(format!(
            "activation buffer of {} x {} was not allocated: {msg}",
            self.max_tokens, self.width
        ))
    }

    /// The first `tokens` rows.
    pub(super) fn rows(&self, tokens: usize) -> Result<CudaView<'_, f32>> {
        self.check(tokens)?;
        match &self.data {
            Ok(d) => Ok(d.slice(..tokens * self.width)),
            Err(msg) => Err(self.unallocated(msg)),
        }
    }

    /// Rows `first..last`.
    pub(super) fn row_range(&self, first: usize, last: usize) -> Result<CudaView<'_, f32>> {
        self.check(last)?;
        match &self.data {
            Ok(d) => Ok(d.slice(first * self.width..last * self.width)),
            Err(msg) => Err(self.unallocated(msg)),
        }
    }

    /// Rows `first..last`, writable.
    pub(super) fn row_range_mut(
        &mut self,
        first: usize,
        last: usize,
    ) -> Result<CudaViewMut<'_, f32>> {
        self.check(last)?;
        self.forget_codes();
        let width = self.width;
        match &mut self.data {
            Ok(d) => Ok(d.slice_mut(first * width..last * width)),
            Err(msg) => Err(EngineError::Cuda(format!(
                "activation buffer of {} x {width} was not allocated: {msg}",
                self.max_tokens
            ))),
        }
    }

    pub(super) fn rows_mut(&mut self, tokens: usize) -> Result<CudaViewMut<'_, f32>> {
        self.check(tokens)?;
        self.forget_codes();
        let width = self.width;
        match &mut self.data {
            Ok(d) => Ok(d.slice_mut(..tokens * width)),
            Err(msg) => Err(EngineError::Cuda(format!(
                "activation buffer of {} x {width} was not allocated: {msg}",
                self.max_tokens
            ))),
        }
    }
}
