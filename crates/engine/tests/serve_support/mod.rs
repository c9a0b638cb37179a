//! Shared by the serving tests (CPU and GPU): a tiny synthetic model with its tokenizer,
//! greedy jobs whose events arrive on a channel, and the prompts they send.

use std::path::Path;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc::{channel, Receiver, Sender};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use redlite_engine::sampling::SamplingParams;
use redlite_engine::serve::{Event, EventSink, Finish, Job, ServeConfig};
use redlite_engine::state::KvType;
use redlite_engine::synth::{write_synth, Preset, Recipe, SynthOptions, VocabChoice};
use redlite_engine::tokenizer::Tokenizer;
use redlite_gguf::GgufModel;

/// Prompt tokens per scheduler step in the serving tests.
pub const CHUNK: usize = 8;

/// The schedulers' settings in the serving tests: `slots`, `queue_limit` waiting requests,
/// `snapshots_per_slot` prompt-reuse snapshots, `draft` MTP drafts per step (0: off); 256
/// positions of f32 KV per slot, prompts in steps of [`CHUNK`] tokens.
pub fn serve_config(
    slots: usize,
    queue_limit: usize,
    snapshots_per_slot: usize,
    draft: usize,
) -> ServeConfig {
    ServeConfig {
        slots,
        context: 256,
        kv_type: KvType::F32,
        chunk: CHUNK,
        queue_limit,
        snapshots_per_slot,
        draft,
    }
}

pub struct Model {
    pub _dir: tempfile::TempDir,
    pub gguf: Arc<GgufModel>,
    pub tokenizer: Arc<Tokenizer>,
}

impl Model {
    /// The model at `path` (kept alive by `dir`).
    pub fn open(dir: tempfile::TempDir, path: &Path) -> Model {
        let gguf = Arc::new(GgufModel::open(path).unwrap());
        let tokenizer = Arc::new(Tokenizer::from_metadata(gguf.metadata()).unwrap());
        Model {
            _dir: dir,
            gguf,
            tokenizer,
        }
    }
}

/// The tiny model of `recipe`, with the MTP block when `mtp`.
pub fn tiny_model(recipe: Recipe, mtp: bool) -> Model {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("tiny.gguf");
    let mut config = Preset::Tiny.config();
    config.n_mtp = usize::from(mtp);
    let opts = SynthOptions {
        config,
        recipe,
        vocab: VocabChoice::Tiny,
        seed: 5,
    };
    write_synth(&path, &opts, &mut |_, _| {}).unwrap();
    Model::open(dir, &path)
}

/// Collects a job's events; `closed` simulates a client that went away.
pub struct TestSink {
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

/// A greedy job of `max_tokens`, where its events arrive, and its client's "gone" flag.
pub fn job(prompt: Vec<u32>, max_tokens: usize) -> (Job, Receiver<Event>, Arc<AtomicBool>) {
    let (tx, rx) = channel();
    let closed = Arc::new(AtomicBool::new(false));
    let job = Job {
        prompt,
        max_tokens,
        sampling: SamplingParams::greedy(),
        stop: Vec::new(),
        render_special: false,
        logprobs: None,
        sink: Box::new(TestSink {
            tx: Mutex::new(tx),
            closed: closed.clone(),
        }),
    };
    (job, rx, closed)
}

/// The generated ids and the end of a job.
pub fn wait(rx: &Receiver<Event>) -> (Vec<u32>, Finish) {
    let mut ids = Vec::new();
    loop {
        match rx.recv_timeout(Duration::from_secs(120)).expect("an event") {
            Event::Token { id, .. } => ids.push(id),
            Event::Done(f) => return (ids, f),
            Event::Failed(why) => panic!("job failed: {why}"),
            Event::Started { .. } | Event::Text(_) => {}
        }
    }
}

/// `n` ids of the tiny vocabulary, different for each `seed`.
pub fn prompt(seed: u32, n: usize) -> Vec<u32> {
    (0..n as u32)
        .map(|i| (i * 37 + seed * 101 + 11) % 500)
        .collect()
}
