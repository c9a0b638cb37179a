//! The flash prefill attention kernel against the per-token kernels (the decode path) on
//! random queries, gates and caches: Qwen3-Next's 16 query heads over 2 KV heads of 256
//! dims, f32 and f16 caches, prompts from the cache's start and a later chunk (splits of the
//! KV length merged by the combine kernel). Prints a message and passes without a GPU.
//!
//! On a GPU: `cargo test --release -p redlite-cuda --test attention -- --nocapture`.

use half::f16;
use redlite_cuda::{
    attention_on, attention_partials_len, AttentionKernels, AttentionShape, CudaSlice, Device,
    KvElement, Position, COMBINE_AHEAD,
};

mod common;
use common::{device, Rng};

const HEADS: usize = 16;
const KV_HEADS: usize = 2;
const HEAD_DIM: usize = 256;
/// Relative L2 error allowed per (token, head) row: both paths sum in f32, in other orders.
const TOLERANCE: f64 = 1e-5;

/// Partial-sum splits the scratch holds (both paths use at most this many).
const SPLITS: usize = 4;

struct Case {
    tokens: usize,
    pos0: usize,
}

/// Runs one path over the uploaded inputs with partials for `splits` splits; returns o
/// (tokens x heads x hd).
fn run<T: KvElement>(
    device: &Device,
    (kernels, splits): (AttentionKernels, usize),
    shape: &AttentionShape,
    (q, qg): (&CudaSlice<f32>, &CudaSlice<f32>),
    (k_cache, v_cache): (&CudaSlice<T>, &CudaSlice<T>),
) -> Vec<f32> {
    let rows = shape.tokens * shape.heads;
    let mut partials = device
        .alloc_zeros::<f32>(rows * splits * (shape.head_dim + 2))
        .unwrap();
    let mut o = device
        .upload(&vec![f32::NAN; rows * shape.head_dim])
        .unwrap();
    attention_on(
        device,
        Some(kernels),
        shape,
        &q.as_view(),
        &qg.as_view(),
        &k_cache.as_view(),
        &v_cache.as_view(),
        &mut partials.as_view_mut(),
        &mut o.as_view_mut(),
        Position::Host,
    )
    .unwrap_or_else(|error| panic!("{kernels:?} T {}: {error}", shape.tokens));
    device.download(&o).unwrap()
}

/// A case's shape and its random queries, gates and caches (encoded by `to_kv`), uploaded.
#[allow(clippy::type_complexity)]
fn upload_case<T: KvElement>(
    device: &Device,
    case: &Case,
    seed: u64,
    to_kv: fn(f32) -> T,
) -> (AttentionShape, [CudaSlice<f32>; 2], [CudaSlice<T>; 2]) {
    let mut rng = Rng(seed);
    let capacity = case.pos0 + case.tokens;
    let shape = AttentionShape {
        tokens: case.tokens,
        pos0: case.pos0,
        heads: HEADS,
        kv_heads: KV_HEADS,
        head_dim: HEAD_DIM,
        rope_dim: 64,
        rope_base: 1e7,
        eps: 1e-6,
        capacity,
    };
    let mut random =
        |n: usize, range: f32| -> Vec<f32> { (0..n).map(|_| range * rng.signed()).collect() };
    let q = random(case.tokens * HEADS * HEAD_DIM, 2.0);
    let qg = random(case.tokens * HEADS * 2 * HEAD_DIM, 3.0);
    let cache_len = capacity * KV_HEADS * HEAD_DIM;
    let k: Vec<T> = random(cache_len, 1.0).into_iter().map(to_kv).collect();
    let v: Vec<T> = random(cache_len, 1.0).into_iter().map(to_kv).collect();
    let upload = |x: &[f32]| device.upload(x).unwrap();
    let caches = [device.upload(&k).unwrap(), device.upload(&v).unwrap()];
    (shape, [upload(&q), upload(&qg)], caches)
}

/// ‖got − want‖ / ‖want‖ of one (token, head) row.
fn relative_l2(want: &[f32], got: &[f32]) -> f64 {
    let (mut err, mut norm) = (0.0f64, 0.0f64);
    for (&w, &g) in want.iter().zip(got) {
        err += (f64::from(g) - f64::from(w)).powi(2);
        norm += f64::from(w).powi(2);
    }
    (err / norm).sqrt()
}

