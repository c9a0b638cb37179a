//! The one-token decode step, and small batches of one sequence, as one CUDA graph.
//!
//! `forward` calls the backend op by op; for a batch of one token, or of a few tokens
//! (`SMALL_BATCH_MAX_TOKENS`: an MTP verification, the MTP block's catch-up) of one
//! sequence, the backend records those ops' launches (stream capture) instead of running
//! them, from the first layer's mixer (the first op that names the sequence state) to the
//! `set_pos` that ends the layers, and launches the recorded graph there. The next such
//! step on the same buffers, state and token count skips every op (each one only checks
//! that it is the op recorded at its place, with the same buffers) and replays the graph:
//! ~900 launches become one. The attention kernels read the position from `step` (device
//! memory, written just before each launch), so one graph serves every position. The
//! embedding and the first norm run before the graph, the final norm and the LM head after
//! it, eagerly.
//!
//! A step that copies activations to the host in the middle (`to_host`, per-layer parity
//! checks) ends its capture early: what was recorded runs at once, the rest of the step
//! eagerly, and nothing is kept. `REDLITE_CUDA_GRAPH=0` turns graphs off.
//!
//! A chained greedy MTP step (the block's catch-up and drafts, then the trunk's verification)
//! is recorded whole instead, embeddings and heads included (`step_graph`): while one is in
//! progress every op asks it, and the per-call recording here stays idle.

use std::sync::{Arc, Mutex, MutexGuard};

use redlite_cuda::{CudaSlice, CudaView, Device, Graph};

use crate::backend::cuda::step_graph::StepGraphs;
use crate::backend::cuda::step_times::StepTimes;
use crate::backend::{LmHead, Norm};
use crate::error::{EngineError, Result};

/// Graphs kept per backend (one per workspace and sequence state in use), least recently
/// used dropped first.
const MAX_GRAPHS: usize = 16;

/// Which op of the forward pass, for matching a step against the recorded one.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Op {
    Norm(Norm),
    AddNorm(Norm),
    DeltaNet(usize),
    Attention(usize),
    Moe(usize),
    Add,
    /// The ops outside the layers, gated within a whole-step graph only (`step_graph`).
    Embed,
    MtpInput,
    Picks(LmHead),
}

/// One op, its batch's token count and the device addresses of the buffers it reads and
/// writes (activations, the sequence state; the scratch generation): equal keys mean the
/// recorded launches are valid for this op.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct OpKey {
    pub op: Op,
    pub tokens: usize,
    pub buffers: [u64; 4],
}

/// What the op at hand does.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Gate {
    /// Launch eagerly, position from the host.
    Run,
    /// Launch into the graph being recorded, position from device memory.
    Capture,
    /// Nothing: the recorded graph does it.
    Skip,
}

struct Captured {
    ops: Vec<OpKey>,
    graph: Graph,
}

enum Mode {
    /// No one-token step in progress.
    Idle,
    /// A one-token step was embedded; its first mixer starts a capture or a replay.
    Armed,
    Capturing(Vec<OpKey>),
    Replaying {
        graph: usize,
        next: usize,
        /// Launched at the step's first mixer already (the default; `REDLITE_GRAPH_EARLY_LAUNCH=0`:
        /// at the end of the walk).
        launched: bool,
    },
    /// A capture ended early (`interrupt`): the rest of this step runs eagerly.
    Eager,
}

pub struct DecodeGraphs {
    device: Arc<Device>,
    enabled: bool,
    /// The position of the current step, in device memory (`[1]`).
    pos_slot: CudaSlice<u32>,
    pos: usize,
    mode: Mode,
    captured: Vec<Captured>,
    /// `REDLITE_STEP_TIMES=1`: the host's share of replayed steps.
    pub times: StepTimes,
    /// Chained greedy MTP steps recorded whole; while one is in progress every op asks it.
    pub step: StepGraphs,
}

/// The recorder, shared by the backend (ops) and every sequence state it made (`set_pos`).
pub type SharedGraphs = Arc<Mutex<DecodeGraphs>>;

pub fn lock(graphs: &SharedGraphs) -> Result<MutexGuard<'_, DecodeGraphs>> {
    graphs
        .lock()
        .map_err(|_| EngineError::Cuda("decode-graph lock poisoned by a panic".into()))
}

