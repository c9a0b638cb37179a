//! Byte sizes as people write them (`24GiB`, `24G`, `16000MiB`, `23.5GiB`) and as the plan
//! prints them.
//!
//! `K`, `M`, `G`, `T` and `KiB` ... `TiB` are binary (a "24 GB" card holds 24 GiB, and
//! `nvidia-smi` counts in MiB); `KB`, `MB`, `GB`, `TB` are decimal, as disk vendors write
//! them. A bare number is bytes.

use crate::plan::error::{PlanError, Result};

const UNITS: &[(&str, u64)] = &[
    ("", 1),
    ("B", 1),
    ("K", 1 << 10),
    ("KIB", 1 << 10),
    ("M", 1 << 20),
    ("MIB", 1 << 20),
    ("G", 1 << 30),
    ("GIB", 1 << 30),
    ("T", 1 << 40),
    ("TIB", 1 << 40),
    ("KB", 1_000),
    ("MB", 1_000_000),
    ("GB", 1_000_000_000),
    ("TB", 1_000_000_000_000),
];

pub const MIB: u64 = 1 << 20;
pub const GIB: u64 = 1 << 30;

/// Parses a byte size; fractions are allowed with a unit (`23.5GiB`) and round down to a
/// whole byte.
pub fn parse_bytes(input: &str) -> Result<u64> {
    let bad = |why: &'static str| PlanError::BadBytes {
        input: input.to_string(),
        why,
    };
    let s = input.trim();
    let split = s
        .find(|c: char| !(c.is_ascii_digit() || c == '.'))
        .unwrap_or(s.len());
    let (number, unit) = s.split_at(split);
    if number.is_empty() {
        return Err(bad("no number"));
    }
    let unit = unit.trim().to_ascii_uppercase();
    let scale = UNITS
        .iter()
        .find(|(name, _)| *name == unit)
        .map(|&(_, scale)| scale)
        .ok_or_else(|| bad("unknown unit"))?;
    let (whole, fraction) = number.split_once('.').unwrap_or((number, ""));
    if whole.is_empty() && fraction.is_empty() || fraction.contains('.') {
        return Err(bad("malformed number"));
    }
    let whole: u64 = if whole.is_empty() {
        0
    } else {
        whole.parse().map_err(|_| bad("number too large"))?
    };
    let mut bytes = whole.checked_mul(scale).ok_or_else(|| bad("too large"))?;
    if !fraction.is_empty() {
        // Exact decimal arithmetic on at most 12 fraction digits (enough below a byte of a TiB).
        let digits = &fraction[..fraction.len().min(12)];
        let numerator: u128 = digits.parse().map_err(|_| bad("malformed number"))?;
        let denominator = 10u128.pow(digits.len() as u32);
        let part = numerator * u128::from(scale) / denominator;
        bytes = bytes
            .checked_add(u64::try_from(part).map_err(|_| bad("too large"))?)
            .ok_or_else(|| bad("too large"))?;
    }
    Ok(bytes)
}

/// `1.23 GiB` from 1 GiB up, `456.7 MiB` from 1 MiB up, else `12.3 KiB` or bytes.
pub fn human(bytes: u64) -> String {
    let b = bytes as f64;
    if bytes >= GIB {
        format!("{:.2} GiB", b / GIB as f64)
    } else if bytes >= MIB {
        format!("{:.1} MiB", b / MIB as f64)
    } else if bytes >= 1 << 10 {
        format!("{:.1} KiB", b / 1024.0)
    } else {
        format!("{bytes} B")
    }
}

/// Like [`human`] for a difference that may be negative.
pub fn human_signed(bytes: i128) -> String {
    let magnitude = u64::try_from(bytes.unsigned_abs()).unwrap_or(u64::MAX);
    if bytes < 0 {
        format!("-{}", human(magnitude))
    } else {
        human(magnitude)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn binary_decimal_and_fractions() {
        assert_eq!(parse_bytes("24GiB").unwrap(), 24 * GIB);
        assert_eq!(parse_bytes("24G").unwrap(), 24 * GIB);
        assert_eq!(parse_bytes("24 gib").unwrap(), 24 * GIB);
        assert_eq!(parse_bytes("16000MiB").unwrap(), 16_000 * MIB);
        assert_eq!(parse_bytes("24GB").unwrap(), 24_000_000_000);
        assert_eq!(parse_bytes("23.5GiB").unwrap(), 47 * GIB / 2);
        assert_eq!(parse_bytes("0.5K").unwrap(), 512);
        assert_eq!(parse_bytes("25769803776").unwrap(), 24 * GIB);
    }

    #[test]
    fn refuses_what_is_not_a_size() {
        for bad in [
            "",
            "GiB",
            "24XB",
            "1.2.3G",
            "-5G",
            ".",
            "99999999999999999999T",
        ] {
            assert!(parse_bytes(bad).is_err(), "{bad:?} was accepted");
        }
    }

    #[test]
    fn prints_in_the_largest_fitting_unit() {
        assert_eq!(human(24 * GIB), "24.00 GiB");
        assert_eq!(human(3 * MIB / 2), "1.5 MiB");
        assert_eq!(human(2048), "2.0 KiB");
        assert_eq!(human(12), "12 B");
        assert_eq!(human_signed(-(MIB as i128)), "-1.0 MiB");
    }
}
