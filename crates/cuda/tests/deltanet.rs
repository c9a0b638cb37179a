//! The DeltaNet prompt kernels against the token-by-token ones on the same inputs: the
//! token-parallel conv writes the same bits (outputs and state), the chunked delta rule
//! agrees within 1e-4 (L2 of the difference over L2 of the values, per v-head, outputs and
//! final state). The fused step's rows against one-row launches, and an MTP rollback
//! replayed from the step's snapshot against the states it kept per row, bit for bit. GPU
//! tests print a message and pass when no driver, NVRTC or GPU is present.

use redlite_cuda::{
    delta_rule, deltanet_conv, deltanet_replay, deltanet_step, matmul, matmul_quantized,
    replay_row_floats, CudaSlice, DeltaNetParams, DeltaNetShape, Device, Q8Rows, Q8RowsMut,
    ReplayLayer, ReplayTable, StepRecord, StepStates, TokenWalk, DELTANET_WHOLE_GROUP,
    Q8_BLOCK_VALUES,
};
use redlite_gguf::GgmlType;

mod common;
use common::{device, q8_matrix, random_matrix, Rng};

/// Qwen3-Next's DeltaNet (16 k-heads, 32 v-heads, head dim 128) and a small shape.
fn shapes(tokens: usize) -> [DeltaNetShape; 2] {
    [
        DeltaNetShape {
            tokens,
            k_heads: 16,
            v_heads: 32,
            head_dim: 128,
        },
        DeltaNetShape {
            tokens,
            k_heads: 2,
            v_heads: 4,
            head_dim: 32,
        },
    ]
}

const TOKENS: [usize; 5] = [1, 63, 64, 130, 512];

#[test]
fn token_parallel_conv_equals_the_token_loop() {
    let Some(device) = device("token_parallel_conv_equals_the_token_loop") else {
        return;
    };
    let mut rng = Rng(21);
    for tokens in [1, 2, 3, 5, 63, 64, 130, 512] {
        for s in shapes(tokens) {
            let channels = s.channels();
            let mut values = |n: usize| (0..n).map(|_| rng.signed()).collect::<Vec<f32>>();
            let (qkv, state, w) = (
                values(tokens * channels),
                values(3 * channels),
                values(4 * channels),
            );
            let w = device.upload(&w).unwrap();
            let run = |walk: TokenWalk| {
                let mut qkv = device.upload(&qkv).unwrap();
                let mut state = device.upload(&state).unwrap();
                deltanet_conv(
                    &device,
                    &s,
                    walk,
                    &w.as_view(),
                    &mut state.as_view_mut(),
                    &mut qkv.as_view_mut(),
                )
                .unwrap();
                (
                    device.download(&qkv).unwrap(),
                    device.download(&state).unwrap(),
                )
            };
            let (loop_out, loop_state) = run(TokenWalk::Sequential);
            let (split_out, split_state) = run(TokenWalk::Chunked);
            let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
            assert!(
                bits(&loop_out) == bits(&split_out),
                "{tokens} tokens, {channels} channels: conv outputs differ"
            );
            assert!(
                bits(&loop_state) == bits(&split_state),
                "{tokens} tokens, {channels} channels: conv states differ"
            );
        }
    }
}

/// L2 of the difference over L2 of `reference`.
fn relative(reference: &[f32], found: &[f32]) -> f64 {
    let (mut diff, mut norm) = (0.0f64, 0.0f64);
    for (&r, &f) in reference.iter().zip(found) {
        diff += (f64::from(r) - f64::from(f)).powi(2);
        norm += f64::from(r).powi(2);
    }
    (diff / norm.max(1e-300)).sqrt()
}

/// Random qkv rows as `deltanet_prep` leaves them: every q and k head L2-normalized, q scaled
/// by 1 / sqrt(head_dim); v in [-1, 1).
fn prepared_qkv(s: &DeltaNetShape, rng: &mut Rng) -> Vec<f32> {
    let dk = s.head_dim;
    let mut qkv: Vec<f32> = (0..s.tokens * s.channels()).map(|_| rng.signed()).collect();
    for row in qkv.chunks_exact_mut(s.channels()) {
        for (head, x) in row[..2 * s.k_heads * dk].chunks_exact_mut(dk).enumerate() {
            let norm = x.iter().map(|v| v * v).sum::<f32>().sqrt();
            let scale = if head < s.k_heads {
                1.0 / (dk as f32).sqrt()
            } else {
                1.0
            };
            x.iter_mut().for_each(|v| *v *= scale / norm);
        }
    }
    qkv
}