/// A replayed step launches its graph at its first mixer, so the GPU runs it while the host
/// walks the rest of the step's ops, instead of after the walk (`REDLITE_GRAPH_EARLY_LAUNCH=0`).
/// The walk still checks every op against the recording; but a step that then differs has
/// already run the recorded layers (its state advanced) where the walk first would have run
/// nothing before its error. H100, twenty-third session (f16 KV, tg128 at depths 0 / 4096):
/// +1.3 %, then +0.7 / +0.5 % (two interleaved rounds), then +2.8 / +1.1 %, the host's time
/// from the embedding to the launch 48 -> 31 µs; H200, eighteenth session: ±0 (53 -> 47 µs).
fn early_launch() -> bool {
    static ON: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *ON.get_or_init(|| std::env::var("REDLITE_GRAPH_EARLY_LAUNCH").as_deref() != Ok("0"))
}

/// Off with `REDLITE_CUDA_GRAPH=0`, and while profiling (`REDLITE_CUDA_PROFILE=1` synchronizes
/// every launch; `--profile` marks components with events, which a replay would not record).
fn enabled_by_env() -> bool {
    std::env::var("REDLITE_CUDA_GRAPH").as_deref() != Ok("0")
        && !redlite_cuda::profiling()
        && !redlite_cuda::components_on()
}

impl DecodeGraphs {
    pub fn new(device: Arc<Device>) -> Result<SharedGraphs> {
        let pos_slot = device.alloc_zeros(1)?;
        Ok(Arc::new(Mutex::new(DecodeGraphs {
            device,
            enabled: enabled_by_env(),
            pos_slot,
            pos: 0,
            mode: Mode::Idle,
            captured: Vec::new(),
            times: StepTimes::from_env(),
            step: StepGraphs::default(),
        })))
    }

    /// No more captures or replays: every later step launches eagerly.
    pub fn disable(&mut self) {
        self.abandon();
        self.step.abort(&self.device);
        self.enabled = false;
        self.mode = Mode::Idle;
    }

    /// Drops every recorded graph (buffers they write are about to be freed). The step in
    /// progress goes on unless it is a replay, whose skipped ops would be lost: an error.
    pub fn forget_recorded(&mut self) -> Result<()> {
        if let Mode::Replaying { .. } = self.mode {
            self.mode = Mode::Idle;
            self.enabled = false;
            return Err(EngineError::Cuda(
                "decode graph: buffers of the replayed step were reallocated in its middle; \
                 graphs are now off (REDLITE_CUDA_GRAPH=0 avoids this)"
                    .into(),
            ));
        }
        self.captured.clear();
        self.step.forget().inspect_err(|_| self.enabled = false)
    }

    /// Whether graphs may be recorded and replayed.
    pub fn enabled(&self) -> bool {
        self.enabled
    }

