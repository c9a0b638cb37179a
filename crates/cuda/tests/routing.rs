//! The MoE routing kernels: the routing against a host reference (ties included), the fused
//! decode router and the routing with the shared expert's gate row against the split-K
//! matmul then the routing bit for bit, and the benchmark-only skewed routing's law. GPU tests print a message and pass when no
//! driver, NVRTC or GPU is present.

use redlite_cuda::{
    matmul, moe_route, moe_route_gate, moe_route_gate_takes, moe_route_skew, router_topk,
    router_topk_takes, skew_permutation, CudaSlice, Device, Dots, RouteSkew, WeightMatrix,
};
use redlite_gguf::GgmlType;

mod common;
use common::{device, random_matrix, Rng};

/// A buffer's values as bits (for comparisons that must be exact, NaN included).
fn bits(device: &Device, buffer: &CudaSlice<f32>) -> Vec<u32> {
    let values = device.download(buffer).unwrap();
    values.into_iter().map(f32::to_bits).collect()
}

/// A routing's outputs (expert ids, weights, shared expert's weight): the same bits.
fn assert_same_routing(
    device: &Device,
    case: &str,
    want: (&CudaSlice<i32>, &CudaSlice<f32>, &CudaSlice<f32>),
    found: (&CudaSlice<i32>, &CudaSlice<f32>, &CudaSlice<f32>),
) {
    let ids = |b| device.download(b).unwrap();
    assert_eq!(ids(want.0), ids(found.0), "{case}: ids");
    assert_eq!(
        bits(device, want.1),
        bits(device, found.1),
        "{case}: weights"
    );
    assert_eq!(
        bits(device, want.2),
        bits(device, found.2),
        "{case}: shared weight"
    );
}

/// Zeroed buffers for one token's routing: expert ids, weights, the shared expert's weight.
type RoutingBuffers = (CudaSlice<i32>, CudaSlice<f32>, CudaSlice<f32>);

fn routing_buffers(device: &Device, used: usize) -> RoutingBuffers {
    (
        device.alloc_zeros::<i32>(used).unwrap(),
        device.alloc_zeros::<f32>(used).unwrap(),
        device.alloc_zeros::<f32>(1).unwrap(),
    )
}

/// The fused router of `router` (the experts' rows, then the gate row) for one token `x`:
/// its n_expert + 1 logits and its routing.
fn fused_routing(
    device: &Device,
    router: &WeightMatrix<'_>,
    x: &CudaSlice<f32>,
    (n_expert, used): (usize, usize),
    ticket: &mut CudaSlice<i32>,
) -> (CudaSlice<f32>, RoutingBuffers) {
    let mut logits = device.alloc_zeros::<f32>(n_expert + 1).unwrap();
    let (mut ids, mut w, mut shared) = routing_buffers(device, used);
    router_topk(
        device,
        router,
        &x.as_view(),
        &mut logits.as_view_mut(),
        &mut ticket.as_view_mut(),
        &mut ids.as_view_mut(),
        &mut w.as_view_mut(),
        &mut shared.as_view_mut(),
    )
    .unwrap();
    (logits, (ids, w, shared))
}

/// The fused decode router (router rows and the shared gate row reduced a CTA per row, the
/// last CTA routing) against the split-K matmul then the routing kernel, bit for bit: logits,
/// expert ids, weights and the shared expert's weight; three launches in a row, so the
/// ticket counter is seen to reset. The model's shape (512 experts, top 10) and a small one.
#[test]
fn fused_router_equals_matmul_then_routing() {
    let Some(device) = device("fused_router_equals_matmul_then_routing") else {
        return;
    };
    let mut rng = Rng(5);
    for (n_expert, cols, used) in [(512, 2048, 10), (40, 256, 3)] {
        let rows = n_expert + 1;
        let bytes = random_matrix(GgmlType::F32, rows, cols, &mut rng);
        let weights = device.upload(&bytes).unwrap();
        let router = WeightMatrix {
            ty: GgmlType::F32,
            rows,
            cols,
            bytes: weights.as_view(),
            dots: Dots::Q8K,
        };
        let mut ticket = device.alloc_zeros::<i32>(1).unwrap();
        for round in 0..3 {
            let x: Vec<f32> = (0..cols).map(|_| rng.signed()).collect();
            let x = device.upload(&x).unwrap();
            let mut logits = device.alloc_zeros::<f32>(rows).unwrap();
            matmul(&device, &router, &x.as_view(), &mut logits.as_view_mut()).unwrap();
            let (mut want_ids, mut want_w, mut want_shared) = routing_buffers(&device, used);
            moe_route(
                &device,
                &logits.slice(..n_expert),
                &logits.slice(n_expert..),
                &mut want_ids.as_view_mut(),
                &mut want_w.as_view_mut(),
                &mut want_shared.as_view_mut(),
            )
            .unwrap();
            assert!(router_topk_takes(&router), "{n_expert} experts: not taken");
            let (fused_logits, (ids, w, shared)) =
                fused_routing(&device, &router, &x, (n_expert, used), &mut ticket);
            let case = format!("{n_expert} experts x {cols}, top {used}, round {round}");
            assert_eq!(
                bits(&device, &logits),
                bits(&device, &fused_logits),
                "{case}: logits"
            );
            let want = (&want_ids, &want_w, &want_shared);
            assert_same_routing(&device, &case, want, (&ids, &w, &shared));
            assert_eq!(device.download(&ticket).unwrap(), vec![0], "{case}: ticket");
        }
    }
}

