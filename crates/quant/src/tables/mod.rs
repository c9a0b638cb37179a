//! Codebook and sign tables of the IQ formats, generated from gguf-py by
//! `scripts/fixtures/gen_quant_tables.py` (see each file's header).
//!
//! A u64 grid entry is 8 elements and a u32 entry 4; element j is little-endian byte j.

mod iq1s;
mod iq2s;
mod iq2xs;
mod iq2xxs;
mod iq3s;
mod iq3xxs;
mod signs;

pub use iq1s::IQ1S_GRID;
pub use iq2s::IQ2S_GRID;
pub use iq2xs::IQ2XS_GRID;
pub use iq2xxs::IQ2XXS_GRID;
pub use iq3s::IQ3S_GRID;
pub use iq3xxs::IQ3XXS_GRID;
pub use signs::{KSIGNS_IQ2XS, KVALUES_IQ4NL};

/// The offset IQ1_S and IQ1_M add to every grid value (ggml's `IQ1S_DELTA`, `IQ1M_DELTA`).
pub const IQ1_DELTA: f32 = 0.125;
