//! What the benchmark examples share: random data and this thread's CPU time.
#![allow(dead_code)]

use half::f16;
use redlite_gguf::GgmlType;
use redlite_quant::{quantize_row, scale_fields, set_iq1m_scale, QuantizedActivation, ScaleKind};

/// xorshift64*: enough for random blocks.
pub struct Rng(pub u64);

impl Rng {
    pub fn next_u64(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }

    pub fn uniform(&mut self, lo: f32, hi: f32) -> f32 {
        lo + (hi - lo) * ((self.next_u64() >> 40) as f32 / (1u64 << 24) as f32)
    }
}

/// This thread's time on a CPU (Linux `schedstat`), in ns.
pub fn thread_cpu_ns() -> Option<u64> {
    let stat = std::fs::read_to_string("/proc/thread-self/schedstat").ok()?;
    stat.split_whitespace().next()?.parse().ok()
}

/// `rows` x `cols` values of `ty`: random bytes with scales of a trained model's size, or
/// random floats for the float types.
pub fn random_matrix(rng: &mut Rng, ty: GgmlType, rows: usize, cols: usize) -> Vec<u8> {
    let values = rows * cols;
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

/// `tokens` activations of `cols` values in [-2, 2), quantized for rows of `ty`.
pub fn random_activations(
    rng: &mut Rng,
    ty: GgmlType,
    tokens: usize,
    cols: usize,
) -> Vec<QuantizedActivation> {
    (0..tokens)
        .map(|_| {
            let x: Vec<f32> = (0..cols).map(|_| rng.uniform(-2.0, 2.0)).collect();
            QuantizedActivation::new(ty, &x).expect("activation")
        })
        .collect()
}

/// The batch sizes `BENCH_TOKENS` lists (e.g. `8,64`), else `default`.
pub fn bench_tokens(default: &[usize]) -> Vec<usize> {
    std::env::var("BENCH_TOKENS")
        .ok()
        .map(|list| {
            list.split(',')
                .filter_map(|t| t.trim().parse().ok())
                .collect()
        })
        .unwrap_or_else(|| default.to_vec())
}
