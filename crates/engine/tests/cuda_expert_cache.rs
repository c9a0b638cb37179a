//! The GPU expert cache (issue 8): with fewer slots than experts, every logit is bit for bit
//! the one of full residency (prefill in one call and in chunks, decode with and without the
//! decode graph), in both precisions and under both replacement policies; the lookup
//! replaces the least recently (LRU) or least frequently (LFU, with aging) used slot and the
//! copies bring the right bytes; `--gpu-limit` refuses an allocation past it. Without a
//! CUDA driver, NVRTC or GPU the tests print why and pass.
#![cfg(feature = "cuda")]

mod cuda_support;

use std::sync::Arc;

use cuda_support::device;
use redlite_cuda::{
    expert_cache_fill, expert_cache_lookup, CachePolicy, CacheTables, CudaError, Device,
    FillTarget, LookupKind, MappedHost,
};
use redlite_engine::backend::cpu::linear::Precision;
use redlite_engine::backend::cpu::CpuBackend;
use redlite_engine::backend::cuda::{CudaBackend, ExpertResidency};
use redlite_engine::backend::{Backend, ExpertCacheCounts};
use redlite_engine::model::load::config_from_gguf;
use redlite_engine::session::Session;
use redlite_engine::state::KvType;
use redlite_engine::synth::{write_synth, Preset, Recipe, SynthOptions, VocabChoice};
use redlite_gguf::GgufModel;

/// The tiny preset (16 experts, top-4) in `recipe`.
fn tiny(dir: &std::path::Path, recipe: Recipe) -> Arc<GgufModel> {
    let opts = SynthOptions {
        config: Preset::Tiny.config(),
        recipe,
        vocab: VocabChoice::Tiny,
        seed: 5,
    };
    let path = dir.join(format!("{}.gguf", recipe.name()));
    write_synth(&path, &opts, &mut |_, _| {}).unwrap();
    Arc::new(GgufModel::open(&path).unwrap())
}

fn session(
    device: &Arc<Device>,
    gguf: &GgufModel,
    p: Precision,
    residency: ExpertResidency,
    chunk: usize,
) -> Session<CudaBackend> {
    let config = config_from_gguf(gguf).unwrap();
    let backend = CudaBackend::with_options(device.clone(), gguf, config, p, residency).unwrap();
    Session::new(backend, 256, KvType::F32, chunk).unwrap()
}

/// The policies the logits are checked under: LRU, and LFU with a half-life short enough
/// that the counts are halved several times within a test.
const POLICIES: [CachePolicy; 2] = [CachePolicy::Lru, CachePolicy::Lfu { half_life: 4 }];

fn prompt(n: usize) -> Vec<u32> {
    (0..n as u32).map(|i| (i * 53 + 7) % 900).collect()
}

/// The first position whose logits differ in any bit, or `None`.
fn first_difference(a: &[f32], b: &[f32], vocab: usize) -> Option<usize> {
    let same = |x: &[f32], y: &[f32]| x.iter().zip(y).all(|(p, q)| p.to_bits() == q.to_bits());
    a.chunks(vocab)
        .zip(b.chunks(vocab))
        .position(|(x, y)| !same(x, y))
}

/// Logits of a 48-token prompt (in chunks of `chunk`) at every position, then of 12 decode
/// steps.
fn run<B: Backend>(s: &mut Session<B>, chunk_prompt: &[u32], steps: &[u32]) -> Vec<f32> {
    let mut all = s.feed(chunk_prompt, true, false).unwrap().logits;
    for &t in steps {
        all.extend(s.step(t).unwrap());
    }
    all
}

