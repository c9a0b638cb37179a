//! Decode allocates nothing: once warm, CPU decode steps (`Session::step`, the loop of
//! `redlite bench`'s tg and of generation) make no heap allocation, 16 steps in a row, for
//! every recipe's block types and both KV types, with the default (ggml-style) precision. A
//! counting global allocator sees every thread's allocations, the thread pool's included.

use std::alloc::{GlobalAlloc, Layout, System};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;

use redlite_engine::backend::cpu::CpuBackend;
use redlite_engine::model::load::config_from_gguf;
use redlite_engine::session::Session;
use redlite_engine::state::KvType;
use redlite_engine::synth::{write_synth, Preset, Recipe, SynthOptions, VocabChoice};
use redlite_gguf::GgufModel;

struct Counting;

static ARMED: AtomicBool = AtomicBool::new(false);
static CALLS: AtomicUsize = AtomicUsize::new(0);
static BYTES: AtomicUsize = AtomicUsize::new(0);

fn count(size: usize) {
    if ARMED.load(Ordering::Relaxed) {
        CALLS.fetch_add(1, Ordering::Relaxed);
        BYTES.fetch_add(size, Ordering::Relaxed);
    }
}

// SAFETY: every call forwards to the system allocator unchanged; counting has no effect
// on the memory handed out.
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        count(layout.size());
        System.alloc(layout)
    }
    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        count(layout.size());
        System.alloc_zeroed(layout)
    }
    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        count(new_size);
        System.realloc(ptr, layout, new_size)
    }
    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        System.dealloc(ptr, layout)
    }
}

#[global_allocator]
static GLOBAL: Counting = Counting;

fn tiny_session(dir: &std::path::Path, recipe: Recipe, kv: KvType) -> Session<CpuBackend> {
    let opts = SynthOptions {
        config: Preset::Tiny.config(),
        recipe,
        vocab: VocabChoice::Tiny,
        seed: 5,
    };
    let path = dir.join(format!("{}.gguf", recipe.name()));
    write_synth(&path, &opts, &mut |_, _| {}).unwrap();
    let gguf = Arc::new(GgufModel::open(&path).unwrap());
    let config = config_from_gguf(&gguf).unwrap();
    Session::new(CpuBackend::new(gguf, config).unwrap(), 256, kv, 64).unwrap()
}

#[test]
fn cpu_decode_steps_allocate_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let recipes = [
        (Recipe::IQ2XXS, KvType::F32),
        (Recipe::IQ2XS, KvType::F16),
        (Recipe::IQ1M, KvType::F32),
        (Recipe::Q4KM, KvType::F16),
        (Recipe::F16, KvType::F32),
        (Recipe::F32, KvType::F32),
    ];
    for (recipe, kv) in recipes {
        let mut s = tiny_session(dir.path(), recipe, kv);
        let prompt: Vec<u32> = (0..20).map(|i| (i * 37 + 11) % 500).collect();
        s.feed(&prompt, false, false).unwrap();
        for t in 0..4 {
            s.step(t).unwrap();
        }
        // Windows of 16 steps until one allocates nothing (at most WINDOWS). A pool thread
        // keeps the buffers of the tasks it has run, so one that ran no task of some kind
        // during the warm-up (descheduled on a busy machine: CI saw 2 allocations of 224
        // bytes once) grows a buffer the first time it does; a step that allocates every
        // time never gives a clean window.
        let mut windows = Vec::new();
        for w in 0..WINDOWS {
            CALLS.store(0, Ordering::Relaxed);
            BYTES.store(0, Ordering::Relaxed);
            ARMED.store(true, Ordering::Relaxed);
            for t in 0..16 {
                s.step(100 + 16 * w + t).unwrap();
            }
            ARMED.store(false, Ordering::Relaxed);
            windows.push((CALLS.load(Ordering::Relaxed), BYTES.load(Ordering::Relaxed)));
            if windows.last().is_some_and(|&(calls, _)| calls == 0) {
                break;
            }
        }
        assert!(
            windows.last().is_some_and(|&(calls, _)| calls == 0),
            "{} with {kv:?} KV: no 16 decode steps without an allocation; (allocations, bytes) \
             a window: {windows:?}",
            recipe.name()
        );
    }
}

/// Windows of 16 decode steps tried for one without an allocation.
const WINDOWS: u32 = 3;
