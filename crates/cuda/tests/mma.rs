//! The int8 tensor-core products (prompts) against the q8 (dp4a) kernels on the same inputs:
//! the same integer sums per sub-block, so only the f32 order of the scaled sums differs; the
//! bound is 1e-5 of the largest |value| of the token's outputs (a value near zero after
//! cancellation carries its terms' rounding, not its own). GPU tests skip without a device.

use redlite_cuda::{
    matmul_mma, matmul_with, moe_down, moe_down_mma, moe_gate_up, moe_gate_up_mma, CudaSlice,
    Device, MmaGroups, MmaTiles, PrefillKernels, MMA_TYPES,
};
use redlite_gguf::GgmlType;

mod common;
use common::{device, q8_matrix as matrix, random_matrix, Rng};

const TOKENS: [usize; 5] = [1, 7, 64, 200, 512];

/// Asserts `found` (tokens x width) is within the bound of `expected`, naming the first
/// diverging value.
fn assert_close(what: &str, expected: &[f32], found: &[f32], width: usize) {
    assert_eq!(expected.len(), found.len(), "{what}: lengths");
    for (t, (e_row, f_row)) in expected
        .chunks(width.max(1))
        .zip(found.chunks(width.max(1)))
        .enumerate()
    {
        let scale = e_row.iter().fold(0.0f32, |m, v| m.max(v.abs()));
        for (row, (&e, &f)) in e_row.iter().zip(f_row).enumerate() {
            assert!(
                (e - f).abs() <= 1e-5 * scale.max(1e-30) && f.is_finite(),
                "{what}: token {t} row {row}: dp4a {e}, mma {f} (token max |y| {scale})"
            );
        }
    }
    assert!(
        expected.iter().any(|&v| v != 0.0),
        "{what}: nothing computed"
    );
}

fn dense_case(device: &Device, ty: GgmlType, (rows, cols): (usize, usize), rng: &mut Rng) {
    let bytes = device.upload(&random_matrix(ty, rows, cols, rng)).unwrap();
    let w = matrix(&bytes, ty, (rows, cols));
    for tokens in TOKENS {
        let x: Vec<f32> = (0..tokens * cols).map(|_| rng.signed()).collect();
        let x = device.upload(&x).unwrap();
        let mut old = device.alloc_zeros::<f32>(tokens * rows).unwrap();
        let mut new = device.alloc_zeros::<f32>(tokens * rows).unwrap();
        let kernels = PrefillKernels::Dp4a;
        matmul_with(device, &w, &x.as_view(), &mut old.as_view_mut(), kernels).unwrap();
        matmul_mma(device, &w, &x.as_view(), &mut new.as_view_mut()).unwrap();
        let what = format!("{ty:?} {rows}x{cols} t{tokens}");
        let (old, new) = (
            device.download(&old).unwrap(),
            device.download(&new).unwrap(),
        );
        assert_close(&what, &old, &new, rows);
    }
}

/// Dense products for every covered type: a full tile of rows, ragged row tiles (rows not a
/// multiple of 128) and token tiles (7, 200 tokens: not a multiple of 64).
#[test]
fn mma_matmul_equals_dp4a() {
    let Some(device) = device("mma_matmul_equals_dp4a") else {
        return;
    };
    let mut rng = Rng(21);
    for ty in MMA_TYPES {
        for shape in [(128, 256), (200, 512), (37, 2048)] {
            dense_case(&device, ty, shape, &mut rng);
        }
    }
}

/// Distinct experts per token as the router picks them, skewed so some experts take several
/// tiles and some none.
fn routed_ids(tokens: usize, used: usize, n_expert: usize, rng: &mut Rng) -> Vec<i32> {
    (0..tokens)
        .flat_map(|_| {
            let mut chosen = Vec::with_capacity(used);
            while chosen.len() < used {
                let skewed = (rng.next() % n_expert as u64) * (rng.next() % 2);
                let e = skewed as i32;
                if !chosen.contains(&e) {
                    chosen.push(e);
                }
            }
            chosen
        })
        .collect()
}

/// Host and device groupings: the same values, bit for bit.
fn assert_same_bits(what: &str, host: &[f32], on_device: &[f32]) {
    let differ = host
        .iter()
        .zip(on_device)
        .position(|(a, b)| a.to_bits() != b.to_bits());
    if let Some(at) = differ {
        panic!(
            "{what}: device grouping differs at {at}: {} vs {}",
            host[at], on_device[at]
        );
    }
}

