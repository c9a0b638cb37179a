//! Shared by the GPU test files: the device, or a clean skip where there is none.

use std::sync::Arc;

use redlite_cuda::{CudaError, Device};
use redlite_engine::synth::Recipe;

/// The device, or `None` after printing why `test` is skipped (no driver, NVRTC or GPU).
pub fn device(test: &str) -> Option<Arc<Device>> {
    match Device::open(0) {
        Ok(device) => Some(Arc::new(device)),
        Err(error @ (CudaError::NoDriver | CudaError::NoNvrtc | CudaError::NoDevice { .. })) => {
            eprintln!("skipping {test}: {error}");
            None
        }
        Err(error) => panic!("{test}: CUDA device failed to open: {error}"),
    }
}

/// Every recipe the GPU tests cover.
#[allow(dead_code)]
pub const RECIPES: [Recipe; 5] = [
    Recipe::F32,
    Recipe::F16,
    Recipe::IQ2XXS,
    Recipe::IQ1M,
    Recipe::Q4KM,
];

/// `n` token ids of the tiny vocabulary.
#[allow(dead_code)]
pub fn prompt(n: usize) -> Vec<u32> {
    (0..n as u32).map(|i| (i * 37 + 11) % 500).collect()
}

/// L2 of the difference over L2 of `reference`.
#[allow(dead_code)]
pub fn rel_l2(reference: &[f32], found: &[f32]) -> f32 {
    let num: f64 = reference
        .iter()
        .zip(found)
        .map(|(a, b)| f64::from(a - b).powi(2))
        .sum();
    let den: f64 = reference.iter().map(|a| f64::from(*a).powi(2)).sum();
    (num / den.max(1e-30)).sqrt() as f32
}

/// Largest relative L2 difference over rows of `width`; NaN when any row's is.
#[allow(dead_code)]
pub fn max_rel(reference: &[f32], found: &[f32], width: usize) -> f32 {
    assert_eq!(reference.len(), found.len(), "lengths differ");
    reference
        .chunks(width)
        .zip(found.chunks(width))
        .map(|(a, b)| rel_l2(a, b))
        .fold(0.0, |worst, r| {
            if r.is_nan() || worst.is_nan() {
                f32::NAN
            } else {
                worst.max(r)
            }
        })
}
