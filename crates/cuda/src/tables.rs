//! The IQ codebooks as CUDA source, generated from `redlite_quant::tables` so the GPU and
//! the CPU reference read the very same numbers.

use redlite_quant::tables::{IQ1S_GRID, IQ2XS_GRID, IQ2XXS_GRID, KSIGNS_IQ2XS};
use std::fmt::Write;

/// Global (not `__constant__`) arrays: lanes of a warp look up different entries, which
/// constant memory would serialize; global reads go through L1.
pub(crate) fn tables_header() -> String {
    let mut out = String::from("// Generated from redlite_quant::tables; do not edit.\n");
    u64_table(&mut out, "iq2xxs_grid", &IQ2XXS_GRID);
    u64_table(&mut out, "iq2xs_grid", &IQ2XS_GRID);
    u64_table(&mut out, "iq1s_grid", &IQ1S_GRID);
    let _ = write!(
        out,
        "static __device__ const u8 ksigns_iq2xs[{}] = {{",
        KSIGNS_IQ2XS.len()
    );
    for (i, value) in KSIGNS_IQ2XS.iter().enumerate() {
        let sep = if i % 16 == 0 { "\n    " } else { " " };
        let _ = write!(out, "{sep}{value:#04x},");
    }
    out.push_str("\n};\n");
    out
}

fn u64_table(out: &mut String, name: &str, values: &[u64]) {
    let _ = write!(
        out,
        "static __device__ const u64 {name}[{}] = {{",
        values.len()
    );
    for (i, value) in values.iter().enumerate() {
        let sep = if i % 4 == 0 { "\n    " } else { " " };
        let _ = write!(out, "{sep}{value:#018x}ull,");
    }
    out.push_str("\n};\n");
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn header_holds_every_entry() {
        let header = tables_header();
        assert!(header.contains("iq1s_grid[2048]"));
        assert!(header.contains(&format!("{:#018x}ull", IQ1S_GRID[2047])));
        assert_eq!(header.matches("ull,").count(), 256 + 512 + 2048);
    }
}
