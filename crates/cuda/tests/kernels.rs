//! Kernel tests against the CPU reference (`redlite_quant::dequantize_row` and an f64 dot).
//! GPU tests print a message and pass when no driver, NVRTC or GPU is present; the
//! NVRTC compile check is `--ignored` (it needs libnvrtc, see scripts/ci/nvrtc-check.sh).

use redlite_cuda::{
    compile_all, dequantize, matmul, matmul_cublas, matvec, moe_gate_up, moe_gate_up_grouped,
    moe_route, moe_route_gate, moe_route_gate_takes, moe_route_skew, router_topk, skew_permutation,
    CudaError, CudaSlice, Device, Dots, ExpertTiles, RouteSkew, WeightMatrix, GROUP_TILE,
    Q8_DOT_TYPES, WEIGHT_KINDS,
};
use redlite_gguf::GgmlType;
use redlite_quant::dot_row;

mod common;
use common::{device, q8_matrix as matrix, random_matrix, reference_rows, Rng};

/// (rows, cols) swept for each type: odd row counts, one block, and a row wider than the
/// shared-memory x limit (12,288 floats) so both matvec specializations run.
fn shapes(ty: GgmlType) -> Vec<(usize, usize)> {
    let mut shapes = vec![(1, 256), (7, 768), (65, 2048), (33, 12_544)];
    if ty.block_values() == 1 {
        shapes.extend([(3, 1), (5, 7), (9, 1001)]);
    }
    shapes
}

/// Σ w·x in f64 and Σ |w·x| (the scale of the error bounds).
fn f64_dot(w: &[f32], x: &[f32]) -> (f64, f64) {
    w.iter().zip(x).fold((0.0, 0.0), |(dot, norm), (&a, &b)| {
        let term = f64::from(a) * f64::from(b);
        (dot + term, norm + term.abs())
    })
}

/// A random `ty` matrix of rows x cols and `tokens` random activation rows: the bytes, their
/// dequantized rows and x on the host, the bytes and x on the device, a zeroed output.
struct Product {
    bytes: Vec<u8>,
    w: Vec<f32>,
    x: Vec<f32>,
    weights: CudaSlice<u8>,
    x_device: CudaSlice<f32>,
    y: CudaSlice<f32>,
}

impl Product {
    fn new(
        device: &Device,
        ty: GgmlType,
        (rows, cols, tokens): (usize, usize, usize),
        rng: &mut Rng,
    ) -> Product {
        let bytes = random_matrix(ty, rows, cols, rng);
        let w = reference_rows(ty, &bytes, rows, cols);
        let x: Vec<f32> = (0..tokens * cols).map(|_| rng.signed()).collect();
        Product {
            weights: device.upload(&bytes).unwrap(),
            x_device: device.upload(&x).unwrap(),
            y: device.alloc_zeros::<f32>(tokens * rows).unwrap(),
            bytes,
            w,
            x,
        }
    }

    /// The device matrix (a borrow of `weights` only, so `y` stays free to write).
    fn matrix(
        weights: &CudaSlice<u8>,
        ty: GgmlType,
        (rows, cols): (usize, usize),
        dots: Dots,
    ) -> WeightMatrix<'_> {
        WeightMatrix {
            ty,
            rows,
            cols,
            bytes: weights.as_view(),
            dots,
        }
    }

    /// Asserts every output within `bound` x Σ|w·x| of `expected(t, row, f64 dot)`.
    fn check(
        &self,
        device: &Device,
        rows: usize,
        case: &str,
        expected: impl Fn(usize, usize, f64) -> (f64, f64),
    ) {
        let cols = self.w.len() / rows;
        for (i, &f) in device.download(&self.y).unwrap().iter().enumerate() {
            let (t, row) = (i / rows, i % rows);
            let xt = &self.x[t * cols..(t + 1) * cols];
            let (dot, norm) = f64_dot(&self.w[row * cols..(row + 1) * cols], xt);
            let (expected, bound) = expected(t, row, dot);
            let error = (f64::from(f) - expected).abs();
            assert!(
                error <= bound * norm.max(1e-30),
                "{case} token {t} row {row}: CPU {expected}, GPU {f} (|terms| {norm})"
            );
        }
    }
}

#[test]
fn open_fails_cleanly_without_gpu_or_opens() {
    match Device::open(0) {
        Ok(device) => eprintln!("opened {:?} ({})", device.name(), device.arch()),
        Err(CudaError::NoDriver | CudaError::NoNvrtc | CudaError::NoDevice { .. }) => {}
        Err(error) => panic!("unexpected error: {error}"),
    }
}

