//! Helpers shared by the kernel test binaries: deterministic data, random blocks with finite
//! scales, the CPU reference rows, and the device (or a clean skip without one).
#![allow(dead_code)]

use half::f16;
use redlite_cuda::{CudaError, CudaSlice, Device, Dots, WeightMatrix};
use redlite_gguf::GgmlType;
use redlite_quant::{dequantize_row, scale_fields, set_iq1m_scale, ScaleKind};

/// SplitMix64: deterministic test data without a dependency.
pub struct Rng(pub u64);

impl Rng {
    pub fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }

    /// Uniform in [-1, 1).
    pub fn signed(&mut self) -> f32 {
        (self.next() >> 40) as f32 / (1u64 << 23) as f32 - 1.0
    }
}

/// `rows` rows of `cols` values of `ty`: random bytes with finite scales, or random
/// values for the float types.
pub fn random_matrix(ty: GgmlType, rows: usize, cols: usize, rng: &mut Rng) -> Vec<u8> {
    let values = rows * cols;
    match ty {
        GgmlType::F32 => (0..values)
            .flat_map(|_| rng.signed().to_le_bytes())
            .collect(),
        GgmlType::F16 => (0..values)
            .flat_map(|_| f16::from_f32(rng.signed()).to_bits().to_le_bytes())
            .collect(),
        _ => {
            let block_bytes = ty.block_bytes();
            let mut bytes: Vec<u8> = (0..values / ty.block_values() * block_bytes)
                .map(|_| rng.next() as u8)
                .collect();
            for block in bytes.chunks_exact_mut(block_bytes) {
                for field in scale_fields(ty) {
                    let scale = 0.01 * (0.5 + rng.signed().abs());
                    let value = match field.kind {
                        ScaleKind::Dmin => 0.5 * scale,
                        _ => scale,
                    };
                    field.write(block, value);
                }
                if ty == GgmlType::IQ1M {
                    let d = f16::from_f32(0.01 * (0.5 + rng.signed().abs()));
                    set_iq1m_scale(block, d).unwrap();
                }
            }
            bytes
        }
    }
}

pub fn reference_rows(ty: GgmlType, bytes: &[u8], rows: usize, cols: usize) -> Vec<f32> {
    let mut out = vec![0.0f32; rows * cols];
    let row_bytes = bytes.len() / rows.max(1);
    for (row, ys) in out.chunks_exact_mut(cols.max(1)).enumerate() {
        dequantize_row(ty, &bytes[row * row_bytes..(row + 1) * row_bytes], ys).unwrap();
    }
    out
}

/// The device, or `None` after printing why the GPU tests are skipped.
pub fn device(test: &str) -> Option<Device> {
    match Device::open(0) {
        Ok(device) => Some(device),
        Err(error @ (CudaError::NoDriver | CudaError::NoNvrtc | CudaError::NoDevice { .. })) => {
            eprintln!("skipping {test}: {error}");
            None
        }
        Err(error) => panic!("{test}: CUDA device failed to open: {error}"),
    }
}

/// `bytes` on the device as a `rows` x `cols` matrix of `ty` with Q8_K activations.
pub fn q8_matrix(
    bytes: &CudaSlice<u8>,
    ty: GgmlType,
    (rows, cols): (usize, usize),
) -> WeightMatrix<'_> {
    WeightMatrix {
        ty,
        rows,
        cols,
        bytes: bytes.as_view(),
        dots: Dots::Q8K,
    }
}
