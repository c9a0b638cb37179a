//! Single-thread speed of the batched (prompt-processing) kernels: one 512 × 2048 matrix
//! against T activations, per weight type, in ns per (row, token) product.
//!
//! `cargo run -p redlite-quant --release --example many_bench`
//!
//! Grid types (IQ2_XXS, IQ2_XS, IQ1_M) decode each row once and dot it with every token
//! (`decode_row` + `dot_decoded_many`); the others use `vec_dot_many`. T = 10 is an
//! expert's share of a 512-token prompt (10 of 512 experts per token), T = 64 a dense
//! projection's tile. Best of 8 trials, thread CPU time where Linux reports it.
//! `REDLITE_SIMD=avx2` (or `scalar`) caps the SIMD level, to compare levels.

use redlite_gguf::GgmlType;
use redlite_quant::{decodable, decode_row, dot_decoded_many, vec_dot_many, DecodedRow};
use std::time::{Duration, Instant};

mod common;
use common::{bench_tokens, random_activations, random_matrix, thread_cpu_ns, Rng};
const ROWS: usize = 512;
const COLS: usize = 2048;

fn main() {
    let mut rng = Rng(0x9e37_79b9_7f4a_7c15);
    // `BENCH_TOKENS=8,64` picks the batch sizes; `BENCH_TYPES=IQ2_XXS,Q4_K` the types.
    let token_counts = bench_tokens(&[1, 10, 64]);
    let types = std::env::var("BENCH_TYPES").ok();
    println!(
        "{ROWS} x {COLS} against T tokens, one thread, {}: ns per (row, token)",
        redlite_quant::simd_level()
    );
    for ty in [
        GgmlType::IQ2XXS,
        GgmlType::Q4K,
        GgmlType::Q5K,
        GgmlType::Q2K,
    ] {
        if let Some(types) = &types {
            if !types.split(',').any(|name| name.trim() == ty.to_string()) {
                continue;
            }
        }
        let weights = random_matrix(&mut rng, ty, ROWS, COLS);
        let row_bytes = weights.len() / ROWS;
        for &tokens in &token_counts {
            let acts = random_activations(&mut rng, ty, tokens, COLS);
            let mut out = vec![0f32; tokens];
            let mut decoded = DecodedRow::default();
            let mut run = || {
                for row in weights.chunks_exact(row_bytes) {
                    if tokens > 1 && decodable(ty) {
                        decode_row(ty, row, &mut decoded).expect("decode");
                        dot_decoded_many(&decoded, &acts, &mut out).expect("dots");
                    } else {
                        vec_dot_many(ty, row, &acts, &mut out).expect("dots");
                    }
                }
            };
            run();
            let mut best = f64::INFINITY;
            for _ in 0..8 {
                let start = Instant::now();
                let cpu = thread_cpu_ns();
                let mut calls = 0usize;
                while start.elapsed() < Duration::from_millis(50) {
                    run();
                    calls += 1;
                }
                let busy = match (cpu, thread_cpu_ns()) {
                    (Some(a), Some(b)) if b > a => (b - a) as f64 * 1e-9,
                    _ => start.elapsed().as_secs_f64(),
                };
                best = best.min(busy / calls as f64);
            }
            println!(
                "{:8} T={:3} {:8.1} ns",
                ty.to_string(),
                tokens,
                best * 1e9 / (ROWS * tokens) as f64
            );
        }
    }
}