/// Runs the delta rule with `walk` from `state`: (outputs, final state).
fn run_delta(
    device: &Device,
    s: &DeltaNetShape,
    walk: TokenWalk,
    (qkv, beta, g): (&[f32], &[f32], &[f32]),
    state: &[f32],
) -> (Vec<f32>, Vec<f32>) {
    let (qkv, beta, g) = (
        device.upload(qkv).unwrap(),
        device.upload(beta).unwrap(),
        device.upload(g).unwrap(),
    );
    let mut state = device.upload(state).unwrap();
    let mut out = device.alloc_zeros::<f32>(s.tokens * s.inner()).unwrap();
    delta_rule(
        device,
        s,
        walk,
        &qkv.as_view(),
        &beta.as_view(),
        &g.as_view(),
        &mut state.as_view_mut(),
        &mut out.as_view_mut(),
    )
    .unwrap();
    (
        device.download(&out).unwrap(),
        device.download(&state).unwrap(),
    )
}

#[test]
fn chunked_delta_rule_matches_the_token_loop() {
    let Some(device) = device("chunked_delta_rule_matches_the_token_loop") else {
        return;
    };
    let mut rng = Rng(22);
    for tokens in TOKENS {
        for s in shapes(tokens) {
            let (dk, nv) = (s.head_dim, s.v_heads);
            let qkv = prepared_qkv(&s, &mut rng);
            let beta: Vec<f32> = (0..tokens * nv)
                .map(|_| 0.5 + 0.49 * rng.signed())
                .collect();
            let g: Vec<f32> = (0..tokens * nv)
                .map(|_| -1.0 - 0.9999 * rng.signed())
                .collect();
            let state: Vec<f32> = (0..nv * dk * dk).map(|_| 0.5 * rng.signed()).collect();
            let inputs = (qkv.as_slice(), beta.as_slice(), g.as_slice());
            let (loop_out, loop_state) =
                run_delta(&device, &s, TokenWalk::Sequential, inputs, &state);
            let (chunk_out, chunk_state) =
                run_delta(&device, &s, TokenWalk::Chunked, inputs, &state);
            for h in 0..nv {
                let head_rows = |o: &[f32]| -> Vec<f32> {
                    o.chunks_exact(dk)
                        .skip(h)
                        .step_by(nv)
                        .flatten()
                        .copied()
                        .collect()
                };
                let out_error = relative(&head_rows(&loop_out), &head_rows(&chunk_out));
                let head_state = |v: &[f32]| v[h * dk * dk..(h + 1) * dk * dk].to_vec();
                let state_error = relative(&head_state(&loop_state), &head_state(&chunk_state));
                assert!(
                    out_error <= 1e-4 && state_error <= 1e-4,
                    "{tokens} tokens, head dim {dk}, v-head {h} of {nv}: outputs differ by \
                     {out_error:.2e}, final state by {state_error:.2e}"
                );
            }
        }
    }
}