/// Flash prefill against per-token for one case and cache type; `to_kv` encodes the caches.
fn compare<T: KvElement>(device: &Device, case: &Case, kv_name: &str, to_kv: fn(f32) -> T) {
    let seed = case.tokens as u64 * 1_000 + case.pos0 as u64;
    let (shape, [q, qg], [k, v]) = upload_case(device, case, seed, to_kv);
    let (inputs, caches) = ((&q, &qg), (&k, &v));
    let per_token = run(
        device,
        (AttentionKernels::PerToken, SPLITS),
        &shape,
        inputs,
        caches,
    );
    let flash = run(
        device,
        (AttentionKernels::FlashPrefill, SPLITS),
        &shape,
        inputs,
        caches,
    );
    let mut worst = 0.0f64;
    for (row, (want, got)) in per_token
        .chunks_exact(HEAD_DIM)
        .zip(flash.chunks_exact(HEAD_DIM))
        .enumerate()
    {
        let (token, head) = (row / HEADS, row % HEADS);
        let rel = relative_l2(want, got);
        assert!(
            rel <= TOLERANCE,
            "{kv_name} T {} pos0 {}: token {token} head {head} differs by {rel:e} (relative L2)",
            case.tokens,
            case.pos0
        );
        worst = worst.max(rel);
    }
    eprintln!(
        "{kv_name} T {} pos0 {}: largest relative L2 difference {worst:.3e}",
        case.tokens, case.pos0
    );
}

#[test]
fn flash_prefill_matches_the_per_token_kernels() {
    let Some(device) = device("flash_prefill_matches_the_per_token_kernels") else {
        return;
    };
    let cases = [
        Case {
            tokens: 16,
            pos0: 0,
        },
        Case {
            tokens: 100,
            pos0: 0,
        },
        Case {
            tokens: 512,
            pos0: 0,
        },
        Case {
            tokens: 2048,
            pos0: 0,
        },
        Case {
            tokens: 300,
            pos0: 1000,
        },
    ];
    for case in &cases {
        compare::<f32>(&device, case, "f32", |v| v);
        compare::<u16>(&device, case, "f16", |v| f16::from_f32(v).to_bits());
    }
}

#[test]
fn flash_prefill_refuses_a_device_position() {
    let Some(device) = device("flash_prefill_refuses_a_device_position") else {
        return;
    };
    let shape = AttentionShape {
        tokens: 1,
        pos0: 0,
        heads: HEADS,
        kv_heads: KV_HEADS,
        head_dim: HEAD_DIM,
        rope_dim: 64,
        rope_base: 1e7,
        eps: 1e-6,
        capacity: 4,
    };
    let q = device.alloc_zeros::<f32>(HEADS * HEAD_DIM).unwrap();
    let qg = device.alloc_zeros::<f32>(2 * HEADS * HEAD_DIM).unwrap();
    let cache = device.alloc_zeros::<f32>(4 * KV_HEADS * HEAD_DIM).unwrap();
    let pos = device.upload(&[0u32]).unwrap();
    let mut partials = device.alloc_zeros::<f32>(1).unwrap();
    let mut o = device.alloc_zeros::<f32>(HEADS * HEAD_DIM).unwrap();
    let result = attention_on(
        &device,
        Some(AttentionKernels::FlashPrefill),
        &shape,
        &q.as_view(),
        &qg.as_view(),
        &cache.as_view(),
        &cache.as_view(),
        &mut partials.as_view_mut(),
        &mut o.as_view_mut(),
        Position::Device(&pos.as_view()),
    );
    assert!(result.is_err(), "a device position must be refused");
}

/// The decode kernels with 2, 4 and 8 query heads per split CTA (a KV head's rows loaded once
/// for them) give the bits of one head per CTA, with f32 and f16 caches, at positions where
/// the KV length takes 1, several and all 64 splits, for one token and a small batch.
#[test]
fn split_ctas_of_several_heads_equal_one_head_per_cta() {
    let name = "split_ctas_of_several_heads_equal_one_head_per_cta";
    let Some(device) = device(name) else {
        return;
    };
    fn case<T: KvElement>(device: &Device, tokens: usize, pos0: usize, to_kv: fn(f32) -> T) {
        let seed = tokens as u64 * 7 + pos0 as u64;
        let (shape, [q, qg], [k, v]) = upload_case(device, &Case { tokens, pos0 }, seed, to_kv);
        // Every split the decode kernels launch.
        let splits = attention_partials_len(1, 1, HEAD_DIM) / (HEAD_DIM + 2);
        let run = |kernels: AttentionKernels| -> Vec<u32> {
            let o = run(device, (kernels, splits), &shape, (&q, &qg), (&k, &v));
            o.into_iter().map(f32::to_bits).collect()
        };
        let one = run(AttentionKernels::PerTokenHeads(1));
        for kernels in [2, 4, 8]
            .map(AttentionKernels::PerTokenHeads)
            .into_iter()
            .chain([AttentionKernels::PerToken])
        {
            let found = run(kernels);
            let first = one.iter().zip(&found).position(|(a, b)| a != b);
            assert!(
                first.is_none(),
                "{kernels:?}, T {tokens} pos0 {pos0}: differs first at value {first:?}"
            );
        }
    }
    for (tokens, pos0) in [(1, 0), (1, 100), (1, 4095), (3, 2000)] {
        case(&device, tokens, pos0, |x| x);
        case::<u16>(&device, tokens, pos0, |x| f16::from_f32(x).to_bits());
    }
}

