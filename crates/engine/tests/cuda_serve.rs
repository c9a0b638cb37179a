//! The serving scheduler on the GPU: requests batched over several slots, plain and with the
//! MTP block drafting 1 to 3 tokens, give exactly the greedy tokens each request gives alone
//! (one slot, one request at a time). A batch of decoding slots launches the one-token
//! kernels row for row, so any difference names a batch shape whose rows are not the bits
//! of a one-token step. Without a CUDA driver, NVRTC or GPU the test prints why and passes.
#![cfg(feature = "cuda")]

mod cuda_support;

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc::{channel, Receiver, Sender};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use cuda_support::device;
use redlite_cuda::Device;
use redlite_engine::backend::cpu::linear::Precision;
use redlite_engine::backend::cuda::CudaBackend;
use redlite_engine::model::load::config_from_gguf;
use redlite_engine::sampling::SamplingParams;
use redlite_engine::serve::{self, Event, EventSink, Handle, Job, ServeConfig};
use redlite_engine::state::KvType;
use redlite_engine::synth::{write_synth, Preset, Recipe, SynthOptions, VocabChoice};
use redlite_engine::tokenizer::Tokenizer;
use redlite_gguf::GgufModel;

const CHUNK: usize = 8;
const MAX_TOKENS: usize = 14;

struct Model {
    _dir: tempfile::TempDir,
    gguf: Arc<GgufModel>,
    tokenizer: Arc<Tokenizer>,
}

/// The tiny model of `recipe` with its MTP block.
fn model(recipe: Recipe) -> Model {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("tiny-mtp.gguf");
    let mut config = Preset::Tiny.config();
    config.n_mtp = 1;
    let opts = SynthOptions {
        config,
        recipe,
        vocab: VocabChoice::Tiny,
        seed: 5,
    };
    write_synth(&path, &opts, &mut |_, _| {}).unwrap();
    let gguf = Arc::new(GgufModel::open(&path).unwrap());
    let tokenizer = Arc::new(Tokenizer::from_metadata(gguf.metadata()).unwrap());
    Model {
        _dir: dir,
        gguf,
        tokenizer,
    }
}

/// A scheduler on the GPU (llama.cpp's precision, the default) with `slots` slots,
/// drafting `draft` tokens per step with the MTP block (0: off).
fn start(device: &Arc<Device>, m: &Model, slots: usize, draft: usize) -> Handle {
    let (gguf, device) = (m.gguf.clone(), device.clone());
    let config = config_from_gguf(&gguf).unwrap();
    serve::spawn(
        move || {
            let mut backend = CudaBackend::with_precision(device, &gguf, config, Precision::Ggml)?;
            if draft > 0 {
                backend.load_mtp(&gguf)?;
            }
            Ok(backend)
        },
        m.tokenizer.clone(),
        ServeConfig {
            slots,
            context: 256,
            kv_type: KvType::F32,
            chunk: CHUNK,
            queue_limit: 16,
            snapshots_per_slot: 0,
            draft,
        },
    )
    .unwrap()
}

struct TestSink {
    tx: Mutex<Sender<Event>>,
    closed: Arc<AtomicBool>,
}

impl EventSink for TestSink {
    fn send(&self, event: Event) -> bool {
        !self.closed.load(Ordering::SeqCst) && self.tx.lock().unwrap().send(event).is_ok()
    }
    fn is_closed(&self) -> bool {
        self.closed.load(Ordering::SeqCst)
    }
}

/// Submits a greedy request and returns where its events arrive.
fn submit(handle: &Handle, prompt: &[u32]) -> Receiver<Event> {
    let (tx, rx) = channel();
    let job = Job {
        prompt: prompt.to_vec(),
        max_tokens: MAX_TOKENS,
        sampling: SamplingParams::greedy(),
        stop: Vec::new(),
        render_special: false,
        logprobs: None,
        sink: Box::new(TestSink {
            tx: Mutex::new(tx),
            closed: Arc::new(AtomicBool::new(false)),
        }),
    };
    handle.submit(job).unwrap();
    rx
}

/// The generated ids of a request.
fn tokens(rx: &Receiver<Event>) -> Vec<u32> {
    let mut ids = Vec::new();
    loop {
        match rx.recv_timeout(Duration::from_secs(120)).expect("an event") {
            Event::Token { id, .. } => ids.push(id),
            Event::Done(_) => return ids,
            Event::Failed(why) => panic!("job failed: {why}"),
            Event::Started { .. } | Event::Text(_) => {}
        }
    }
}

fn prompt(seed: u32, n: usize) -> Vec<u32> {
    (0..n as u32)
        .map(|i| (i * 37 + seed * 101 + 11) % 500)
        .collect()
}

#[test]
fn batched_serving_with_and_without_mtp_equals_each_request_alone() {
    let Some(device) = device("batched_serving_with_and_without_mtp_equals_each_request_alone")
    else {
        return;
    };
    let mut failures = Vec::new();
    for recipe in [Recipe::IQ2XXS, Recipe::Q4KM] {
        let m = model(recipe);
        let prompts: Vec<Vec<u32>> = (0..6).map(|s| prompt(s, 5 + 3 * s as usize)).collect();
        let alone = start(&device, &m, 1, 0);
        let reference: Vec<Vec<u32>> = prompts.iter().map(|p| tokens(&submit(&alone, p))).collect();
        alone.shutdown();
        for draft in 0..=3 {
            let handle = start(&device, &m, 3, draft);
            let receivers: Vec<_> = prompts.iter().map(|p| submit(&handle, p)).collect();
            for (i, rx) in receivers.iter().enumerate() {
                let ids = tokens(rx);
                if ids != reference[i] {
                    let first = ids.iter().zip(&reference[i]).take_while(|(a, b)| a == b);
                    failures.push(format!(
                        "{} draft {draft}, request {i}: differs from token {} on",
                        recipe.name(),
                        first.count()
                    ));
                }
            }
            let metrics = handle.metrics();
            if draft > 0 {
                assert!(metrics.mtp_steps > 0, "{metrics:?}");
            }
            handle.shutdown();
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}