/// The fused step over several rows, keeping the state after each row but the last, gives
/// per row the bits of one-row launches in turn (the outputs, the final state and every kept
/// state): an MTP verification's rows equal plain decoding's, and its rollback points are
/// the states plain decoding would have reached. Where a key head's value heads hold 256
/// values, the step also writes its output in Q8_K, and an output projection reading those
/// codes gives the bits of one quantizing the output itself. 2, 3 and 4 rows: pairs of rows
/// in one group, and rows one at a time; then 3 and 4 rows as one group of all the rows
/// (`REDLITE_DELTANET_WHOLE_GROUP`).
#[test]
fn fused_rows_equal_one_row_launches_with_their_states() {
    let Some(device) = device("fused_rows_equal_one_row_launches_with_their_states") else {
        return;
    };
    let mut rng = Rng(33);
    // Each batch with the step's pairs and single rows, then (3 and 4 rows) as one group.
    let cases = [false, true].into_iter().flat_map(|whole| {
        [2, 3, 4]
            .into_iter()
            .flat_map(shapes)
            .map(move |s| (whole, s))
    });
    for (whole, s) in cases {
        DELTANET_WHOLE_GROUP.set(whole);
        let (channels, inner, v_heads, dk) = (s.channels(), s.inner(), s.v_heads, s.head_dim);
        let t = s.tokens;
        let mut values =
            |n: usize, scale: f32| (0..n).map(|_| rng.signed() * scale).collect::<Vec<f32>>();
        let qkv = values(t * channels, 1.0);
        let z = values(t * inner, 1.0);
        let ba = values(t * 2 * v_heads, 1.0);
        let conv_w = device.upload(&values(4 * channels, 0.5)).unwrap();
        let a = device.upload(&values(v_heads, 1.0)).unwrap();
        let dt_bias = device.upload(&values(v_heads, 1.0)).unwrap();
        let norm_w = device.upload(&values(dk, 1.0)).unwrap();
        let conv0 = values(3 * channels, 1.0);
        let state0 = values(v_heads * dk * dk, 0.1);
        let params = DeltaNetParams {
            conv_w: &conv_w.as_view(),
            a: &a.as_view(),
            dt_bias: &dt_bias.as_view(),
            norm_w: &norm_w.as_view(),
        };
        let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
        // All rows in one launch, recording.
        let (qkv_d, z_d, ba_d) = (
            device.upload(&qkv).unwrap(),
            device.upload(&z).unwrap(),
            device.upload(&ba).unwrap(),
        );
        let mut conv = device.upload(&conv0).unwrap();
        let mut state = device.upload(&state0).unwrap();
        let mut out = device.alloc_zeros::<f32>(t * inner).unwrap();
        let mut conv_rec = device.alloc_zeros::<f32>((t - 1) * conv0.len()).unwrap();
        let mut state_rec = device.alloc_zeros::<f32>((t - 1) * state0.len()).unwrap();
        let quantized = v_heads / s.k_heads * dk == Q8_BLOCK_VALUES;
        let mut scales = device.alloc_zeros::<f32>(t * s.k_heads).unwrap();
        let mut codes = device.alloc_zeros::<i8>(t * inner).unwrap();
        let mut out_q8 = Q8RowsMut {
            scales: scales.as_view_mut(),
            codes: codes.as_view_mut(),
        };
        deltanet_step(
            &device,
            &s,
            1e-6,
            &params,
            (&qkv_d.as_view(), &z_d.as_view(), &ba_d.as_view()),
            &mut conv.as_view_mut(),
            &mut state.as_view_mut(),
            (&mut out.as_view_mut(), quantized.then_some(&mut out_q8)),
            Some(StepRecord {
                conv: conv_rec.as_view_mut(),
                recurrent: StepStates::Rows(state_rec.as_view_mut()),
            }),
        )
        .unwrap();
        let (all_out, all_state, all_conv) = (
            device.download(&out).unwrap(),
            device.download(&state).unwrap(),
            device.download(&conv).unwrap(),
        );
        let (conv_kept, state_kept) = (
            device.download(&conv_rec).unwrap(),
            device.download(&state_rec).unwrap(),
        );
        if quantized {
            let ty = GgmlType::IQ2XXS;
            let w = device
                .upload(&random_matrix(ty, 256, inner, &mut rng))
                .unwrap();
            let w = q8_matrix(&w, ty, (256, inner));
            let mut plain = device.alloc_zeros::<f32>(t * 256).unwrap();
            matmul(&device, &w, &out.as_view(), &mut plain.as_view_mut()).unwrap();
            let q8 = Q8Rows {
                scales: scales.as_view(),
                codes: codes.as_view(),
            };
            let mut read = device.alloc_zeros::<f32>(t * 256).unwrap();
            let x = (&out.as_view(), Some(&q8));
            matmul_quantized(&device, &w, x, &mut read.as_view_mut()).unwrap();
            let (plain, read) = (
                device.download(&plain).unwrap(),
                device.download(&read).unwrap(),
            );
            assert!(
                plain.iter().any(|&v| v != 0.0),
                "output projection: nothing computed"
            );
            assert!(
                bits(&plain) == bits(&read),
                "{v_heads} v-heads of {dk}: the projection of the step's Q8_K output differs"
            );
        }
        // One row per launch.
        let one = DeltaNetShape { tokens: 1, ..s };
        let mut conv = device.upload(&conv0).unwrap();
        let mut state = device.upload(&state0).unwrap();
        for r in 0..t {
            let row = |v: &[f32], w: usize| device.upload(&v[r * w..(r + 1) * w]).unwrap();
            let (q, zr, br) = (row(&qkv, channels), row(&z, inner), row(&ba, 2 * v_heads));
            let mut o = device.alloc_zeros::<f32>(inner).unwrap();
            deltanet_step(
                &device,
                &one,
                1e-6,
                &params,
                (&q.as_view(), &zr.as_view(), &br.as_view()),
                &mut conv.as_view_mut(),
                &mut state.as_view_mut(),
                (&mut o.as_view_mut(), None),
                None,
            )
            .unwrap();
            let what = format!("{v_heads} v-heads of {dk}, row {r} of {t} (whole group: {whole})");
            let o = device.download(&o).unwrap();
            assert!(
                bits(&o) == bits(&all_out[r * inner..(r + 1) * inner]),
                "{what}: outputs differ"
            );
            let (c, st) = (
                device.download(&conv).unwrap(),
                device.download(&state).unwrap(),
            );
            if r + 1 < t {
                let (cl, sl) = (conv0.len(), state0.len());
                assert!(
                    bits(&c) == bits(&conv_kept[r * cl..(r + 1) * cl]),
                    "{what}: kept conv state differs"
                );
                assert!(
                    bits(&st) == bits(&state_kept[r * sl..(r + 1) * sl]),
                    "{what}: kept recurrent state differs"
                );
            } else {
                assert!(bits(&st) == bits(&all_state), "{what}: final states differ");
                assert!(
                    bits(&c) == bits(&all_conv),
                    "{what}: final conv states differ"
                );
            }
        }
    }
    // Back to the default for the tests after this one in the process.
    DELTANET_WHOLE_GROUP.set(false);
}

