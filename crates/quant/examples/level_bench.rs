//! The batched kernels at each SIMD level in one process, trials interleaved across levels
//! (so machine noise hits them alike), best of many short trials: ns per (row, token).
//! Grid rows are decoded once up front (the decode is timed on its own, per row).
//!
//! `cargo run -p redlite-quant --release --example level_bench`

use redlite_gguf::GgmlType;
use redlite_quant::{
    available_levels, decode_row, dot_decoded_many_at, vec_dot_many_at, DecodedRow, SimdLevel,
};
use std::time::Instant;

mod common;
use common::{random_activations, random_matrix, Rng};
const ROWS: usize = 64;
const COLS: usize = 2048;
const TRIALS: usize = 60;

/// Best time of `run` in ns, per level, trials interleaved.
fn best_ns(levels: &[SimdLevel], mut run: impl FnMut(SimdLevel)) -> Vec<f64> {
    let mut best = vec![f64::INFINITY; levels.len()];
    for _ in 0..TRIALS {
        for (b, &level) in best.iter_mut().zip(levels) {
            let start = Instant::now();
            run(level);
            *b = b.min(start.elapsed().as_secs_f64() * 1e9);
        }
    }
    best
}

fn main() {
    let levels: Vec<SimdLevel> = available_levels()
        .into_iter()
        .filter(|&l| l >= SimdLevel::Avx2)
        .collect();
    let names: Vec<&str> = levels.iter().map(|l| l.name()).collect();
    println!("{ROWS} x {COLS}, one thread, ns per (row, token): {names:?}");
    let mut rng = Rng(0x9e37_79b9_7f4a_7c15);
    for ty in [
        GgmlType::IQ2XXS,
        GgmlType::Q4K,
        GgmlType::Q5K,
        GgmlType::Q2K,
    ] {
        let weights = random_matrix(&mut rng, ty, ROWS, COLS);
        let row_bytes = weights.len() / ROWS;
        let decodable = redlite_quant::decodable(ty);
        let decoded: Vec<DecodedRow> = if decodable {
            weights
                .chunks_exact(row_bytes)
                .map(|row| {
                    let mut d = DecodedRow::default();
                    decode_row(ty, row, &mut d).expect("decode");
                    d
                })
                .collect()
        } else {
            Vec::new()
        };
        if decodable {
            let mut scratch = DecodedRow::default();
            let ns = best_ns(&levels[..1], |_| {
                for row in weights.chunks_exact(row_bytes) {
                    decode_row(ty, row, &mut scratch).expect("decode");
                }
            });
            println!(
                "{:8} decode {:8.1} ns per row",
                ty.to_string(),
                ns[0] / ROWS as f64
            );
        }
        for tokens in [2usize, 8, 10, 64] {
            let acts = random_activations(&mut rng, ty, tokens, COLS);
            let mut out = vec![0f32; tokens];
            let ns = best_ns(&levels, |level| {
                if decodable {
                    for row in &decoded {
                        dot_decoded_many_at(level, row, &acts, &mut out).expect("dots");
                    }
                } else {
                    for row in weights.chunks_exact(row_bytes) {
                        vec_dot_many_at(level, ty, row, &acts, &mut out).expect("dots");
                    }
                }
            });
            let per: Vec<String> = ns
                .iter()
                .map(|n| format!("{:7.2}", n / (ROWS * tokens) as f64))
                .collect();
            let ratio = ns.last().unwrap_or(&0.0) / ns[0];
            println!(
                "{:8} T={tokens:3} {} ratio {ratio:.2}",
                ty.to_string(),
                per.join(" ")
            );
        }
    }
}
