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
    u16_table(&mut out, "iq2xxs_grid_codes", &grid_codes(&IQ2XXS_GRID));
    out
}

/// The values of the IQ2 grids (every byte of IQ2XXS_GRID and IQ2XS_GRID is one of them).
const IQ2_GRID_VALUES: [u8; 3] = [0x08, 0x19, 0x2b];

/// Each grid entry's 8 bytes as 2-bit codes (code c stands for `IQ2_GRID_VALUES[c]`, byte j
/// in bits 2j..2j+2): 512 bytes instead of 2 KiB, so a warp's 32 data-dependent lookups touch
/// at most 4 cache lines instead of up to 16 (`q8dot.cuh` expands them with byte permutes).
/// A byte outside the three values would get code 3 (a zero byte when expanded); the tests
/// check there is none.
fn grid_codes(grid: &[u64]) -> Vec<u16> {
    grid.iter()
        .map(|&entry| {
            (0..8).fold(0u16, |codes, j| {
                let byte = (entry >> (8 * j)) as u8;
                let code = IQ2_GRID_VALUES.iter().position(|&v| v == byte).unwrap_or(3) as u16;
                codes | code << (2 * j)
            })
        })
        .collect()
}

fn u16_table(out: &mut String, name: &str, values: &[u16]) {
    let _ = write!(
        out,
        "static __device__ const u16 {name}[{}] = {{",
        values.len()
    );
    for (i, value) in values.iter().enumerate() {
        let sep = if i % 8 == 0 { "\n    " } else { " " };
        let _ = write!(out, "{sep}{value:#06x},");
    }
    out.push_str("\n};\n");
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
        assert!(header.contains("iq2xxs_grid_codes[256]"));
    }

    /// CUDA's `__byte_perm(x, y, s)`: byte i of the result is byte `s >> 4i & 7` of y:x.
    fn byte_perm(x: u32, y: u32, s: u32) -> u32 {
        let bytes = (u64::from(y) << 32 | u64::from(x)).to_le_bytes();
        (0..4).fold(0, |r, i| {
            r | u32::from(bytes[(s >> (4 * i) & 7) as usize]) << (8 * i)
        })
    }

    #[test]
    fn grid_codes_expand_by_the_kernels_permutes() {
        // iq2xxs_grid_q8 in q8dot.cuh, step for step.
        for (&entry, &codes) in IQ2XXS_GRID.iter().zip(&grid_codes(&IQ2XXS_GRID)) {
            let y = byte_perm(u32::from(codes), 0, 0x4140);
            let a = (y | y << 4) & 0x0f0f_0f0f;
            let nibbles = (a | a << 2) & 0x3333_3333;
            let lo = byte_perm(0x002b_1908, 0, nibbles & 0xffff);
            let hi = byte_perm(0x002b_1908, 0, nibbles >> 16);
            assert_eq!(u64::from(lo) | u64::from(hi) << 32, entry);
        }
    }

    #[test]
    fn grid_codes_expand_to_the_grids() {
        for grid in [&IQ2XXS_GRID[..], &IQ2XS_GRID[..]] {
            for (&entry, &codes) in grid.iter().zip(&grid_codes(grid)) {
                for j in 0..8 {
                    let code = usize::from(codes >> (2 * j) & 3);
                    assert!(code < 3, "{entry:#018x}: byte {j} is not a grid value");
                    assert_eq!(IQ2_GRID_VALUES[code], (entry >> (8 * j)) as u8);
                }
            }
        }
    }
}
