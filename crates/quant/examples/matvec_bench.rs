//! Single-thread mat-vec speed of the fast kernels, per type and SIMD level, on one
//! 512 × 2048 expert matrix (random valid blocks).
//!
//! `cargo run -p redlite-quant --release --example matvec_bench [-- --stream]`
//!
//! Default: the same matrix over and over (it stays in L2: kernel-bound). `--stream`
//! cycles through copies filling ~384 MiB, so weights come from memory. Each time is the
//! best of 12 trials of 40 ms, in the thread's CPU time where Linux reports it, else wall
//! time: fairer on a shared machine.

use redlite_gguf::GgmlType;
use redlite_quant::{available_levels, matvec_at, QuantizedActivation};
use std::time::{Duration, Instant};

mod common;
use common::{random_matrix, thread_cpu_ns, Rng};
const ROWS: usize = 512;
const COLS: usize = 2048;
const STREAM_BYTES: usize = 384 << 20;
const TRIALS: usize = 12;
const TRIAL_TIME: Duration = Duration::from_millis(40);

const TYPES: [GgmlType; 10] = [
    GgmlType::IQ1M,
    GgmlType::IQ2XXS,
    GgmlType::IQ2XS,
    GgmlType::Q2K,
    GgmlType::Q4K,
    GgmlType::Q5K,
    GgmlType::Q6K,
    GgmlType::Q8_0,
    GgmlType::F16,
    GgmlType::F32,
];

fn main() {
    let stream = std::env::args().any(|a| a == "--stream");
    let mut rng = Rng(0x9e37_79b9_7f4a_7c15);
    let activation: Vec<f32> = (0..COLS).map(|_| rng.uniform(-2.0, 2.0)).collect();
    println!(
        "{ROWS} x {COLS} mat-vec, one thread, {}; best level: {}",
        if stream {
            "weights streamed from memory"
        } else {
            "weights hot in cache"
        },
        redlite_quant::simd_level()
    );
    println!(
        "{:8} {:7} {:>10} {:>12} {:>9}",
        "type", "level", "us/matvec", "rows/s", "GB/s"
    );
    let mut out = vec![0.0f32; ROWS];
    for ty in TYPES {
        let matrix = random_matrix(&mut rng, ty, ROWS, COLS);
        let copies = if stream {
            (STREAM_BYTES / matrix.len()).max(2)
        } else {
            1
        };
        let weights = matrix.repeat(copies);
        let act = QuantizedActivation::new(ty, &activation).expect("activation");
        for level in available_levels() {
            let run = |copy: usize, out: &mut [f32]| {
                let w = &weights[copy * matrix.len()..(copy + 1) * matrix.len()];
                matvec_at(level, ty, w, ROWS, &act, out).expect("matvec");
            };
            run(0, &mut out);
            // The best of several short trials: the machine may be shared.
            let mut seconds = f64::INFINITY;
            let mut copy = 0usize;
            for _ in 0..TRIALS {
                let start = Instant::now();
                let start_cpu = thread_cpu_ns();
                let mut calls = 0usize;
                while start.elapsed() < TRIAL_TIME {
                    run(copy % copies, &mut out);
                    copy += 1;
                    calls += 1;
                }
                let wall = start.elapsed().as_secs_f64();
                // The thread's CPU time leaves out time preempted by other processes.
                let busy = match (start_cpu, thread_cpu_ns()) {
                    (Some(a), Some(b)) if b > a => (b - a) as f64 * 1e-9,
                    _ => wall,
                };
                seconds = seconds.min(busy / calls as f64);
            }
            println!(
                "{:8} {:7} {:>10.1} {:>12.0} {:>9.2}",
                ty.to_string(),
                level.name(),
                seconds * 1e6,
                ROWS as f64 / seconds,
                matrix.len() as f64 / seconds / 1e9
            );
        }
    }
}