/// The routing kernel against a host reference on logits drawn from five values, so that
/// most picks break ties: the `used` largest in descending order, ties to the lower index,
/// weights the renormalized softmax (within 1e-6) and the shared weight sigmoid(logit).
#[test]
fn routing_picks_the_largest_with_ties_to_the_lower_index() {
    let Some(device) = device("routing_picks_the_largest_with_ties_to_the_lower_index") else {
        return;
    };
    let mut rng = Rng(7);
    for (n_expert, used, tokens) in [(512usize, 10usize, 8usize), (40, 3, 3)] {
        let logits: Vec<f32> = (0..tokens * n_expert)
            .map(|_| [-1.0, -0.5, 0.0, 0.5, 1.0][rng.next() as usize % 5])
            .collect();
        let shared: Vec<f32> = (0..tokens).map(|_| rng.signed()).collect();
        let (l, sl) = (
            device.upload(&logits).unwrap(),
            device.upload(&shared).unwrap(),
        );
        let mut ids = device.alloc_zeros::<i32>(tokens * used).unwrap();
        let mut w = device.alloc_zeros::<f32>(tokens * used).unwrap();
        let mut sw = device.alloc_zeros::<f32>(tokens).unwrap();
        let (lv, slv) = (l.as_view(), sl.as_view());
        let (mut iv, mut wv, mut swv) = (ids.as_view_mut(), w.as_view_mut(), sw.as_view_mut());
        moe_route(&device, &lv, &slv, &mut iv, &mut wv, &mut swv).unwrap();
        let (ids, w, sw) = (
            device.download(&ids).unwrap(),
            device.download(&w).unwrap(),
            device.download(&sw).unwrap(),
        );
        for t in 0..tokens {
            let row = &logits[t * n_expert..(t + 1) * n_expert];
            let mut order: Vec<usize> = (0..n_expert).collect();
            // Stable: equal logits keep the lower index first.
            order.sort_by(|&a, &b| row[b].total_cmp(&row[a]));
            let want: Vec<i32> = order[..used].iter().map(|&e| e as i32).collect();
            let case = format!("{n_expert} experts, top {used}, token {t}");
            assert_eq!(&ids[t * used..(t + 1) * used], &want[..], "{case}: ids");
            let top: Vec<f64> = want
                .iter()
                .map(|&e| (row[e as usize] as f64).exp())
                .collect();
            let sum: f64 = top.iter().sum();
            for (k, p) in top.iter().enumerate() {
                let found = w[t * used + k] as f64;
                assert!(
                    (found - p / sum).abs() < 1e-6,
                    "{case}: weight {k}: {found}"
                );
            }
            let sigmoid = 1.0 / (1.0 + (-(shared[t] as f64)).exp());
            assert!(
                (sw[t] as f64 - sigmoid).abs() < 1e-6,
                "{case}: shared weight"
            );
        }
    }
}

