//! Single-thread mat-vec speed of the fast kernels, per type and SIMD level, on one
//! 512 × 2048 expert matrix (random valid blocks).
//!
//! `cargo run -p redlite-quant --release --example matvec_bench [-- --stream]`
//!
//! Default: the same matrix over and over (it stays in L2: kernel-bound). `--stream`
//! cycles through copies filling ~384 MiB, so weights come from memory. Each time is the
//! best of 12 trials of 40 ms, in the thread's CPU time where Linux reports it, else wall
//! time: fairer on a shared machine.

use half::f16;
use redlite_gguf::GgmlType;
use redlite_quant::{
    available_levels, matvec_at, quantize_row, scale_fields, set_iq1m_scale, QuantizedActivation,
    ScaleKind,
};
use std::time::{Duration, Instant};

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

/// xorshift64*: enough for random blocks.
struct Rng(u64);

impl Rng {
    fn next_u64(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }

    fn uniform(&mut self, lo: f32, hi: f32) -> f32 {
        lo + (hi - lo) * ((self.next_u64() >> 40) as f32 / (1u64 << 24) as f32)
    }
}

/// This thread's time on a CPU (Linux `schedstat`), in ns.
fn thread_cpu_ns() -> Option<u64> {
    let stat = std::fs::read_to_string("/proc/thread-self/schedstat").ok()?;
    stat.split_whitespace().next()?.parse().ok()
}

fn random_matrix(rng: &mut Rng, ty: GgmlType) -> Vec<u8> {
    let values = ROWS * COLS;
    if !ty.is_quantized() {
        let floats: Vec<f32> = (0..values).map(|_| rng.uniform(-1.0, 1.0)).collect();
        let mut bytes = vec![0u8; values * ty.block_bytes()];
        quantize_row(ty, &floats, &mut bytes).expect("float types quantize");
        return bytes;
    }
    let mut bytes = vec![0u8; values / ty.block_values() * ty.block_bytes()];
    bytes.fill_with(|| rng.next_u64() as u8);
    for block in bytes.chunks_exact_mut(ty.block_bytes()) {
        for field in scale_fields(ty) {
            let value = match field.kind {
                ScaleKind::Dmin => rng.uniform(-0.05, 0.05),
                _ => rng.uniform(0.005, 0.05),
            };
            field.write(block, value);
        }
        if ty == GgmlType::IQ1M {
            set_iq1m_scale(block, f16::from_f32(rng.uniform(0.005, 0.05))).expect("IQ1_M");
        }
    }
    bytes
}

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
        let matrix = random_matrix(&mut rng, ty);
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
