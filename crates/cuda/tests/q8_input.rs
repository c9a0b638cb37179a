//! The norms that also quantize their output to Q8_K, and the q8 products reading those
//! codes instead of quantizing their input in each CTA: the norm output, every product row
//! and the expert gate/up activations are bit for bit those of the plain launches (the
//! codes are the same). The fused DeltaNet step's quantized output is checked in
//! `deltanet.rs`. Prints a message and passes without a GPU.

use redlite_cuda::{
    add_rms_norm, add_rms_norm_quantized, matmul, matmul_quantized, moe_gate_up, rms_norm,
    rms_norm_quantized, CudaSlice, Device, Q8Rows, Q8RowsMut, Q8_BLOCK_VALUES,
};
use redlite_gguf::GgmlType;

mod common;
use common::{device, q8_matrix as matrix, random_matrix, Rng};

const COLS: usize = 2048;
const EPS: f32 = 1e-6;

/// Rows of the one-token kernels' regimes: one token, a small batch (all its tokens in a
/// CTA), and the largest batch of decode size (token tiles).
const TOKEN_COUNTS: [usize; 3] = [1, 3, 16];

/// Codes of `tokens` rows: their scales and codes, zeroed.
fn q8_buffers(device: &Device, tokens: usize) -> (CudaSlice<f32>, CudaSlice<i8>) {
    let scales = device.alloc_zeros(tokens * COLS / Q8_BLOCK_VALUES).unwrap();
    let codes = device.alloc_zeros(tokens * COLS).unwrap();
    (scales, codes)
}

fn differing(a: &[f32], b: &[f32]) -> usize {
    a.iter()
        .zip(b)
        .filter(|(x, y)| x.to_bits() != y.to_bits())
        .count()
}