/// One layer's verification of `s.tokens` rows on random inputs, run twice from the same
/// state: keeping the state after each row (`Rows`) and keeping the snapshot and the rows'
/// inputs (`Replay`).
struct TwoWays {
    /// Rows kept as states: conv `[rows - 1][..]` and recurrent `[rows - 1][..]`.
    conv_rows: Vec<f32>,
    state_rows: Vec<f32>,
    /// The replay run's buffers, for `deltanet_replay`.
    snapshot: CudaSlice<f32>,
    inputs: CudaSlice<f32>,
    conv_rec: CudaSlice<f32>,
}

fn verify_two_ways(device: &Device, s: &DeltaNetShape, rng: &mut Rng) -> TwoWays {
    let (channels, inner, v_heads, dk, t) =
        (s.channels(), s.inner(), s.v_heads, s.head_dim, s.tokens);
    let mut values =
        |n: usize, scale: f32| (0..n).map(|_| rng.signed() * scale).collect::<Vec<f32>>();
    let (qkv, z, ba) = (
        values(t * channels, 1.0),
        values(t * inner, 1.0),
        values(t * 2 * v_heads, 1.0),
    );
    let conv_w = device.upload(&values(4 * channels, 0.5)).unwrap();
    let a = device.upload(&values(v_heads, 1.0)).unwrap();
    let dt_bias = device.upload(&values(v_heads, 1.0)).unwrap();
    let norm_w = device.upload(&values(dk, 1.0)).unwrap();
    let (conv0, state0) = (values(3 * channels, 1.0), values(v_heads * dk * dk, 0.1));
    let params = DeltaNetParams {
        conv_w: &conv_w.as_view(),
        a: &a.as_view(),
        dt_bias: &dt_bias.as_view(),
        norm_w: &norm_w.as_view(),
    };
    let inputs = [&qkv, &z, &ba].map(|v| device.upload(v).unwrap());
    let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
    let run = |recurrent: StepStates<'_>, conv_rec: &mut CudaSlice<f32>| {
        let mut conv = device.upload(&conv0).unwrap();
        let mut state = device.upload(&state0).unwrap();
        let mut out = device.alloc_zeros::<f32>(t * inner).unwrap();
        deltanet_step(
            device,
            s,
            1e-6,
            &params,
            (
                &inputs[0].as_view(),
                &inputs[1].as_view(),
                &inputs[2].as_view(),
            ),
            &mut conv.as_view_mut(),
            &mut state.as_view_mut(),
            (&mut out.as_view_mut(), None),
            Some(StepRecord {
                conv: conv_rec.as_view_mut(),
                recurrent,
            }),
        )
        .unwrap();
        [out, state, conv].map(|b| device.download(&b).unwrap())
    };
    let mut state_rec = device.alloc_zeros::<f32>((t - 1) * state0.len()).unwrap();
    let mut conv_rows = device.alloc_zeros::<f32>((t - 1) * conv0.len()).unwrap();
    let by_rows = run(StepStates::Rows(state_rec.as_view_mut()), &mut conv_rows);
    let mut snapshot = device.alloc_zeros::<f32>(state0.len()).unwrap();
    let mut kept_inputs = device
        .alloc_zeros::<f32>((t - 1) * replay_row_floats(s))
        .unwrap();
    let mut conv_rec = device.alloc_zeros::<f32>((t - 1) * conv0.len()).unwrap();
    let replaying = StepStates::Replay {
        snapshot: snapshot.as_view_mut(),
        inputs: kept_inputs.as_view_mut(),
    };
    let by_replay = run(replaying, &mut conv_rec);
    let what = format!("{v_heads} v-heads of {dk}, {t} rows");
    for (part, (a, b)) in ["outputs", "final state", "final conv"]
        .iter()
        .zip(by_rows.iter().zip(&by_replay))
    {
        assert!(
            bits(a) == bits(b),
            "{what}: {part} differ between the two ways of keeping"
        );
    }
    assert!(
        bits(&device.download(&snapshot).unwrap()) == bits(&state0),
        "{what}: snapshot is not the state before"
    );
    TwoWays {
        conv_rows: device.download(&conv_rows).unwrap(),
        state_rows: device.download(&state_rec).unwrap(),
        snapshot,
        inputs: kept_inputs,
        conv_rec,
    }
}

