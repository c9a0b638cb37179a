//! Single-thread speed of the tiled products of decoded grid rows (`dot_decoded_tile`, AVX-512
//! VNNI) against the batched row kernel (`dot_decoded_many`), rows decoded beforehand: ns
//! per (row, token) product of a 512 × 2048 matrix against T tokens, best of 12 trials.
//!
//! `cargo run -p redlite-quant --release --example tile_bench` (`BENCH_TOKENS=10,64`)

use redlite_gguf::GgmlType;
use redlite_quant::{
    decode_row, dot_decoded_many, dot_decoded_tile, tiles_available, ActTile, DecodedRow,
    TILE_TOKENS,
};
use std::time::Instant;

mod common;
use common::{bench_tokens, random_activations, random_matrix, Rng};
const ROWS: usize = 512;
const COLS: usize = 2048;

fn main() {
    if !tiles_available() {
        println!("no AVX-512 VNNI here (or REDLITE_SIMD caps it): nothing to compare");
        return;
    }
    let token_counts = bench_tokens(&[4, 8, 10, 16, 32, 64]);
    let mut rng = Rng(0x9e37_79b9_7f4a_7c15);
    println!("{ROWS} x {COLS} against T tokens, one thread: ns per (row, token), rows decoded");
    for ty in [GgmlType::IQ2XXS, GgmlType::IQ2XS, GgmlType::IQ1M] {
        let m = random_matrix(&mut rng, ty, ROWS, COLS);
        let row_bytes = m.len() / ROWS;
        let decoded: Vec<DecodedRow> = m
            .chunks_exact(row_bytes)
            .map(|row| {
                let mut d = DecodedRow::default();
                decode_row(ty, row, &mut d).expect("decodes");
                d
            })
            .collect();
        for &tokens in &token_counts {
            let acts = random_activations(&mut rng, ty, tokens, COLS);
            let mut out = vec![0f32; ROWS * tokens];
            let (mut many, mut tiled) = (f64::MAX, f64::MAX);
            for _ in 0..12 {
                let start = Instant::now();
                for (row, o) in decoded.iter().zip(out.chunks_mut(tokens)) {
                    dot_decoded_many(row, &acts, o).expect("dots");
                }
                many = many.min(start.elapsed().as_secs_f64());
                let start = Instant::now();
                let tiles: Vec<ActTile> = acts
                    .chunks(TILE_TOKENS)
                    .map(|a| ActTile::new(a).expect("tile"))
                    .collect();
                for (i, tile) in tiles.iter().enumerate() {
                    let out = &mut out[i * TILE_TOKENS..];
                    dot_decoded_tile(&decoded, tile, out, tokens).expect("tile dots");
                }
                tiled = tiled.min(start.elapsed().as_secs_f64());
            }
            let per = 1e9 / (ROWS * tokens) as f64;
            println!(
                "{ty:8} T = {tokens:3}: many {:6.1} ns, tiled {:6.1} ns ({:.2}x)",
                many * per,
                tiled * per,
                many / tiled
            );
        }
    }
}
