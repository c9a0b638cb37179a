//! The kernel tables, one per SIMD level, and the run-time choice among them.

use super::scalar;
use redlite_gguf::GgmlType;
use std::sync::OnceLock;

/// One row dot: `(weight row bytes, activation bytes)` → the dot product. Lengths are
/// checked by the caller (the row and the activation hold the same number of values).
pub(crate) type RowDot = fn(&[u8], &[u8]) -> f32;

/// A SIMD level with its own kernel table.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum SimdLevel {
    /// Portable Rust: ggml's reference integer math, bit-identical to [`crate::dot_row`].
    Scalar,
    /// x86-64 AVX2 with FMA and F16C.
    Avx2,
    /// x86-64 AVX-512 F, BW, VL and VNNI (and AVX2): batched kernels of its own, AVX2's
    /// one-row kernels; bit-identical to [`SimdLevel::Avx2`].
    Avx512,
}

impl SimdLevel {
    /// Every level, slowest first.
    pub const ALL: [SimdLevel; 3] = [SimdLevel::Scalar, SimdLevel::Avx2, SimdLevel::Avx512];

    pub fn name(self) -> &'static str {
        match self {
            SimdLevel::Scalar => "scalar",
            SimdLevel::Avx2 => "avx2",
            SimdLevel::Avx512 => "avx512",
        }
    }

    /// The level named `name` (as [`SimdLevel::name`] spells it).
    pub fn from_name(name: &str) -> Option<SimdLevel> {
        SimdLevel::ALL
            .into_iter()
            .find(|level| level.name() == name)
    }
}

/// The row kernels of one level, one per supported weight type.
pub(crate) struct RowDots {
    pub q8_0: RowDot,
    pub q2_k: RowDot,
    pub q4_k: RowDot,
    pub q5_k: RowDot,
    pub q6_k: RowDot,
    pub iq2_xxs: RowDot,
    pub iq2_xs: RowDot,
    pub iq1_m: RowDot,
    pub f32: RowDot,
    pub f16: RowDot,
}

impl RowDots {
    pub(crate) fn get(&self, ty: GgmlType) -> Option<RowDot> {
        use GgmlType as T;
        Some(match ty {
            T::Q8_0 => self.q8_0,
            T::Q2K => self.q2_k,
            T::Q4K => self.q4_k,
            T::Q5K => self.q5_k,
            T::Q6K => self.q6_k,
            T::IQ2XXS => self.iq2_xxs,
            T::IQ2XS => self.iq2_xs,
            T::IQ1M => self.iq1_m,
            T::F32 => self.f32,
            T::F16 => self.f16,
            _ => return None,
        })
    }
}

/// The kernels of `level`, or `None` where this CPU lacks it.
pub(crate) fn table(level: SimdLevel) -> Option<&'static RowDots> {
    match level {
        SimdLevel::Scalar => Some(&scalar::KERNELS),
        #[cfg(target_arch = "x86_64")]
        SimdLevel::Avx2 => super::avx2::kernels(),
        #[cfg(target_arch = "x86_64")]
        SimdLevel::Avx512 => super::avx512::kernels(),
        #[cfg(not(target_arch = "x86_64"))]
        SimdLevel::Avx2 | SimdLevel::Avx512 => None,
    }
}

/// The levels this CPU runs, slowest first.
pub fn available_levels() -> Vec<SimdLevel> {
    SimdLevel::ALL
        .into_iter()
        .filter(|&level| table(level).is_some())
        .collect()
}

/// The environment variable that caps the level (`scalar`, `avx2`, `avx512`), for
/// comparing levels in one binary; an unknown name caps nothing.
pub const SIMD_CAP_VAR: &str = "REDLITE_SIMD";

/// The fastest level this CPU runs (at most the one [`SIMD_CAP_VAR`] names) and its
/// kernels, detected once per process.
pub(crate) fn best() -> (SimdLevel, &'static RowDots) {
    static BEST: OnceLock<(SimdLevel, &'static RowDots)> = OnceLock::new();
    *BEST.get_or_init(|| {
        let cap = std::env::var(SIMD_CAP_VAR)
            .ok()
            .and_then(|name| SimdLevel::from_name(name.trim()))
            .unwrap_or(SimdLevel::Avx512);
        SimdLevel::ALL
            .into_iter()
            .rev()
            .filter(|&level| level <= cap)
            .find_map(|level| Some((level, table(level)?)))
            .unwrap_or((SimdLevel::Scalar, &scalar::KERNELS))
    })
}