/// The replayed rollback: one launch over two layers puts each back to the state after any
/// row of its verification with the bits the verification had there (its per-row states,
/// checked against one-row launches by the test above), conv window included.
#[test]
fn replayed_rollback_equals_the_kept_rows() {
    let Some(device) = device("replayed_rollback_equals_the_kept_rows") else {
        return;
    };
    let mut rng = Rng(71);
    for s in [2, 3, 4].into_iter().flat_map(shapes) {
        let layers: Vec<TwoWays> = (0..2)
            .map(|_| verify_two_ways(&device, &s, &mut rng))
            .collect();
        let (state_len, conv_len) = (s.v_heads * s.head_dim * s.head_dim, 3 * s.channels());
        let mut table = ReplayTable::default();
        for kept in 1..s.tokens {
            let mut states: Vec<CudaSlice<f32>> = (0..2)
                .map(|_| device.alloc_zeros(state_len).unwrap())
                .collect();
            let mut convs: Vec<CudaSlice<f32>> = (0..2)
                .map(|_| device.alloc_zeros(conv_len).unwrap())
                .collect();
            let mut replay: Vec<ReplayLayer<'_>> = layers
                .iter()
                .zip(states.iter_mut().zip(convs.iter_mut()))
                .map(|(l, (state, conv))| ReplayLayer {
                    snapshot: l.snapshot.as_view(),
                    inputs: l.inputs.as_view(),
                    conv_record: l.conv_rec.as_view(),
                    state: state.as_view_mut(),
                    conv: conv.as_view_mut(),
                })
                .collect();
            deltanet_replay(&device, &s, kept, &mut replay, &mut table).unwrap();
            drop(replay);
            let row = kept - 1;
            for (i, l) in layers.iter().enumerate() {
                let what = format!(
                    "{} v-heads of {}, layer {i}, {kept} of {} rows kept",
                    s.v_heads, s.head_dim, s.tokens
                );
                let state = device.download(&states[i]).unwrap();
                let conv = device.download(&convs[i]).unwrap();
                let expected = &l.state_rows[row * state_len..(row + 1) * state_len];
                let differ = state
                    .iter()
                    .zip(expected)
                    .filter(|(a, b)| a.to_bits() != b.to_bits())
                    .count();
                assert!(
                    differ == 0,
                    "{what}: {differ} of {state_len} state values differ"
                );
                assert!(
                    conv.iter()
                        .zip(&l.conv_rows[row * conv_len..(row + 1) * conv_len])
                        .all(|(a, b)| a.to_bits() == b.to_bits()),
                    "{what}: conv window differs"
                );
            }
        }
    }
}
