//! The 256-value "k-quant" super-block formats, Q8_K (their activation format), and the
//! scale-fitting helpers of ggml's reference quantizers.

mod q2q3;
mod q4q5;
mod q6;
mod q8k;

pub use q2q3::{BlockQ2K, BlockQ3K};
pub use q4q5::{BlockQ4K, BlockQ5K};
pub use q6::BlockQ6K;
pub use q8k::BlockQ8K;

use crate::block::nearest_int;

/// Values per super-block.
pub const QK_K: usize = 256;

/// ggml's `GROUP_MAX_EPS`: a group whose largest magnitude is below this is all zero.
const GROUP_MAX_EPS: f32 = 1e-15;

/// The 6-bit scale and min of sub-block `j` (0..8) from the 12 packed bytes of Q4_K /
/// Q5_K (ggml's `get_scale_min_k4`).
pub(crate) fn scale_min_k4(j: usize, packed: &[u8; 12]) -> (u8, u8) {
    if j < 4 {
        (packed[j] & 63, packed[j + 4] & 63)
    } else {
        (
            (packed[j + 4] & 0x0f) | ((packed[j - 4] >> 6) << 4),
            (packed[j + 4] >> 4) | ((packed[j] >> 6) << 4),
        )
    }
}

/// The per-lane integer sums of ggml's scalar k-quant dots: lane l collects
/// `scale16[i/16] · a[i] · q8[i]` over the elements i ≡ l (mod 8).
pub(crate) fn lane_sums(codes: &[i8; QK_K], q8: &[i8; QK_K], scale16: &[i32; 16]) -> [i32; 8] {
    let mut lanes = [0i32; 8];
    for (chunk, (a, q)) in codes.chunks_exact(8).zip(q8.chunks_exact(8)).enumerate() {
        let scale = scale16[chunk / 2];
        for l in 0..8 {
            lanes[l] += scale * (i32::from(a[l]) * i32::from(q[l]));
        }
    }
    lanes
}

/// ggml's eight float lane accumulators, summed once after the last block.
#[derive(Default)]
pub(crate) struct Lanes {
    sums: [f32; 8],
}

impl Lanes {
    pub(crate) fn add(&mut self, d: f32, lanes: &[i32; 8]) {
        for (sum, &lane) in self.sums.iter_mut().zip(lanes) {
            *sum += d * lane as f32;
        }
    }

    pub(crate) fn total(&self, mut start: f32) -> f32 {
        for &sum in &self.sums {
            start += sum;
        }
        start
    }
}

/// ggml's `make_qkx2_quants`: fits `x ≈ scale·L − min` with L in 0..=nmax by weighted least
/// squares over a sweep of `nstep + 1` trial inverse scales. Writes the codes to `codes`
/// and returns `(scale, min)` (min ≥ 0, subtracted on dequantization).
pub(crate) fn make_qkx2_quants(
    x: &[f32],
    weights: &[f32],
    nmax: i32,
    codes: &mut [u8],
    rmin: f32,
    rdelta: f32,
    nstep: i32,
) -> (f32, f32) {
    let n = x.len();
    let mut min = x[0];
    let mut max = x[0];
    let mut sum_w = weights[0];
    let mut sum_x = sum_w * x[0];
    for i in 1..n {
        if x[i] < min {
            min = x[i];
        }
        if x[i] > max {
            max = x[i];
        }
        sum_w += weights[i];
        sum_x += weights[i] * x[i];
    }
    if min > 0.0 {
        min = 0.0;
    }
    if max == min {
        codes[..n].fill(0);
        return (0.0, -min);
    }
    let code_of = |iscale: f32, v: f32, min: f32| nearest_int(iscale * (v - min)).clamp(0, nmax);

    let mut iscale = nmax as f32 / (max - min);
    let mut scale = 1.0 / iscale;
    let mut best_error = 0.0f32;
    for i in 0..n {
        codes[i] = code_of(iscale, x[i], min) as u8;
        let diff = scale * f32::from(codes[i]) + min - x[i];
        best_error += weights[i] * (diff * diff);
    }
    let mut trial = [0u8; 32];
    for step in 0..=nstep {
        iscale = (rmin + rdelta * step as f32 + nmax as f32) / (max - min);
        let (mut sum_l, mut sum_l2, mut sum_xl) = (0.0f32, 0.0f32, 0.0f32);
        for i in 0..n {
            let l = code_of(iscale, x[i], min);
            trial[i] = l as u8;
            let (w, l) = (weights[i], l as f32);
            sum_l += w * l;
            sum_l2 += w * l * l;
            sum_xl += w * l * x[i];
        }
        let det = sum_w * sum_l2 - sum_l * sum_l;
        if det > 0.0 {
            let mut this_scale = (sum_w * sum_xl - sum_x * sum_l) / det;
            let mut this_min = (sum_l2 * sum_x - sum_l * sum_xl) / det;
            if this_min > 0.0 {
                this_min = 0.0;
                this_scale = sum_xl / sum_l2;
            }
            let mut cur_error = 0.0f32;
            for i in 0..n {
                let diff = this_scale * f32::from(trial[i]) + this_min - x[i];
                cur_error += weights[i] * (diff * diff);
            }
            if cur_error < best_error {
                codes[..n].copy_from_slice(&trial[..n]);
                best_error = cur_error;
                scale = this_scale;
                min = this_min;
            }
        }
    }
    (scale, -min)
}

/// ggml's `make_qx_quants` with `rmse_type = 1` and no importance weights: fits the
/// symmetric `x ≈ scale·(L − nmax)` with weights x², trying 19 inverse scales around
/// `−nmax / max`. Writes codes `L` in 0..2·nmax and returns the scale.
pub(crate) fn make_qx_quants(x: &[f32], nmax: i32, codes: &mut [u8]) -> f32 {
    let n = x.len();
    let (mut max, mut amax) = (0.0f32, 0.0f32);
    for &v in x {
        if v.abs() > amax {
            amax = v.abs();
            max = v;
        }
    }
    if amax < GROUP_MAX_EPS {
        codes[..n].fill(0);
        return 0.0;
    }
    let code_of = |iscale: f32, v: f32| nearest_int(iscale * v).clamp(-nmax, nmax - 1);
    // Weighted sums Σ w·x·l and Σ w·l² for an inverse scale, with w = x².
    let sums = |iscale: f32| {
        let (mut sumlx, mut suml2) = (0.0f32, 0.0f32);
        for &v in x {
            let l = code_of(iscale, v) as f32;
            let w = v * v;
            sumlx += w * v * l;
            suml2 += w * l * l;
        }
        (sumlx, suml2)
    };
    let write_codes = |iscale: f32, codes: &mut [u8]| {
        for (code, &v) in codes.iter_mut().zip(x) {
            *code = (nmax + code_of(iscale, v)) as u8;
        }
    };

    let iscale = -(nmax as f32) / max;
    write_codes(iscale, codes);
    let (sumlx, suml2) = sums(iscale);
    let mut scale = if suml2 != 0.0 { sumlx / suml2 } else { 0.0 };
    let mut best = scale * sumlx;
    for step in -9..=9 {
        if step == 0 {
            continue;
        }
        let iscale = -(nmax as f32 + 0.1 * step as f32) / max;
        let (sumlx, suml2) = sums(iscale);
        if suml2 > 0.0 && sumlx * sumlx > best * suml2 {
            write_codes(iscale, codes);
            scale = sumlx / suml2;
            best = scale * sumlx;
        }
    }
    scale
}