/// The routing with the shared expert's gate row in its launch against the gate's split-K
/// matmul then the routing kernel, bit for bit: expert ids, weights and the shared expert's
/// weight, for F32 and F16 gate rows and batches of 1 to 4 tokens.
#[test]
fn routing_with_the_gate_row_equals_matmul_then_routing() {
    let Some(device) = device("routing_with_the_gate_row_equals_matmul_then_routing") else {
        return;
    };
    let mut rng = Rng(6);
    for ty in [GgmlType::F16, GgmlType::F32] {
        for (n_expert, cols, used) in [(512, 2048, 10), (40, 256, 3)] {
            let bytes = random_matrix(ty, 1, cols, &mut rng);
            let gate_bytes = device.upload(&bytes).unwrap();
            let gate = WeightMatrix {
                ty,
                rows: 1,
                cols,
                bytes: gate_bytes.as_view(),
                dots: Dots::Q8K,
            };
            for tokens in 1..=4 {
                let case = format!("{ty:?} gate, {n_expert} experts x {cols}, {tokens} tokens");
                assert!(
                    moe_route_gate_takes(&gate, tokens, n_expert),
                    "{case}: not taken"
                );
                let values = |n: usize, rng: &mut Rng| (0..n).map(|_| rng.signed()).collect();
                let x: Vec<f32> = values(tokens * cols, &mut rng);
                let logits: Vec<f32> = values(tokens * n_expert, &mut rng);
                let (x, logits) = (device.upload(&x).unwrap(), device.upload(&logits).unwrap());
                let zeros_f = |n| device.alloc_zeros::<f32>(n).unwrap();
                let zeros_i = |n| device.alloc_zeros::<i32>(n).unwrap();
                let mut shared_logit = zeros_f(tokens);
                matmul(
                    &device,
                    &gate,
                    &x.as_view(),
                    &mut shared_logit.as_view_mut(),
                )
                .unwrap();
                let (mut want_ids, mut want_w, mut want_shared) = (
                    zeros_i(tokens * used),
                    zeros_f(tokens * used),
                    zeros_f(tokens),
                );
                moe_route(
                    &device,
                    &logits.as_view(),
                    &shared_logit.as_view(),
                    &mut want_ids.as_view_mut(),
                    &mut want_w.as_view_mut(),
                    &mut want_shared.as_view_mut(),
                )
                .unwrap();
                let (mut ids, mut w, mut shared) = (
                    zeros_i(tokens * used),
                    zeros_f(tokens * used),
                    zeros_f(tokens),
                );
                moe_route_gate(
                    &device,
                    &logits.as_view(),
                    &gate,
                    &x.as_view(),
                    &mut ids.as_view_mut(),
                    &mut w.as_view_mut(),
                    &mut shared.as_view_mut(),
                )
                .unwrap();
                let want = (&want_ids, &want_w, &want_shared);
                assert_same_routing(&device, &case, want, (&ids, &w, &shared));
            }
        }
    }
}

/// The benchmark-only skewed routing: `used` distinct experts in range per token, the same
/// ones for the same logits, and over 4,096 tokens of the model's shape (512 experts, top 10)
/// the layer's hottest ranks (through its permutation) take the law's share of the picks.
#[test]
fn skewed_routing_draws_distinct_experts_from_the_law() {
    let Some(device) = device("skewed_routing_draws_distinct_experts_from_the_law") else {
        return;
    };
    let mut rng = Rng(17);
    let (n_expert, used, tokens) = (512usize, 10usize, 4096usize);
    let logits: Vec<f32> = (0..tokens * n_expert).map(|_| rng.signed()).collect();
    let logits = device.upload(&logits).unwrap();
    let skew = RouteSkew::new(RouteSkew::QWEN3_DIVERSE).unwrap();
    for layer in [0, 1, 47] {
        let draw = || {
            let mut ids = device.alloc_zeros::<i32>(tokens * used).unwrap();
            let mut view = ids.as_view_mut();
            moe_route_skew(&device, skew, layer, &logits.as_view(), &mut view, n_expert).unwrap();
            device.download(&ids).unwrap()
        };
        let ids = draw();
        assert_eq!(
            ids,
            draw(),
            "layer {layer}: the same logits, the same experts"
        );
        let mut picks = vec![0usize; n_expert];
        for (t, row) in ids.chunks(used).enumerate() {
            for (k, &e) in row.iter().enumerate() {
                assert!(
                    (0..n_expert as i32).contains(&e),
                    "layer {layer} token {t}: {e}"
                );
                assert!(!row[..k].contains(&e), "layer {layer} token {t}: {e} twice");
                picks[e as usize] += 1;
            }
        }
        let (_, stride, offset) = skew_permutation(layer, n_expert);
        let expert = |rank: usize| (stride as usize * rank + offset as usize) % n_expert;
        for (hottest, tolerance) in [(51usize, 0.02), (261, 0.015)] {
            let share = (0..hottest).map(|r| picks[expert(r)]).sum::<usize>() as f64
                / (tokens * used) as f64;
            let want = skew.share_of_hottest(hottest as f64 / n_expert as f64);
            assert!(
                (share - want).abs() < tolerance,
                "layer {layer}: the hottest {hottest} ranks took {share:.3} of the picks, the law {want:.3}"
            );
        }
    }
}
