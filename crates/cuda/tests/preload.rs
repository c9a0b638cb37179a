//! The q8 expert down matvec that loads its weights ahead of the input's quantization
//! (`moe_decode.cu`) against the kernel that loads as it goes, bit for bit: the same terms
//! in the same order. Every type with q8 dots; rows of one and two items per lane, 16 and 32
//! lanes per row, an expert id out of range, with and without the shared expert. Skips with
//! a message where there is no GPU.

use redlite_cuda::{moe_down, moe_gate_up, with_preload, CudaSlice, Device, Q8_DOT_TYPES};
use redlite_gguf::GgmlType;

mod common;
use common::{device, q8_matrix as matrix, random_matrix, Rng};

/// The indices where two outputs differ in their bits.
fn differing(a: &[f32], b: &[f32]) -> Vec<usize> {
    assert_eq!(a.len(), b.len());
    (0..a.len())
        .filter(|&i| a[i].to_bits() != b[i].to_bits())
        .collect()
}

fn upload_random(
    device: &Device,
    ty: GgmlType,
    rows: usize,
    cols: usize,
    rng: &mut Rng,
) -> CudaSlice<u8> {
    device.upload(&random_matrix(ty, rows, cols, rng)).unwrap()
}

#[test]
fn expert_down_with_weights_loaded_ahead_is_bit_identical() {
    let Some(device) = device("expert_down_with_weights_loaded_ahead_is_bit_identical") else {
        return;
    };
    let mut rng = Rng(22);
    let (n_expert, rows) = (12, 512);
    // ff 512: 16 items a row (16 lanes, or 32 for 16-item blocks); 1024: 32 items;
    // 2048: two items per lane (Q2_K) or 64 items (32 lanes, two a lane).
    for ty in Q8_DOT_TYPES {
        for ff in [256, 512, 1024, 2048] {
            let cols = if ff % 1024 == 0 { 1024 } else { 2048 };
            // The old down kernel stages used x ff values in shared memory (48 KiB at most).
            let used = if ff >= 2048 { 5 } else { 10 };
            let gate = upload_random(&device, ty, n_expert * ff, cols, &mut rng);
            let up = upload_random(&device, ty, n_expert * ff, cols, &mut rng);
            let down = upload_random(&device, ty, n_expert * rows, ff, &mut rng);
            let s_gate = upload_random(&device, ty, ff, cols, &mut rng);
            let s_up = upload_random(&device, ty, ff, cols, &mut rng);
            let s_down = upload_random(&device, ty, rows, ff, &mut rng);
            let (gate, up) = (
                matrix(&gate, ty, (n_expert * ff, cols)),
                matrix(&up, ty, (n_expert * ff, cols)),
            );
            let down = matrix(&down, ty, (n_expert * rows, ff));
            let (s_gate, s_up) = (
                matrix(&s_gate, ty, (ff, cols)),
                matrix(&s_up, ty, (ff, cols)),
            );
            let s_down = matrix(&s_down, ty, (rows, ff));
            // One id out of range: its products are zeros, its down term is left out.
            let mut ids: Vec<i32> = (0..used).map(|k| ((3 * k + 1) % n_expert) as i32).collect();
            ids[4] = -1;
            let routing: Vec<f32> = (0..used).map(|_| rng.signed().abs()).collect();
            let x: Vec<f32> = (0..cols).map(|_| rng.signed()).collect();
            let ids = device.upload(&ids).unwrap();
            let routing = device.upload(&routing).unwrap();
            let x = device.upload(&x).unwrap();
            let shared_weight = device.upload(&[0.375f32]).unwrap();
            for with_shared in [false, true] {
                let run = |on: bool| {
                    with_preload(on, || {
                        let mut act = device.alloc_zeros::<f32>(used * ff).unwrap();
                        let mut act_shared = device.alloc_zeros::<f32>(ff).unwrap();
                        let mut act_shared_view = act_shared.as_view_mut();
                        let shared = with_shared.then_some((&s_gate, &s_up, &mut act_shared_view));
                        let (xv, iv) = (x.as_view(), ids.as_view());
                        moe_gate_up(
                            &device,
                            &gate,
                            &up,
                            ff,
                            &iv,
                            (&xv, None),
                            &mut act.as_view_mut(),
                            shared,
                        )
                        .unwrap();
                        let mut out = device.alloc_zeros::<f32>(rows).unwrap();
                        let (av, sv, wv) =
                            (act.as_view(), act_shared.as_view(), shared_weight.as_view());
                        let shared = with_shared.then_some((&s_down, &wv, &sv));
                        let rv = routing.as_view();
                        moe_down(
                            &device,
                            &down,
                            rows,
                            &iv,
                            &rv,
                            &av,
                            &mut out.as_view_mut(),
                            false,
                            shared,
                            true,
                        )
                        .unwrap();
                        let get = |s: &CudaSlice<f32>| device.download(s).unwrap();
                        (get(&act), get(&act_shared), get(&out))
                    })
                };
                let (plain, ahead) = (run(false), run(true));
                let case = format!("{ty:?} ff {ff} shared={with_shared}");
                for (name, a, b) in [
                    ("gate/up", &plain.0, &ahead.0),
                    ("shared gate/up", &plain.1, &ahead.1),
                    ("down", &plain.2, &ahead.2),
                ] {
                    let differ = differing(a, b);
                    assert!(
                        differ.is_empty(),
                        "{case}: {name} differs in {} of {} values, first at {}",
                        differ.len(),
                        a.len(),
                        differ[0]
                    );
                }
                assert!(
                    plain.2.iter().any(|&v| v != 0.0),
                    "{case}: nothing computed"
                );
            }
        }
    }
}
