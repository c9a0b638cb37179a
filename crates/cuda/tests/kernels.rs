//! Kernel tests against the CPU reference (`redlite_quant::dequantize_row` and an f64 dot).
//! GPU tests print a message and pass when no driver, NVRTC or GPU is present; the
//! NVRTC compile check is `--ignored` (it needs libnvrtc, see scripts/ci/nvrtc-check.sh).

use redlite_cuda::{
    compile_all, dequantize, matmul, matmul_cublas, matvec, moe_gate_up, moe_gate_up_grouped,
    CudaError, CudaSlice, Device, Dots, ExpertTiles, WeightMatrix, GROUP_TILE, Q8_DOT_TYPES,
    WEIGHT_KINDS,
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