    /// The position of the step (or, within a whole-step graph, of its current call), in
    /// device memory (`[1]`).
    pub fn position(&self) -> Result<CudaView<'_, u32>> {
        if self.step.in_step() {
            return self.step.position();
        }
        Ok(self.pos_slot.slice(0..1))
    }

    /// A batch of one token, or a small one, was embedded (eagerly): its first mixer decides.
    /// Within a whole-step graph: the step's next call begins.
    pub fn arm(&mut self) {
        if self.step.in_step() {
            self.step.next_call();
            return;
        }
        self.abandon();
        self.times.armed();
        if self.enabled {
            self.mode = Mode::Armed;
        }
    }

    /// What a mixer op `key` of a sequence at `pos` does: the first one of an armed step
    /// starts the replay of the graph recorded for it, or a capture; a batch of several
    /// `sequences` (one position each) runs eagerly.
    pub fn mixer(&mut self, key: OpKey, pos: usize, sequences: usize) -> Result<Gate> {
        if self.step.in_step() {
            if sequences != 1 {
                self.enabled = false;
                return Err(EngineError::Cuda(
                    "step graph: a call of several sequences".into(),
                ));
            }
            self.step
                .check_position(pos)
                .inspect_err(|_| self.enabled = false)?;
            return self.gate(key);
        }
        if !matches!(self.mode, Mode::Armed) {
            return self.gate(key);
        }
        if sequences != 1 {
            self.mode = Mode::Idle;
            return Ok(Gate::Run);
        }
        self.pos = pos;
        if let Some(graph) = self.captured.iter().position(|c| c.ops[0] == key) {
            let launched = early_launch();
            if launched {
                let captured = self.captured.remove(graph);
                let result = self.launch(&captured.graph);
                self.captured.insert(graph, captured);
                result?;
                self.times.replayed();
            }
            self.mode = Mode::Replaying {
                graph,
                next: 1,
                launched,
            };
            return Ok(Gate::Skip);
        }
        if self.device.begin_capture().is_err() {
            // Capture unsupported here: stay eager for good.
            self.enabled = false;
            self.mode = Mode::Idle;
            return Ok(Gate::Run);
        }
        self.mode = Mode::Capturing(vec![key]);
        Ok(Gate::Capture)
    }

    /// What the op `key` of the current step does.
    pub fn gate(&mut self, key: OpKey) -> Result<Gate> {
        if self.step.in_step() {
            return self.step.gate(key).inspect_err(|_| self.enabled = false);
        }
        match &mut self.mode {
            Mode::Idle | Mode::Armed | Mode::Eager => Ok(Gate::Run),
            Mode::Capturing(ops) => {
                ops.push(key);
                Ok(Gate::Capture)
            }
            Mode::Replaying { graph, next, .. } => {
                let recorded = self.captured[*graph].ops.get(*next).copied();
                if recorded == Some(key) {
                    *next += 1;
                    return Ok(Gate::Skip);
                }
                let at = *next;
                self.mode = Mode::Idle;
                self.enabled = false;
                Err(EngineError::Cuda(format!(
                    "decode graph: op {at} of the step is {key:?}, the recorded one was \
                     {recorded:?}; graphs are now off (REDLITE_CUDA_GRAPH=0 avoids this)"
                )))
            }
        }
    }

    /// Ends the layers of the step: launches the recorded or replayed graph.
    pub fn finish(&mut self) -> Result<()> {
        match std::mem::replace(&mut self.mode, Mode::Idle) {
            Mode::Idle | Mode::Armed | Mode::Eager => Ok(()),
            Mode::Capturing(ops) => {
                let graph = self.device.end_capture()?.ok_or_else(|| {
                    EngineError::Cuda("decode graph: the capture recorded nothing".into())
                })?;
                self.launch(&graph)?;
                if self.captured.len() == MAX_GRAPHS {
                    self.captured.remove(0);
                }
                self.captured.push(Captured { ops, graph });
                Ok(())
            }
            Mode::Replaying {
                graph,
                next,
                launched,
            } => {
                if next != self.captured[graph].ops.len() {
                    self.enabled = false;
                    return Err(EngineError::Cuda(format!(
                        "decode graph: the step ended after {next} of the {} recorded ops",
                        self.captured[graph].ops.len()
                    )));
                }
                let captured = self.captured.remove(graph);
                let result = match launched {
                    true => Ok(()),
                    false => self.launch(&captured.graph),
                };
                if !launched {
                    self.times.replayed();
                }
                self.captured.push(captured);
                result
            }
        }
    }

    /// Host access in the middle of a step: what was recorded runs now, the rest of the step
    /// eagerly. A replay cannot be cut short (its earlier ops never ran).
    pub fn interrupt(&mut self) -> Result<()> {
        match std::mem::replace(&mut self.mode, Mode::Eager) {
            Mode::Idle => {
                self.mode = Mode::Idle;
                Ok(())
            }
            Mode::Armed => {
                self.mode = Mode::Armed;
                Ok(())
            }
            Mode::Eager => Ok(()),
            Mode::Capturing(_) => match self.device.end_capture()? {
                Some(graph) => self.launch(&graph),
                None => Ok(()),
            },
            Mode::Replaying { .. } => {
                self.mode = Mode::Idle;
                self.enabled = false;
                Err(EngineError::Cuda(
                    "decode graph: host access in the middle of a replayed step; graphs are \
                     now off (REDLITE_CUDA_GRAPH=0 avoids this)"
                        .into(),
                ))
            }
        }
    }

    fn launch(&mut self, graph: &Graph) -> Result<()> {
        let pos = u32::try_from(self.pos)
            .map_err(|_| EngineError::Cuda(format!("position {} exceeds u32", self.pos)))?;
        let mut slot = self.pos_slot.as_view_mut();
        self.device.copy_to_device(&[pos], &mut slot)?;
        graph.launch()?;
        Ok(())
    }

    /// A step that never reached `finish` (an op failed and `forward` returned early): its
    /// recording is dropped (none of its ops ran) and the stream runs launches again.
    pub fn abandon(&mut self) {
        if let Mode::Capturing(_) = std::mem::replace(&mut self.mode, Mode::Idle) {
            let _ = self.device.end_capture();
        }
    }
}