#[test]
fn an_expert_cache_gives_the_logits_of_residency() {
    let Some(device) = device("an_expert_cache_gives_the_logits_of_residency") else {
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let tokens = prompt(60);
    let (prompt_part, steps) = tokens.split_at(48);
    let mut failures = Vec::new();
    for recipe in [Recipe::IQ2XXS, Recipe::Q4KM, Recipe::F32] {
        let gguf = tiny(dir.path(), recipe);
        let vocab = config_from_gguf(&gguf).unwrap().n_vocab;
        for p in [Precision::Ggml, Precision::Exact] {
            for chunk in [512, 7] {
                let mut resident = session(&device, &gguf, p, ExpertResidency::Resident, chunk);
                let want = run(&mut resident, prompt_part, steps);
                // 4 slots: the top-k, every token's experts swapped in; 9: some stay.
                for (slots, policy) in [4, 9].into_iter().flat_map(|s| POLICIES.map(|p| (s, p))) {
                    let cache = ExpertResidency::Cache { slots, policy };
                    let mut cached = session(&device, &gguf, p, cache, chunk);
                    let got = run(&mut cached, prompt_part, steps);
                    let case = format!(
                        "{} {p:?} chunk {chunk} slots {slots} {policy}",
                        recipe.name()
                    );
                    if let Some(at) = first_difference(&want, &got, vocab) {
                        failures.push(format!("{case}: logits differ first at row {at}"));
                    }
                    let counts = cached.backend.expert_cache_counts().unwrap();
                    let hits: u64 = counts.iter().map(|c| c.hits).sum();
                    let misses: u64 = counts.iter().map(|c| c.misses).sum();
                    let waited: u64 = counts.iter().map(|c| c.wait_ns).sum();
                    println!("{case:<56} hits {hits} misses {misses} waited {waited} ns");
                    // Decode steps copy inside the gate/up launch (and time the wait) where
                    // it takes the q8 kernel: the quantized recipes under Ggml precision.
                    let in_launch = p == Precision::Ggml && recipe != Recipe::F32;
                    assert_eq!(waited > 0, in_launch, "{case}: waited {waited} ns");
                    assert_eq!(counts.len(), 4, "{case}: a cache per layer");
                    assert!(misses >= 16, "{case}: {misses} misses");
                    if slots == 9 {
                        assert!(hits > 0, "{case}: no hits");
                    }
                }
            }
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

#[test]
fn the_decode_graph_with_a_cache_equals_eager_launches() {
    let Some(device) = device("the_decode_graph_with_a_cache_equals_eager_launches") else {
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let gguf = tiny(dir.path(), Recipe::IQ2XXS);
    let vocab = config_from_gguf(&gguf).unwrap().n_vocab;
    let tokens = prompt(40);
    for policy in POLICIES {
        let cache = ExpertResidency::Cache { slots: 5, policy };
        let mut graphed = session(&device, &gguf, Precision::Ggml, cache, 512);
        let mut eager = session(&device, &gguf, Precision::Ggml, cache, 512);
        eager.backend.disable_graphs().unwrap();
        let want = run(&mut eager, &tokens[..8], &tokens[8..]);
        let got = run(&mut graphed, &tokens[..8], &tokens[8..]);
        assert_eq!(first_difference(&want, &got, vocab), None, "{policy}");
        // The same lookups, hits and misses (the time waited for copies differs).
        let untimed = |s: &Session<CudaBackend>| {
            let counts = s.backend.expert_cache_counts().unwrap();
            counts
                .into_iter()
                .map(|c| ExpertCacheCounts { wait_ns: 0, ..c })
                .collect::<Vec<_>>()
        };
        assert_eq!(untimed(&graphed), untimed(&eager), "{policy}");
    }
}

/// The prefetch (the next block's router on this block's input, its experts copied in on
/// the side stream) only moves experts between slots: decode logits stay the bits of
/// residency, with the decode graph (the side stream a branch of it) and without.
#[test]
fn prefetching_keeps_the_logits_of_residency() {
    let Some(device) = device("prefetching_keeps_the_logits_of_residency") else {
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let tokens = prompt(40);
    for recipe in [Recipe::IQ2XXS, Recipe::Q4KM] {
        let gguf = tiny(dir.path(), recipe);
        let vocab = config_from_gguf(&gguf).unwrap().n_vocab;
        let mut resident = session(
            &device,
            &gguf,
            Precision::Ggml,
            ExpertResidency::Resident,
            512,
        );
        let want = run(&mut resident, &tokens[..8], &tokens[8..]);
        for (slots, graphs) in [(5, true), (5, false), (9, true)] {
            let cache = ExpertResidency::Cache {
                slots,
                policy: CachePolicy::LFU,
            };
            let mut cached = session(&device, &gguf, Precision::Ggml, cache, 512);
            cached.backend.set_prefetch(true).unwrap();
            if !graphs {
                cached.backend.disable_graphs().unwrap();
            }
            let got = run(&mut cached, &tokens[..8], &tokens[8..]);
            let case = format!("{} slots {slots} graphs {graphs}", recipe.name());
            assert_eq!(first_difference(&want, &got, vocab), None, "{case}");
            let counts = cached.backend.expert_cache_counts().unwrap();
            let prefetched: u64 = counts.iter().map(|c| c.prefetched).sum();
            let used: u64 = counts.iter().map(|c| c.prefetch_hits).sum();
            println!("{case}: prefetched {prefetched}, used {used}");
            assert!(prefetched > 0, "{case}: nothing prefetched");
            assert!(used <= prefetched, "{case}: {used} hits on {prefetched}");
        }
    }
}

/// One lookup: the chosen experts, then each of the 3 slots' expert after it.
type Call = (&'static [i32], [i32; 3]);

/// Runs `calls` through a fresh cache of 3 slots over 8 experts under `policy`, checking after
/// each the expert of every slot, the slot of every pair and the bytes copied into the slots,
/// then the (hits, misses) over all calls.
fn check_lookups(device: &Device, policy: CachePolicy, calls: &[Call], hits_misses: (u64, u64)) {
    let (n_expert, slots) = (8, 3);
    // Expert e's bytes: e in every byte of gate, 100 + e of up, 200 + e of down; down rows
    // 48 bytes, gate/up 32 (multiples of 16: the wide copy), and a narrow variant.
    for (gate_bytes, down_bytes) in [(32usize, 48usize), (6, 10)] {
        let mut hosts = Vec::new();
        for (base, bytes) in [(0u8, gate_bytes), (100, gate_bytes), (200, down_bytes)] {
            let mut host = MappedHost::new(device, n_expert * bytes).unwrap();
            for (e, chunk) in host.bytes_mut().unwrap().chunks_mut(bytes).enumerate() {
                chunk.fill(base + e as u8);
            }
            hosts.push(host);
        }
        let stacks = [
            device.alloc_zeros::<u8>(slots * gate_bytes).unwrap(),
            device.alloc_zeros::<u8>(slots * gate_bytes).unwrap(),
            device.alloc_zeros::<u8>(slots * down_bytes).unwrap(),
        ];
        let mut tables = CacheTables::new(device, n_expert, slots, policy).unwrap();
        let mut fills = device.alloc_zeros::<i32>(2 * slots).unwrap();
        let mut count = device.alloc_zeros::<i32>(1).unwrap();
        for (i, (ids, want_slots)) in calls.iter().enumerate() {
            let case = format!("{policy}, call {i}");
            let ids_dev = device.upload(ids).unwrap();
            let mut slot_ids = device.alloc_zeros::<i32>(ids.len()).unwrap();
            let pairs = ids.len().min(slots);
            let mut fills_here = fills.slice_mut(..2 * pairs);
            let mut count_view = count.slice_mut(..);
            let out = (
                &mut slot_ids.slice_mut(..),
                &mut fills_here,
                &mut count_view,
            );
            let chosen = &ids_dev.slice(..);
            expert_cache_lookup(device, &mut tables, chosen, out, LookupKind::Chosen).unwrap();
            let target = FillTarget {
                host: [&hosts[0], &hosts[1], &hosts[2]],
                slots: [&stacks[0], &stacks[1], &stacks[2]],
                gate_bytes,
                down_bytes,
            };
            expert_cache_fill(
                device,
                &fills.slice(..2 * pairs),
                &count.slice(..),
                target,
                n_expert,
            )
            .unwrap();
            let slot_of = tables.slot_of(device).unwrap();
            let mut held = [-1i32; 3];
            for (e, &s) in slot_of.iter().enumerate() {
                if s >= 0 {
                    held[s as usize] = e as i32;
                }
            }
            assert_eq!(&held, want_slots, "{case}: experts per slot");
            let got_slots = device.download(&slot_ids).unwrap();
            for (id, s) in ids.iter().zip(&got_slots) {
                let want = if (0..n_expert as i32).contains(id) {
                    slot_of[*id as usize]
                } else {
                    -1
                };
                assert_eq!(*s, want, "{case}: slot of expert {id}");
            }
            for (t, (stack, (base, bytes))) in stacks
                .iter()
                .zip([(0u8, gate_bytes), (100, gate_bytes), (200, down_bytes)])
                .enumerate()
            {
                let bytes_now = device.download(stack).unwrap();
                for (s, &e) in held.iter().enumerate() {
                    if e >= 0 {
                        let slot = &bytes_now[s * bytes..(s + 1) * bytes];
                        assert!(
                            slot.iter().all(|&b| b == base + e as u8),
                            "{case}: tensor {t} slot {s} does not hold expert {e}"
                        );
                    }
                }
            }
        }
        let counts = tables.counts(device).unwrap();
        assert_eq!(counts.lookups, calls.len() as u64, "{policy}");
        assert_eq!(
            (counts.hits, counts.misses, counts.overflows),
            (hits_misses.0, hits_misses.1, 0),
            "{policy}: hits, misses, overflows"
        );
    }
}

#[test]
fn lookups_replace_the_least_recently_used_slot_and_copy_its_bytes() {
    let Some(device) = device("lookups_replace_the_least_recently_used_slot") else {
        return;
    };
    let calls: [Call; 5] = [
        (&[0, 1], [0, 1, -1]),
        (&[2, 0], [0, 1, 2]),
        // Expert 1 is the least recently used: slot 1 goes to 3.
        (&[3], [0, 3, 2]),
        // 0 and 2 both last used by call 2; ties go to the lower slot.
        (&[4, 3], [4, 3, 2]),
        // Out-of-range ids are ignored.
        (&[-1, 9, 2], [4, 3, 2]),
    ];
    check_lookups(&device, CachePolicy::Lru, &calls, (3, 5));
}

/// LFU's victims: the fewest uses first (every lookup that needed an expert counts, cached or
/// not), ties to the least recently used slot, then the lower slot.
#[test]
fn lookups_replace_the_least_frequently_used_slot() {
    let Some(device) = device("lookups_replace_the_least_frequently_used_slot") else {
        return;
    };
    let calls: [Call; 7] = [
        (&[0, 1], [0, 1, -1]),
        (&[0, 2], [0, 1, 2]),
        (&[0], [0, 1, 2]),
        (&[1, 2], [0, 1, 2]),
        // Uses: 0 three, 1 and 2 two (both last used by call 4): slot 1 goes to 3, where
        // LRU would evict 0 (last used by call 3).
        (&[3], [0, 3, 2]),
        // Uses: 0 three, 2 two, 3 one: the missing 1 and 4 (in id order) take slots 1 and 2.
        (&[4, 1], [0, 1, 4]),
        // Out-of-range ids are ignored.
        (&[-1, 9, 0], [0, 1, 4]),
    ];
    check_lookups(
        &device,
        CachePolicy::Lfu { half_life: 1000 },
        &calls,
        (5, 6),
    );
}

/// Victims are picked by repeated minimum for up to 8 misses and by ranking every slot for
/// more; both give the oldest slots first (LRU), ties to the lower slot, and the missing
/// experts take them in increasing id order.
#[test]
fn many_and_few_misses_take_the_oldest_slots_in_order() {
    let Some(device) = device("many_and_few_misses_take_the_oldest_slots_in_order") else {
        return;
    };
    let (n_expert, slots) = (64, 16);
    let mut tables = CacheTables::new(&device, n_expert, slots, CachePolicy::Lru).unwrap();
    let mut fills = device.alloc_zeros::<i32>(2 * slots).unwrap();
    let mut count = device.alloc_zeros::<i32>(1).unwrap();
    let mut look_up = |ids: &[i32]| {
        let ids_dev = device.upload(ids).unwrap();
        let mut slot_ids = device.alloc_zeros::<i32>(ids.len()).unwrap();
        let out = (
            &mut slot_ids.slice_mut(..),
            &mut fills.slice_mut(..2 * ids.len().min(slots)),
            &mut count.slice_mut(..),
        );
        let ids = &ids_dev.slice(..);
        expert_cache_lookup(&device, &mut tables, ids, out, LookupKind::Chosen).unwrap();
        tables.slot_of(&device).unwrap()
    };
    // Call 1: 16 misses (ranked): expert i into slot i. Calls 2 to 13 touch experts 15 down
    // to 4, so slot k was last used by call 17 - k and slots 0 to 3 by call 1.
    let all: Vec<i32> = (0..16).collect();
    look_up(&all);
    for e in (4..16).rev() {
        look_up(&[e]);
    }
    // 10 misses (ranked): slots 0-3, then 15, 14, ..., 10, to experts 40..49 in order.
    let slot_of = look_up(&(40..50).collect::<Vec<i32>>());
    let want = [0, 1, 2, 3, 15, 14, 13, 12, 11, 10];
    for (e, s) in (40..50).zip(want) {
        assert_eq!(slot_of[e], s, "ranked: slot of expert {e}");
    }
    // 5 misses (repeated minimum): slots 9, 8, 7, 6, 5 to experts 50..54.
    let slot_of = look_up(&(50..55).collect::<Vec<i32>>());
    for (e, s) in (50..55).zip([9, 8, 7, 6, 5]) {
        assert_eq!(slot_of[e], s, "minimum: slot of expert {e}");
    }
}

/// LFU's aging: counts halve at every `half_life`-th lookup, so an expert used often long ago
/// gives way to ones used recently. Without aging the old expert stays; LRU evicts it too.
#[test]
fn lfu_counts_age_by_halving() {
    let Some(device) = device("lfu_counts_age_by_halving") else {
        return;
    };
    const OLD: &[i32] = &[0];
    const RECENT: &[i32] = &[1, 2];
    const NEW: &[i32] = &[3];
    // Expert 0 in calls 1 to 6, 1 and 2 in calls 7 to 9, then 3 needs a slot.
    let calls = |last: [i32; 3]| {
        let mut calls: Vec<Call> = vec![(OLD, [0, -1, -1]); 6];
        calls.extend([(RECENT, [0, 1, 2]); 3]);
        calls.push((NEW, last));
        calls
    };
    // No aging: uses 6, 3 and 3; 1 and 2 tie (last used by call 9), the lower slot goes.
    check_lookups(
        &device,
        CachePolicy::Lfu { half_life: 1000 },
        &calls([0, 3, 2]),
        (9, 4),
    );
    // Half-life 2 (halved at calls 2, 4, ..., 10 before counting): by call 10, 0 has 0 uses
    // left, 1 and 2 one each, so 0 goes.
    check_lookups(
        &device,
        CachePolicy::Lfu { half_life: 2 },
        &calls([3, 1, 2]),
        (9, 4),
    );
    check_lookups(&device, CachePolicy::Lru, &calls([3, 1, 2]), (9, 4));
}

#[test]
fn the_gpu_limit_refuses_an_allocation_past_it() {
    let Some(device) = device("the_gpu_limit_refuses_an_allocation_past_it") else {
        return;
    };
    let used = device.used().unwrap();
    device.set_limit(Some(used + (64 << 20)));
    assert!(device.alloc_zeros::<u8>(16 << 20).is_ok());
    match device.alloc_zeros::<u8>(256 << 20) {
        Err(CudaError::OverLimit { limit, .. }) => assert_eq!(limit, used + (64 << 20)),
        other => panic!("expected OverLimit, got {:?}", other.map(|_| ())),
    }
    device.set_limit(None);
    assert!(device.alloc_zeros::<u8>(256 << 20).is_ok());
}

/// `--experts cpu`: with every MoE block on the CPU (the routed experts never leave the
/// file's mapping) the logits are the CPU backend's within the GPU parity tolerances
/// (cuda_parity.rs: 1e-4 exact, 1e-1 with Q8 activations), prefill and decode.
#[test]
fn experts_on_the_cpu_give_the_cpu_backends_logits() {
    let Some(device) = device("experts_on_the_cpu_give_the_cpu_backends_logits") else {
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let tokens = prompt(40);
    let (prompt_part, steps) = tokens.split_at(32);
    for recipe in [Recipe::IQ2XXS, Recipe::Q4KM] {
        let gguf = tiny(dir.path(), recipe);
        let config = config_from_gguf(&gguf).unwrap();
        let vocab = config.n_vocab;
        for (p, tolerance) in [(Precision::Exact, 1e-4), (Precision::Ggml, 1e-1)] {
            let cpu = CpuBackend::with_precision(gguf.clone(), config.clone(), p).unwrap();
            let mut cpu = Session::new(cpu, 256, KvType::F32, 16).unwrap();
            let gpu =
                CudaBackend::with_host_experts(device.clone(), &gguf, config.clone(), p).unwrap();
            assert_eq!(gpu.residency(), ExpertResidency::Cpu);
            let mut gpu = Session::new(gpu, 256, KvType::F32, 16).unwrap();
            let want = run(&mut cpu, prompt_part, steps);
            let got = run(&mut gpu, prompt_part, steps);
            assert_eq!(want.len(), got.len());
            for (pos, (a, b)) in want.chunks(vocab).zip(got.chunks(vocab)).enumerate() {
                let num: f64 = a.iter().zip(b).map(|(x, y)| f64::from(x - y).powi(2)).sum();
                let den: f64 = a.iter().map(|x| f64::from(*x).powi(2)).sum();
                let rel = (num / den.max(1e-30)).sqrt();
                assert!(
                    rel <= tolerance,
                    "{} {p:?}: position {pos} differs from the CPU backend by {rel:.2e}",
                    recipe.name()
                );
            }
        }
    }
}