/// The router's choice for one case, uploaded, and its groupings on the host and the device.
struct Routing {
    ids: CudaSlice<i32>,
    host: MmaGroups,
    on_device: MmaGroups,
    tokens: usize,
    used: usize,
    n_expert: usize,
}

impl Routing {
    fn new(device: &Device, tokens: usize, used: usize, n_expert: usize, rng: &mut Rng) -> Self {
        let ids = routed_ids(tokens, used, n_expert, rng);
        let tiles = MmaTiles::new(&ids, used, n_expert).unwrap();
        let host = MmaGroups::upload(device, &tiles).unwrap();
        let ids = device.upload(&ids).unwrap();
        let on_device = MmaGroups::on_device(device, &ids.as_view(), used, n_expert).unwrap();
        Routing {
            ids,
            host,
            on_device,
            tokens,
            used,
            n_expert,
        }
    }
}

/// Gate/up with SwiGLU; ff = 160 leaves a ragged row tile.
fn gate_up_case(device: &Device, ty: GgmlType, r: &Routing, rng: &mut Rng) {
    let (ff, cols) = (160, 512);
    let stack = (r.n_expert * ff, cols);
    let gate = device
        .upload(&random_matrix(ty, stack.0, cols, rng))
        .unwrap();
    let up = device
        .upload(&random_matrix(ty, stack.0, cols, rng))
        .unwrap();
    let (gate, up) = (matrix(&gate, ty, stack), matrix(&up, ty, stack));
    let x: Vec<f32> = (0..r.tokens * cols).map(|_| rng.signed()).collect();
    let x = device.upload(&x).unwrap();
    let (ids, x) = (r.ids.as_view(), x.as_view());
    let len = r.tokens * r.used * ff;
    let mut outs = [0; 3].map(|_| device.alloc_zeros::<f32>(len).unwrap());
    let [old, host, on_device] = &mut outs;
    moe_gate_up(
        device,
        &gate,
        &up,
        ff,
        &ids,
        (&x, None),
        &mut old.as_view_mut(),
        None,
    )
    .unwrap();
    moe_gate_up_mma(device, &gate, &up, ff, &r.host, &x, &mut host.as_view_mut()).unwrap();
    let act = &mut on_device.as_view_mut();
    moe_gate_up_mma(device, &gate, &up, ff, &r.on_device, &x, act).unwrap();
    let [old, host, on_device] = outs.map(|o| device.download(&o).unwrap());
    let what = format!("{ty:?} gate/up t{}", r.tokens);
    assert_close(&what, &old, &host, r.used * ff);
    assert_same_bits(&what, &host, &on_device);
}

/// Down and the weighted sum, into zeros and accumulated; 200 rows leave a ragged row tile.
fn down_case(device: &Device, ty: GgmlType, r: &Routing, rng: &mut Rng) {
    let (rows, ff) = (200, 512);
    let down = device
        .upload(&random_matrix(ty, r.n_expert * rows, ff, rng))
        .unwrap();
    let down = matrix(&down, ty, (r.n_expert * rows, ff));
    let pairs = r.tokens * r.used;
    let act: Vec<f32> = (0..pairs * ff).map(|_| rng.signed()).collect();
    let weights: Vec<f32> = (0..pairs).map(|_| rng.signed().abs()).collect();
    let start: Vec<f32> = (0..r.tokens * rows).map(|_| rng.signed()).collect();
    let (act, weights) = (
        device.upload(&act).unwrap(),
        device.upload(&weights).unwrap(),
    );
    let (act, weights, ids) = (act.as_view(), weights.as_view(), r.ids.as_view());
    for accumulate in [false, true] {
        let mut outs = [0; 3].map(|_| device.upload(&start).unwrap());
        let [old, host, on_device] = &mut outs;
        let out = &mut old.as_view_mut();
        moe_down(
            device, &down, rows, &ids, &weights, &act, out, accumulate, None, true,
        )
        .unwrap();
        for (groups, out) in [(&r.host, host), (&r.on_device, on_device)] {
            let out = &mut out.as_view_mut();
            moe_down_mma(device, &down, rows, groups, &weights, &act, out, accumulate).unwrap();
        }
        let [old, host, on_device] = outs.map(|o| device.download(&o).unwrap());
        let what = format!("{ty:?} down t{} accumulate={accumulate}", r.tokens);
        assert_close(&what, &old, &host, rows);
        assert_same_bits(&what, &host, &on_device);
    }
}