#[test]
fn dequantize_matches_cpu_reference() {
    let Some(device) = device("dequantize_matches_cpu_reference") else {
        return;
    };
    let mut rng = Rng(1);
    for kind in WEIGHT_KINDS {
        for (rows, cols) in shapes(kind.ty) {
            let bytes = random_matrix(kind.ty, rows, cols, &mut rng);
            let expected = reference_rows(kind.ty, &bytes, rows, cols);
            let weights = device.upload(&bytes).unwrap();
            let mut out = device.alloc_zeros::<f32>(rows * cols).unwrap();
            let matrix = WeightMatrix {
                ty: kind.ty,
                rows,
                cols,
                bytes: weights.as_view(),
                dots: Dots::F32,
            };
            dequantize(&device, &matrix, &mut out.as_view_mut()).unwrap();
            let found = device.download(&out).unwrap();
            let scale = expected.iter().fold(1e-30f32, |m, v| m.max(v.abs()));
            for (i, (&e, &f)) in expected.iter().zip(&found).enumerate() {
                assert!(
                    (e - f).abs() <= 1e-6 * scale,
                    "{:?} {rows}x{cols} value {i}: expected {e}, found {f}",
                    kind.ty
                );
            }
        }
    }
}

#[test]
fn matvec_matches_cpu_reference() {
    let Some(device) = device("matvec_matches_cpu_reference") else {
        return;
    };
    let mut rng = Rng(2);
    for kind in WEIGHT_KINDS {
        for (rows, cols) in shapes(kind.ty) {
            let bytes = random_matrix(kind.ty, rows, cols, &mut rng);
            let w = reference_rows(kind.ty, &bytes, rows, cols);
            let x: Vec<f32> = (0..cols).map(|_| rng.signed()).collect();
            let weights = device.upload(&bytes).unwrap();
            let x_device = device.upload(&x).unwrap();
            let mut y = device.alloc_zeros::<f32>(rows).unwrap();
            let matrix = WeightMatrix {
                ty: kind.ty,
                rows,
                cols,
                bytes: weights.as_view(),
                dots: Dots::F32,
            };
            matvec(&device, &matrix, &x_device.as_view(), &mut y.as_view_mut()).unwrap();
            let found = device.download(&y).unwrap();
            for (row, &f) in found.iter().enumerate() {
                let terms = w[row * cols..(row + 1) * cols].iter().zip(&x);
                let (dot, norm) = terms.fold((0.0f64, 0.0f64), |(dot, norm), (&a, &b)| {
                    let term = f64::from(a) * f64::from(b);
                    (dot + term, norm + term.abs())
                });
                let error = (f64::from(f) - dot).abs();
                assert!(
                    error <= 1e-4 * norm.max(1e-30),
                    "{:?} {rows}x{cols} row {row}: expected {dot}, found {f} (|terms| {norm})",
                    kind.ty
                );
            }
        }
    }
}

/// The layer matmul in both activation formats, for shapes that take the split-K kernel
/// (at most 1,024 rows) and shapes that take version 2 / q8 (more rows), 1 to 3 tokens.
/// `Dots::F32` against an f64 dot of the dequantized weights (1e-4 of the terms' magnitude);
/// `Dots::Q8K` (its types) against the CPU's reference dot on Q8_K activations (`dot_row`,
/// ggml's integer block sums): the activation codes are the same bits and the block sums the
/// same integers, so only the float order of the scaled block sums differs (1e-5).
/// The multi-token q8 cases take the token-tiled kernel (11 tokens: a full tile and a partial
/// one); with `REDLITE_PREFILL_TILES=0` in the environment, the one-token kernels per token.
/// F32 and F16 weights with 16+ tokens take the float GEMM (`REDLITE_PREFILL_GEMM=0`: the
/// matvecs); its single-chain sums stay within the same 1e-4 of the f64 dot.
#[test]
fn matmul_matches_cpu_in_both_precisions() {
    let Some(device) = device("matmul_matches_cpu_in_both_precisions") else {
        return;
    };
    let mut rng = Rng(3);
    let shapes = [
        (1, 256, 1),
        (37, 768, 3),
        (131, 2048, 1),
        (9, 12_288, 2),
        (1500, 512, 2),
        (1100, 1024, 11),
    ];
    for kind in WEIGHT_KINDS {
        for dots in [Dots::F32, Dots::Q8K] {
            if dots == Dots::Q8K && !Q8_DOT_TYPES.contains(&kind.ty) {
                continue;
            }
            // Float weights with 16+ tokens and 64+ rows take the tiled GEMM: 32-token tiles
            // (few CTAs), 64-token tiles (1100 x 1000), partial row, token and column tiles;
            // cols % 4 != 0 and fewer rows take the matvecs instead.
            let float_gemm = [
                (515, 2048, 70),
                (100, 1000, 17),
                (1100, 256, 1000),
                (33, 1000, 17),
                (5, 1001, 20),
            ];
            let extra = if kind.ty.block_values() == 1 {
                &float_gemm[..]
            } else {
                &[]
            };
            for &(rows, cols, tokens) in shapes.iter().chain(extra) {
                let ty = kind.ty;
                let mut p = Product::new(&device, ty, (rows, cols, tokens), &mut rng);
                let matrix = Product::matrix(&p.weights, ty, (rows, cols), dots);
                matmul(
                    &device,
                    &matrix,
                    &p.x_device.as_view(),
                    &mut p.y.as_view_mut(),
                )
                .unwrap();
                let row_bytes = p.bytes.len() / rows;
                let case = format!("{ty:?} {dots:?} {rows}x{cols}");
                p.check(&device, rows, &case, |t, row, dot| match dots {
                    Dots::F32 => (dot, 1e-4),
                    Dots::Q8K => {
                        let w_row = &p.bytes[row * row_bytes..(row + 1) * row_bytes];
                        let xt = &p.x[t * cols..(t + 1) * cols];
                        (f64::from(dot_row(ty, w_row, xt).unwrap()), 1e-5)
                    }
                });
            }
        }
    }
}

