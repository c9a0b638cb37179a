//! Device buffers for the Q8_K codes of up to `ONE_TOKEN_KERNELS_MAX_TOKENS` rows of
//! activations (`Q8Rows`' layout: an f32 scale per 256 values, an int8 code per value), kept
//! beside the f32 rows a norm or the fused DeltaNet step writes, for the q8 products to read
//! instead of quantizing the rows in each CTA.

use redlite_cuda::{
    CudaSlice, Device, Q8Rows, Q8RowsMut, ONE_TOKEN_KERNELS_MAX_TOKENS, Q8_BLOCK_VALUES,
};

use crate::error::Result;

pub struct Q8Buffers {
    scales: CudaSlice<f32>,
    codes: CudaSlice<i8>,
    rows: usize,
    width: usize,
}

impl Q8Buffers {
    /// Room for the codes of `tokens` rows (at most `ONE_TOKEN_KERNELS_MAX_TOKENS`) of up
    /// to `width` values; none when `on` is false or `width` is not whole 256-value blocks.
    pub fn new(device: &Device, tokens: usize, width: usize, on: bool) -> Result<Q8Buffers> {
        let usable = on && width.is_multiple_of(Q8_BLOCK_VALUES);
        let (rows, width) = match usable {
            true => (tokens.min(ONE_TOKEN_KERNELS_MAX_TOKENS), width),
            false => (0, 0),
        };
        Ok(Q8Buffers {
            scales: device.alloc_zeros((rows * width / Q8_BLOCK_VALUES).max(1))?,
            codes: device.alloc_zeros((rows * width).max(1))?,
            rows,
            width,
        })
    }

    /// Whether rows `..last` of `width` values fit.
    pub fn fits(&self, last: usize, width: usize) -> bool {
        last <= self.rows && width <= self.width && width.is_multiple_of(Q8_BLOCK_VALUES)
    }

    /// Where the first `tokens` rows of `width` values go, if they fit.
    pub fn rows_mut(&mut self, tokens: usize, width: usize) -> Option<Q8RowsMut<'_>> {
        let blocks = width / Q8_BLOCK_VALUES;
        self.fits(tokens, width).then(|| Q8RowsMut {
            scales: self.scales.slice_mut(..tokens * blocks),
            codes: self.codes.slice_mut(..tokens * width),
        })
    }

    /// Rows `first..last` of `width` values as last written, if they fit.
    pub fn range(&self, (first, last): (usize, usize), width: usize) -> Option<Q8Rows<'_>> {
        let blocks = width / Q8_BLOCK_VALUES;
        (first < last && self.fits(last, width)).then(|| Q8Rows {
            scales: self.scales.slice(first * blocks..last * blocks),
            codes: self.codes.slice(first * width..last * width),
        })
    }
}
