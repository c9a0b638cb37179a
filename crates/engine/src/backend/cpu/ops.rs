//! Element-wise and normalization ops shared by the CPU layers. Reductions accumulate in
//! f64 (as ggml's CPU ops do), which keeps them close to an f64 reference.

/// `out = x · w / sqrt(mean(x²) + eps)` over one vector.
pub fn rms_norm(x: &[f32], w: &[f32], eps: f32, out: &mut [f32]) {
    let ms = (x.iter().map(|&v| f64::from(v) * f64::from(v)).sum::<f64>() / x.len() as f64) as f32;
    let scale = 1.0 / (ms + eps).sqrt();
    for ((o, v), g) in out.iter_mut().zip(x).zip(w) {
        *o = v * scale * g;
    }
}

/// RMSNorm of each row of `x` (`rows × w.len()`), in place.
pub fn rms_norm_rows(x: &mut [f32], w: &[f32], eps: f32) {
    let mut tmp = vec![0f32; w.len()];
    for row in x.chunks_mut(w.len()) {
        rms_norm(row, w, eps, &mut tmp);
        row.copy_from_slice(&tmp);
    }
}

/// `x · rsqrt(Σx² + eps)` in place (the L2 normalization HF applies to DeltaNet q and k).
pub fn l2_norm(x: &mut [f32], eps: f32) {
    let s = x.iter().map(|&v| f64::from(v) * f64::from(v)).sum::<f64>() as f32;
    let scale = 1.0 / (s + eps).sqrt();
    x.iter_mut().for_each(|v| *v *= scale);
}

pub fn sigmoid(x: f32) -> f32 {
    1.0 / (1.0 + (-x).exp())
}

pub fn silu(x: f32) -> f32 {
    x * sigmoid(x)
}

/// `log(1 + e^x)`, linear above 20 as torch's softplus.
pub fn softplus(x: f32) -> f32 {
    if x > 20.0 {
        x
    } else {
        x.exp().ln_1p()
    }
}

/// Softmax in place.
pub fn softmax(x: &mut [f32]) {
    let max = x.iter().copied().fold(f32::NEG_INFINITY, f32::max);
    let mut sum = 0f64;
    for v in x.iter_mut() {
        *v = (*v - max).exp();
        sum += f64::from(*v);
    }
    let inv = (1.0 / sum) as f32;
    x.iter_mut().for_each(|v| *v *= inv);
}