/// The cuBLAS prompt products against an f64 dot of the dequantized weights and the f32
/// inputs. Q8_K precision (weights dequantized to f16, x converted to f16, f32
/// accumulation): each term carries at most the two f16 roundings (2^-11 relative each), so
/// the error stays within 2e-3 of the sum of term magnitudes. Exact precision (f32 weights
/// and x): f32 summation only, within 1e-5. Skips where libcublas is missing.
#[test]
fn cublas_prompt_products_match_the_cpu() {
    let Some(device) = device("cublas_prompt_products_match_the_cpu") else {
        return;
    };
    let mut rng = Rng(11);
    // f16 weights and activations (Q8_K precision): ~2^-11 relative per term; f32 (the exact
    // precision): summation order only.
    for (dots, bound) in [(Dots::Q8K, 2e-3), (Dots::F32, 1e-5)] {
        for ty in [
            GgmlType::IQ2XXS,
            GgmlType::Q4K,
            GgmlType::Q6K,
            GgmlType::IQ1M,
        ] {
            for (rows, cols, tokens) in [(300, 2048, 70), (64, 512, 16)] {
                let mut p = Product::new(&device, ty, (rows, cols, tokens), &mut rng);
                let matrix = Product::matrix(&p.weights, ty, (rows, cols), dots);
                match matmul_cublas(
                    &device,
                    &matrix,
                    &p.x_device.as_view(),
                    &mut p.y.as_view_mut(),
                ) {
                    Err(CudaError::Blas {
                        call: "cublasCreate",
                        message,
                    }) => {
                        eprintln!("cublas_prompt_products_match_the_cpu: skipped ({message})");
                        return;
                    }
                    other => other.unwrap(),
                }
                let case = format!("{ty:?} {dots:?} cuBLAS {rows}x{cols}");
                p.check(&device, rows, &case, |_, _, dot| (dot, bound));
            }
        }
    }
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
            let mut want_ids = device.alloc_zeros::<i32>(used).unwrap();
            let mut want_w = device.alloc_zeros::<f32>(used).unwrap();
            let mut want_shared = device.alloc_zeros::<f32>(1).unwrap();
            moe_route(
                &device,
                &logits.slice(..n_expert),
                &logits.slice(n_expert..),
                &mut want_ids.as_view_mut(),
                &mut want_w.as_view_mut(),
                &mut want_shared.as_view_mut(),
            )
            .unwrap();
            let mut fused_logits = device.alloc_zeros::<f32>(rows).unwrap();
            let mut ids = device.alloc_zeros::<i32>(used).unwrap();
            let mut w = device.alloc_zeros::<f32>(used).unwrap();
            let mut shared = device.alloc_zeros::<f32>(1).unwrap();
            router_topk(
                &device,
                &router,
                &x.as_view(),
                &mut fused_logits.as_view_mut(),
                &mut ticket.as_view_mut(),
                &mut ids.as_view_mut(),
                &mut w.as_view_mut(),
                &mut shared.as_view_mut(),
            )
            .unwrap();
            let case = format!("{n_expert} experts x {cols}, top {used}, round {round}");
            let bits = |v: Vec<f32>| v.into_iter().map(f32::to_bits).collect::<Vec<_>>();
            let get = |b: &redlite_cuda::CudaSlice<f32>| bits(device.download(b).unwrap());
            assert_eq!(get(&logits), get(&fused_logits), "{case}: logits");
            assert_eq!(
                device.download(&want_ids).unwrap(),
                device.download(&ids).unwrap(),
                "{case}: ids"
            );
            assert_eq!(get(&want_w), get(&w), "{case}: weights");
            assert_eq!(get(&want_shared), get(&shared), "{case}: shared weight");
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
                let bits = |v: Vec<f32>| v.into_iter().map(f32::to_bits).collect::<Vec<_>>();
                let get = |b: &redlite_cuda::CudaSlice<f32>| bits(device.download(b).unwrap());
                assert_eq!(
                    device.download(&want_ids).unwrap(),
                    device.download(&ids).unwrap(),
                    "{case}: ids"
                );
                assert_eq!(get(&want_w), get(&w), "{case}: weights");
                assert_eq!(get(&want_shared), get(&shared), "{case}: shared weight");
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

/// The grouped gate/up (prompts) against the per-pair launch, with and without the shared
/// expert, bit for bit: the same terms in the same order per (pair, row). 17 tokens x 3 slots
/// over 5 experts: every expert takes more than one tile of pairs.
#[test]
fn grouped_gate_up_equals_the_per_pair_launch() {
    let Some(device) = device("grouped_gate_up_equals_the_per_pair_launch") else {
        return;
    };
    let mut rng = Rng(11);
    let (n_expert, ff, cols, tokens, used) = (5, 96, 512, 17, 3);
    assert!(tokens * used > n_expert * GROUP_TILE);
    for kind in WEIGHT_KINDS.iter().filter(|k| Q8_DOT_TYPES.contains(&k.ty)) {
        let ty = kind.ty;
        let upload = |bytes: &[u8]| device.upload(bytes).unwrap();
        let (gate, up) = (
            upload(&random_matrix(ty, n_expert * ff, cols, &mut rng)),
            upload(&random_matrix(ty, n_expert * ff, cols, &mut rng)),
        );
        let (s_gate, s_up) = (
            upload(&random_matrix(ty, ff, cols, &mut rng)),
            upload(&random_matrix(ty, ff, cols, &mut rng)),
        );
        let stack = (n_expert * ff, cols);
        let (gate, up) = (matrix(&gate, ty, stack), matrix(&up, ty, stack));
        let (s_gate, s_up) = (
            matrix(&s_gate, ty, (ff, cols)),
            matrix(&s_up, ty, (ff, cols)),
        );
        // Distinct experts per token, as the router picks them.
        let ids: Vec<i32> = (0..tokens)
            .flat_map(|t| (0..used).map(move |k| ((t + 2 * k) % n_expert) as i32))
            .collect();
        let x: Vec<f32> = (0..tokens * cols).map(|_| rng.signed()).collect();
        let (ids_device, x_device) = (device.upload(&ids).unwrap(), device.upload(&x).unwrap());
        for with_shared in [false, true] {
            let run = |grouped: bool| {
                let mut act = device.alloc_zeros::<f32>(tokens * used * ff).unwrap();
                let mut act_shared = device.alloc_zeros::<f32>(tokens * ff).unwrap();
                let mut act_shared_view = act_shared.as_view_mut();
                let shared = with_shared.then_some((&s_gate, &s_up, &mut act_shared_view));
                if grouped {
                    let tiles = ExpertTiles::new(&ids, used, n_expert, with_shared).unwrap();
                    moe_gate_up_grouped(
                        &device,
                        &gate,
                        &up,
                        ff,
                        &tiles,
                        &x_device.as_view(),
                        &mut act.as_view_mut(),
                        shared,
                    )
                    .unwrap();
                } else {
                    moe_gate_up(
                        &device,
                        &gate,
                        &up,
                        ff,
                        &ids_device.as_view(),
                        (&x_device.as_view(), None),
                        &mut act.as_view_mut(),
                        shared,
                    )
                    .unwrap();
                }
                (
                    device.download(&act).unwrap(),
                    device.download(&act_shared).unwrap(),
                )
            };
            let (plain, grouped) = (run(false), run(true));
            for (name, a, b) in [
                ("routed", &plain.0, &grouped.0),
                ("shared", &plain.1, &grouped.1),
            ] {
                let differ = a
                    .iter()
                    .zip(b)
                    .filter(|(x, y)| x.to_bits() != y.to_bits())
                    .count();
                assert_eq!(
                    differ,
                    0,
                    "{ty:?} shared={with_shared}: {name} act differs in {differ} of {} values",
                    a.len()
                );
            }
            assert!(
                plain.0.iter().any(|&v| v != 0.0),
                "{ty:?}: nothing computed"
            );
        }
    }
}

#[test]
#[ignore = "needs libnvrtc on the loader path (scripts/ci/nvrtc-check.sh); no GPU needed"]
fn every_kernel_compiles_for_sm80_and_sm90() {
    let mut failures = Vec::new();
    for arch in ["sm_80", "sm_90"] {
        for module in compile_all(arch).unwrap() {
            if let Err(log) = module.result {
                failures.push(format!("{arch} {}:\n{log}", module.name));
            }
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}