/// Routed gate/up (SwiGLU) and down (+ weighted sum) against the per-pair q8 kernels, for
/// every covered type and token count, with the pairs grouped on the host; grouped on the
/// device, the same bits (a pair's sums do not depend on its tile).
#[test]
fn mma_experts_equal_dp4a() {
    let Some(device) = device("mma_experts_equal_dp4a") else {
        return;
    };
    let mut rng = Rng(22);
    let (n_expert, used) = (12, 4);
    for ty in MMA_TYPES {
        for tokens in TOKENS {
            let routing = Routing::new(&device, tokens, used, n_expert, &mut rng);
            gate_up_case(&device, ty, &routing, &mut rng);
            down_case(&device, ty, &routing, &mut rng);
        }
    }
}

/// A router's id out of range (NaN logits) joins no tile of a device grouping, and the down
/// combine skips its slot, as the q8 down kernel does.
#[test]
fn device_grouping_skips_ids_out_of_range() {
    let Some(device) = device("device_grouping_skips_ids_out_of_range") else {
        return;
    };
    let mut rng = Rng(24);
    let (tokens, used, n_expert, rows, ff, ty) = (9, 2, 4, 64, 256, GgmlType::Q4K);
    let mut ids = routed_ids(tokens, used, n_expert, &mut rng);
    ids[3] = n_expert as i32;
    let ids = device.upload(&ids).unwrap();
    let groups = MmaGroups::on_device(&device, &ids.as_view(), used, n_expert).unwrap();
    let down = device
        .upload(&random_matrix(ty, n_expert * rows, ff, &mut rng))
        .unwrap();
    let down = matrix(&down, ty, (n_expert * rows, ff));
    let act: Vec<f32> = (0..tokens * used * ff).map(|_| rng.signed()).collect();
    let weights: Vec<f32> = (0..tokens * used).map(|_| rng.signed().abs()).collect();
    let (act, weights) = (
        device.upload(&act).unwrap(),
        device.upload(&weights).unwrap(),
    );
    let (act, weights, ids) = (act.as_view(), weights.as_view(), ids.as_view());
    let mut outs = [0; 2].map(|_| device.alloc_zeros::<f32>(tokens * rows).unwrap());
    let [old, new] = &mut outs;
    moe_down(
        &device,
        &down,
        rows,
        &ids,
        &weights,
        &act,
        &mut old.as_view_mut(),
        false,
        None,
        true,
    )
    .unwrap();
    let out = &mut new.as_view_mut();
    moe_down_mma(&device, &down, rows, &groups, &weights, &act, out, false).unwrap();
    let [old, new] = outs.map(|o| device.download(&o).unwrap());
    assert_close("out-of-range id", &old, &new, rows);
}

/// The shared expert's path: every token one pair of a one-expert stack.
#[test]
fn mma_dense_tiles_equal_the_per_token_kernels() {
    let Some(device) = device("mma_dense_tiles_equal_the_per_token_kernels") else {
        return;
    };
    let mut rng = Rng(23);
    let (ff, cols, tokens) = (512, 256, 37);
    let ty = GgmlType::Q4K;
    let gate = device
        .upload(&random_matrix(ty, ff, cols, &mut rng))
        .unwrap();
    let up = device
        .upload(&random_matrix(ty, ff, cols, &mut rng))
        .unwrap();
    let (gate, up) = (matrix(&gate, ty, (ff, cols)), matrix(&up, ty, (ff, cols)));
    let x: Vec<f32> = (0..tokens * cols).map(|_| rng.signed()).collect();
    let x = device.upload(&x).unwrap();
    let zeros = device.upload(&vec![0i32; tokens]).unwrap();
    let tiles = MmaGroups::dense(&device, tokens).unwrap();
    let mut old = device.alloc_zeros::<f32>(tokens * ff).unwrap();
    let mut new = device.alloc_zeros::<f32>(tokens * ff).unwrap();
    let x = x.as_view();
    moe_gate_up(
        &device,
        &gate,
        &up,
        ff,
        &zeros.as_view(),
        (&x, None),
        &mut old.as_view_mut(),
        None,
    )
    .unwrap();
    moe_gate_up_mma(&device, &gate, &up, ff, &tiles, &x, &mut new.as_view_mut()).unwrap();
    let (old, new) = (
        device.download(&old).unwrap(),
        device.download(&new).unwrap(),
    );
    assert_close("shared gate/up", &old, &new, ff);
}