/// The merge with each thread's split values loaded first (`REDLITE_COMBINE_AHEAD`, the
/// default) gives the bits of the merge over the list of live splits, with f32 and f16 caches,
/// where the KV length takes 1, several and all 64 splits, for one token and a small batch.
/// (Other tests of this binary may run meanwhile: their kernels' bits do not depend on it.)
#[test]
fn merge_with_values_first_equals_merge_over_live_list() {
    let name = "merge_with_values_first_equals_merge_over_live_list";
    let Some(device) = device(name) else {
        return;
    };
    fn case<T: KvElement>(device: &Device, tokens: usize, pos0: usize, to_kv: fn(f32) -> T) {
        let seed = tokens as u64 * 13 + pos0 as u64;
        let (shape, [q, qg], [k, v]) = upload_case(device, &Case { tokens, pos0 }, seed, to_kv);
        let splits = attention_partials_len(1, 1, HEAD_DIM) / (HEAD_DIM + 2);
        let run = |ahead: bool| -> Vec<u32> {
            COMBINE_AHEAD.set(ahead);
            let kernels = AttentionKernels::PerTokenHeads(4);
            let o = run(device, (kernels, splits), &shape, (&q, &qg), (&k, &v));
            o.into_iter().map(f32::to_bits).collect()
        };
        let listed = run(false);
        let ahead = run(true);
        let first = listed.iter().zip(&ahead).position(|(a, b)| a != b);
        assert!(
            first.is_none(),
            "T {tokens} pos0 {pos0}: differs first at value {first:?}"
        );
    }
    for (tokens, pos0) in [(1, 0), (1, 100), (1, 4095), (3, 2000)] {
        case(&device, tokens, pos0, |x| x);
        case::<u16>(&device, tokens, pos0, |x| f16::from_f32(x).to_bits());
    }
    COMBINE_AHEAD.set(true);
}

/// The split kernel chosen per token by its length (`REDLITE_ATTN_LONG_FROM`): tokens below
/// the length take the bits of four query heads and four warps a CTA; the others (eight and
/// eight: other positions per warp, another merge) agree with one head a CTA within
/// `TOLERANCE`. f32 and f16 caches, a token alone and a batch straddling the length.
#[test]
fn split_by_depth_takes_each_tokens_kernel() {
    let name = "split_by_depth_takes_each_tokens_kernel";
    let Some(device) = device(name) else {
        return;
    };
    fn case<T: KvElement>(
        device: &Device,
        tokens: usize,
        pos0: usize,
        long_len: usize,
        to_kv: fn(f32) -> T,
    ) {
        let seed = tokens as u64 * 11 + pos0 as u64;
        let (shape, [q, qg], [k, v]) = upload_case(device, &Case { tokens, pos0 }, seed, to_kv);
        let splits = attention_partials_len(1, 1, HEAD_DIM) / (HEAD_DIM + 2);
        let run = |kernels| run(device, (kernels, splits), &shape, (&q, &qg), (&k, &v));
        let four = run(AttentionKernels::PerTokenHeads(4));
        let one = run(AttentionKernels::PerTokenHeads(1));
        let depth = run(AttentionKernels::PerTokenDepth(long_len));
        let row = HEADS * HEAD_DIM;
        for t in 0..tokens {
            let at = t * row..(t + 1) * row;
            if pos0 + t + 1 < long_len {
                let differ = four[at.clone()]
                    .iter()
                    .zip(&depth[at])
                    .position(|(a, b)| a.to_bits() != b.to_bits());
                assert!(differ.is_none(), "T {tokens} pos0 {pos0} long from {long_len}: short token {t} differs at {differ:?}");
                continue;
            }
            for (head, (want, got)) in one[at.clone()]
                .chunks_exact(HEAD_DIM)
                .zip(depth[at].chunks_exact(HEAD_DIM))
                .enumerate()
            {
                let rel = relative_l2(want, got);
                assert!(
                    rel <= TOLERANCE,
                    "T {tokens} pos0 {pos0}: long token {t} head {head} differs by {rel:e}"
                );
            }
        }
    }
    for (tokens, pos0, long_len) in [(1, 4095, 1), (3, 2000, 2002), (1, 100, 1 << 20)] {
        case(&device, tokens, pos0, long_len, |x| x);
        case::<u16>(&device, tokens, pos0, long_len, |x| {
            f16::from_f32(x).to_bits()
        });
    }
}