#[test]
fn quantizing_norms_and_products_keep_the_bits() {
    let Some(device) = device("quantizing_norms_and_products_keep_the_bits") else {
        return;
    };
    let mut rng = Rng(41);
    let w_norm: Vec<f32> = (0..COLS).map(|_| 1.0 + 0.5 * rng.signed()).collect();
    let w_norm = device.upload(&w_norm).unwrap();
    for tokens in TOKEN_COUNTS {
        let x: Vec<f32> = (0..tokens * COLS).map(|_| 3.0 * rng.signed()).collect();
        let y: Vec<f32> = (0..tokens * COLS).map(|_| rng.signed()).collect();
        let (x_dev, y_dev) = (device.upload(&x).unwrap(), device.upload(&y).unwrap());
        // The plain norms.
        let mut h_plain = device.alloc_zeros::<f32>(tokens * COLS).unwrap();
        rms_norm(
            &device,
            &x_dev.as_view(),
            &w_norm.as_view(),
            &mut h_plain.as_view_mut(),
            EPS,
        )
        .unwrap();
        let mut x_added = device.upload(&x).unwrap();
        let mut h_added = device.alloc_zeros::<f32>(tokens * COLS).unwrap();
        add_rms_norm(
            &device,
            &mut x_added.as_view_mut(),
            &y_dev.as_view(),
            &w_norm.as_view(),
            &mut h_added.as_view_mut(),
            EPS,
        )
        .unwrap();
        // The quantizing norms.
        let mut h = device.alloc_zeros::<f32>(tokens * COLS).unwrap();
        let (mut scales, mut codes) = q8_buffers(&device, tokens);
        let mut out = Q8RowsMut {
            scales: scales.as_view_mut(),
            codes: codes.as_view_mut(),
        };
        rms_norm_quantized(
            &device,
            &x_dev.as_view(),
            &w_norm.as_view(),
            &mut h.as_view_mut(),
            &mut out,
            EPS,
        )
        .unwrap();
        let mut x_added_q = device.upload(&x).unwrap();
        let mut h_added_q = device.alloc_zeros::<f32>(tokens * COLS).unwrap();
        let (mut scales_added, mut codes_added) = q8_buffers(&device, tokens);
        let mut out_added = Q8RowsMut {
            scales: scales_added.as_view_mut(),
            codes: codes_added.as_view_mut(),
        };
        add_rms_norm_quantized(
            &device,
            &mut x_added_q.as_view_mut(),
            &y_dev.as_view(),
            &w_norm.as_view(),
            &mut h_added_q.as_view_mut(),
            &mut out_added,
            EPS,
        )
        .unwrap();
        let down = |s: &CudaSlice<f32>| device.download(s).unwrap();
        for (name, a, b) in [
            ("rms_norm output", down(&h_plain), down(&h)),
            ("add_rms_norm output", down(&h_added), down(&h_added_q)),
            ("add_rms_norm residual", down(&x_added), down(&x_added_q)),
        ] {
            assert_eq!(differing(&a, &b), 0, "{tokens} tokens: {name} differs");
        }
        let codes_host: Vec<i8> = device.download(&codes).unwrap();
        assert!(
            codes_host.iter().any(|&c| c != 0),
            "{tokens} tokens: no codes written"
        );
        let q8 = Q8Rows {
            scales: scales.as_view(),
            codes: codes.as_view(),
        };
        // Dense (2048 rows), split-K (64 rows) and the LM head's type, and the experts.
        for (ty, rows) in [
            (GgmlType::IQ2XXS, 2048),
            (GgmlType::IQ2XXS, 64),
            (GgmlType::Q4K, 512),
            (GgmlType::Q6K, 1024),
            (GgmlType::IQ1M, 256),
        ] {
            let bytes = device
                .upload(&random_matrix(ty, rows, COLS, &mut rng))
                .unwrap();
            let m = matrix(&bytes, ty, (rows, COLS));
            let mut plain = device.alloc_zeros::<f32>(tokens * rows).unwrap();
            matmul(&device, &m, &h_plain.as_view(), &mut plain.as_view_mut()).unwrap();
            let mut read = device.alloc_zeros::<f32>(tokens * rows).unwrap();
            matmul_quantized(
                &device,
                &m,
                (&h.as_view(), Some(&q8)),
                &mut read.as_view_mut(),
            )
            .unwrap();
            let (a, b) = (down(&plain), down(&read));
            assert!(
                a.iter().any(|&v| v != 0.0),
                "{ty:?} {rows}x{COLS}: nothing computed"
            );
            let n = differing(&a, &b);
            assert_eq!(
                n,
                0,
                "{ty:?} {rows}x{COLS}, {tokens} tokens: {n} of {} rows differ",
                a.len()
            );
        }
        let (ff, n_expert, used) = (512, 12, 4);
        let ty = GgmlType::IQ2XXS;
        let gate = device
            .upload(&random_matrix(ty, n_expert * ff, COLS, &mut rng))
            .unwrap();
        let up = device
            .upload(&random_matrix(ty, n_expert * ff, COLS, &mut rng))
            .unwrap();
        let (gate, up) = (
            matrix(&gate, ty, (n_expert * ff, COLS)),
            matrix(&up, ty, (n_expert * ff, COLS)),
        );
        let ids: Vec<i32> = (0..tokens)
            .flat_map(|t| (0..used).map(move |k| ((3 * t + 5 * k) % n_expert) as i32))
            .collect();
        let ids = device.upload(&ids).unwrap();
        let gate_up = |q8: Option<&Q8Rows<'_>>| {
            let mut act = device.alloc_zeros::<f32>(tokens * used * ff).unwrap();
            let x = if q8.is_some() {
                h.as_view()
            } else {
                h_plain.as_view()
            };
            moe_gate_up(
                &device,
                &gate,
                &up,
                ff,
                &ids.as_view(),
                (&x, q8),
                &mut act.as_view_mut(),
                None,
            )
            .unwrap();
            down(&act)
        };
        let (a, b) = (gate_up(None), gate_up(Some(&q8)));
        assert!(a.iter().any(|&v| v != 0.0), "experts: nothing computed");
        assert_eq!(
            differing(&a, &b),
            0,
            "{tokens} tokens: expert gate/up differs"
        );
    }
}

#[test]
fn codes_of_the_wrong_length_are_refused() {
    let Some(device) = device("codes_of_the_wrong_length_are_refused") else {
        return;
    };
    let mut rng = Rng(7);
    let ty = GgmlType::IQ2XXS;
    let bytes = device
        .upload(&random_matrix(ty, 256, COLS, &mut rng))
        .unwrap();
    let m = matrix(&bytes, ty, (256, COLS));
    let x = device.alloc_zeros::<f32>(2 * COLS).unwrap();
    let (scales, codes) = q8_buffers(&device, 1);
    let q8 = Q8Rows {
        scales: scales.as_view(),
        codes: codes.as_view(),
    };
    let mut y = device.alloc_zeros::<f32>(2 * 256).unwrap();
    let error = matmul_quantized(&device, &m, (&x.as_view(), Some(&q8)), &mut y.as_view_mut())
        .expect_err("codes of one row for two tokens");
    assert!(error.to_string().contains("Q8_K"), "{error}");
}
