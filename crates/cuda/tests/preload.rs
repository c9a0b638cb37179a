//! The q8 expert down matvec that loads its weights ahead of the input's quantization
//! (`moe_decode.cu`) against the kernel that loads as it goes, bit for bit: the same terms
//! in the same order. Every type with q8 dots; rows of one and two items per lane, 16 and 32
//! lanes per row, an expert id out of range, with and without the shared expert. Skips with
//! a message where there is no GPU.

use redlite_cuda::{
    moe_act_codes_take, moe_down, moe_down_coded, moe_gate_up, moe_gate_up_coding, with_preload,
    ActCodes, ActCodesMut, CudaSlice, Device, Q8_DOT_TYPES,
};
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

/// The down matvec reading its input's codes from the gate/up launch (`moe_gate_up_coding`,
/// `moe_down_coded`) against each down CTA quantizing act itself, bit for bit: activations,
/// the shared expert's, and the down's sums. Every type with q8 dots where the kernels take
/// the codes; 1 and 3 tokens, an expert id out of range, with and without the shared
/// expert; each coded case run twice (the launch leaves its tickets zeroed for the next).
#[test]
fn down_input_codes_from_the_gate_up_launch_are_bit_identical() {
    let name = "down_input_codes_from_the_gate_up_launch_are_bit_identical";
    let Some(device) = device(name) else {
        return;
    };
    let mut rng = Rng(23);
    let (n_expert, rows, used) = (12usize, 512usize, 10usize);
    let mut checked = 0;
    for ty in Q8_DOT_TYPES {
        for ff in [256, 512, 1024] {
            let cols = 2048;
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
            for (tokens, with_shared) in [(1, false), (1, true), (3, true)] {
                let shared_ff = if with_shared { ff } else { 0 };
                if !moe_act_codes_take(&gate, &down, ff, shared_ff) {
                    continue;
                }
                checked += 1;
                let mut ids: Vec<i32> = (0..tokens * used)
                    .map(|i| ((5 * i + 2) % n_expert) as i32)
                    .collect();
                ids[4] = -1;
                let routing: Vec<f32> = (0..tokens * used).map(|_| rng.signed().abs()).collect();
                let x: Vec<f32> = (0..tokens * cols).map(|_| rng.signed()).collect();
                let weights: Vec<f32> = (0..tokens).map(|_| rng.signed().abs()).collect();
                let (ids, routing) = (
                    device.upload(&ids).unwrap(),
                    device.upload(&routing).unwrap(),
                );
                let (x, shared_weight) =
                    (device.upload(&x).unwrap(), device.upload(&weights).unwrap());
                let stride = (used * ff + ff).next_multiple_of(256);
                let mut codes = device.alloc_zeros::<i8>(tokens * stride).unwrap();
                let mut scales = device.alloc_zeros::<f32>(tokens * stride / 256).unwrap();
                let tickets_len = tokens * (used + 1) * ff.div_ceil(256);
                let mut tickets = device.alloc_zeros::<i32>(tickets_len).unwrap();
                let mut run = |coded: bool| {
                    let mut act = device.alloc_zeros::<f32>(tokens * used * ff).unwrap();
                    let mut act_shared = device.alloc_zeros::<f32>(tokens * ff).unwrap();
                    let mut act_shared_view = act_shared.as_view_mut();
                    let shared = with_shared.then_some((&s_gate, &s_up, &mut act_shared_view));
                    let (xv, iv) = (x.as_view(), ids.as_view());
                    let mut av = act.as_view_mut();
                    let (mut cv, mut sv, mut tv) = (
                        codes.as_view_mut(),
                        scales.as_view_mut(),
                        tickets.as_view_mut(),
                    );
                    if coded {
                        let made = ActCodesMut {
                            scales: &mut sv,
                            codes: &mut cv,
                            tickets: &mut tv,
                            stride,
                        };
                        moe_gate_up_coding(
                            &device,
                            &gate,
                            &up,
                            ff,
                            &iv,
                            (&xv, None),
                            &mut av,
                            shared,
                            made,
                        )
                        .unwrap();
                    } else {
                        moe_gate_up(&device, &gate, &up, ff, &iv, (&xv, None), &mut av, shared)
                            .unwrap();
                    }
                    let mut out = device.alloc_zeros::<f32>(tokens * rows).unwrap();
                    let (av, asv, wv) =
                        (act.as_view(), act_shared.as_view(), shared_weight.as_view());
                    let shared = with_shared.then_some((&s_down, &wv, &asv));
                    let (rv, ov) = (routing.as_view(), &mut out.as_view_mut());
                    if coded {
                        let (cv, sv) = (codes.as_view(), scales.as_view());
                        let given = ActCodes {
                            scales: &sv,
                            codes: &cv,
                            stride,
                        };
                        moe_down_coded(
                            &device, &down, rows, &iv, &rv, &av, ov, false, shared, given,
                        )
                        .unwrap();
                    } else {
                        moe_down(&device, &down, rows, &iv, &rv, &av, ov, false, shared).unwrap();
                    }
                    let get = |s: &CudaSlice<f32>| device.download(s).unwrap();
                    (get(&act), get(&act_shared), get(&out))
                };
                let plain = run(false);
                let case = format!("{ty:?} ff {ff}, {tokens} tokens, shared={with_shared}");
                for round in 0..2 {
                    let coded = run(true);
                    for (what, a, b) in [
                        ("gate/up", &plain.0, &coded.0),
                        ("shared gate/up", &plain.1, &coded.1),
                        ("down", &plain.2, &coded.2),
                    ] {
                        let differ = differing(a, b);
                        assert!(
                            differ.is_empty(),
                            "{case}, round {round}: {what} differs in {} of {} values, first at {}",
                            differ.len(),
                            a.len(),
                            differ[0]
                        );
                    }
                }
                assert!(
                    device.download(&tickets).unwrap().iter().all(|&t| t == 0),
                    "{case}: tickets left set"
                );
            }
        }
    }
    assert!(checked > 0, "no type took the codes");
}
