//! A chained greedy MTP step as one CUDA graph (issue 9's "draft and verify in one graph"):
//! the block's catch-up and chained drafts, their heads and argmaxes, the trunk's
//! verification and its picks. Within a step every op of the backend, the embeddings and
//! heads included, asks the step's gate; the first time a step's shape is seen it runs as
//! before (its per-call graphs, eager embeddings and heads, which also sizes every buffer),
//! the second time its launches are recorded, and from then on the graph is launched as the
//! step begins, with the step's host inputs (each call's token ids and position) uploaded
//! just before: the host's walk of the step's ops then only checks each op against the
//! recording and does its bookkeeping while the GPU runs the step.
//!
//! A step's graph is found by its shape (ids per call) and the identity of what it touches
//! (both states, both workspaces, the scratch buffers, the MTP input buffers, the pick
//! slots); the walk checks every op's key too. A walk that differs from the recording after
//! the graph was launched is an error, and graphs are then off. `REDLITE_STEP_GRAPH=0`
//! keeps the per-call graphs.

use redlite_cuda::{CudaSlice, CudaView, CudaViewMut, Device, Graph, Switch};

use super::act::CudaAct;
use super::graph::{self, Gate, OpKey};
use super::step_clocks::StepClocks;
use super::{CudaBackend, CudaState, ExpertResidency};
use crate::backend::StepPlan;
use crate::error::{EngineError, Result};

/// `REDLITE_STEP_GRAPH=0`: a chained greedy step runs as separate graphs with eager
/// launches between them (the embeddings, the MTP input, the heads and argmaxes).
pub static STEP_GRAPH: Switch = Switch::new("REDLITE_STEP_GRAPH", true);

/// Step graphs kept (one per shape and buffers in use), least recently used dropped first.
const MAX_STEP_GRAPHS: usize = 16;

/// Host inputs of a step in device memory: a position per call, then every call's ids.
const INPUT_CAPACITY: usize = 64;

/// What finds a recorded step: the ids of each call and the identity of its buffers.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct StepKey {
    pub shape: Vec<usize>,
    pub identity: Vec<u64>,
}

struct Recorded {
    key: StepKey,
    ops: Vec<OpKey>,
    graph: Graph,
}

enum Mode {
    Capture(Vec<OpKey>),
    Replay { graph: usize, next: usize },
}

/// The step in progress.
struct Scope {
    key: StepKey,
    plan: StepPlan,
    /// Offset of each call's ids in the inputs (after the positions).
    ids_at: Vec<usize>,
    /// The call whose ops run now (`None` before the first embedding).
    call: Option<usize>,
    mode: Mode,
}

#[derive(Default)]
pub struct StepGraphs {
    recorded: Vec<Recorded>,
    /// Shapes run once (eagerly): the next one is recorded.
    seen: Vec<StepKey>,
    inputs: Option<CudaSlice<u32>>,
    scope: Option<Scope>,
    /// Steps recorded and steps replayed so far.
    pub counts: StepGraphCounts,
    /// Host clocks of replayed steps (`REDLITE_STEP_TIMES=1`).
    pub clocks: StepClocks,
}

/// How many chained steps ran as a recorded graph.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct StepGraphCounts {
    pub recorded: usize,
    pub replayed: usize,
}

/// What `begin` did.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Begun {
    /// The step runs as before (first of its shape, or not recordable).
    Off,
    Capturing,
    /// The step's graph was launched.
    Launched,
}

impl StepGraphs {
    pub fn in_step(&self) -> bool {
        self.scope.is_some()
    }

    /// The inputs buffer's address (part of a step's identity), allocating it first.
    pub fn inputs_address(&mut self, device: &Device) -> Result<u64> {
        let inputs = match &mut self.inputs {
            Some(inputs) => inputs,
            none => none.insert(device.alloc_zeros(INPUT_CAPACITY)?),
        };
        Ok(device.address(inputs))
    }

    /// Starts the step `plan` of `key` (its inputs laid out by `layout`): replays its graph,
    /// records it, or lets it run as before (the first of its shape).
    pub fn begin(
        &mut self,
        device: &Device,
        key: StepKey,
        plan: StepPlan,
        (values, ids_at): (Vec<u32>, Vec<usize>),
    ) -> Result<Begun> {
        self.scope = None;
        let found = self.recorded.iter().position(|r| r.key == key);
        self.clocks.begin(found.is_some());
        if found.is_none() && !self.seen.contains(&key) {
            if self.seen.len() == MAX_STEP_GRAPHS {
                self.seen.remove(0);
            }
            self.seen.push(key);
            return Ok(Begun::Off);
        }
        device.copy_to_device(&values, &mut self.inputs_mut()?.slice_mut(..values.len()))?;
        let mode = match found {
            Some(graph) => {
                self.clocks.uploaded();
                self.recorded[graph].graph.launch()?;
                self.clocks.launched();
                self.counts.replayed += 1;
                Mode::Replay { graph, next: 0 }
            }
            None => {
                if device.begin_capture().is_err() {
                    return Ok(Begun::Off);
                }
                Mode::Capture(Vec::new())
            }
        };
        let begun = match mode {
            Mode::Replay { .. } => Begun::Launched,
            Mode::Capture(_) => Begun::Capturing,
        };
        self.scope = Some(Scope {
            key,
            plan,
            ids_at,
            call: None,
            mode,
        });
        Ok(begun)
    }

    /// An embedding (the trunk's or the MTP block's) starts the next call of the step.
    pub fn next_call(&mut self) {
        if let Some(scope) = &mut self.scope {
            scope.call = Some(scope.call.map_or(0, |c| c + 1));
        }
    }

    /// What op `key` does: recorded, or skipped after the check that it is the recorded one.
    pub fn gate(&mut self, key: OpKey) -> Result<Gate> {
        let Some(scope) = &mut self.scope else {
            return Ok(Gate::Run);
        };
        match &mut scope.mode {
            Mode::Capture(ops) => {
                ops.push(key);
                Ok(Gate::Capture)
            }
            Mode::Replay { graph, next } => {
                let recorded = self.recorded[*graph].ops.get(*next).copied();
                if recorded != Some(key) {
                    return Err(EngineError::Cuda(format!(
                        "step graph: op {next} of the step is {key:?}, the recorded one was \
                         {recorded:?} (REDLITE_STEP_GRAPH=0 avoids this)"
                    )));
                }
                *next += 1;
                Ok(Gate::Skip)
            }
        }
    }

    /// The current call's planned entry, checked against what the walk has.
    fn planned(&self) -> Result<(usize, &Scope)> {
        let scope = self
            .scope
            .as_ref()
            .ok_or_else(|| EngineError::Cuda("step graph: no step in progress".into()))?;
        let call = scope
            .call
            .filter(|&c| c < scope.plan.forwards.len())
            .ok_or_else(|| {
                EngineError::Cuda(format!(
                    "step graph: a call past the {} planned",
                    scope.plan.forwards.len()
                ))
            })?;
        Ok((call, scope))
    }

    /// A mixer of the current call at `pos`: it must be the planned position.
    pub fn check_position(&self, pos: usize) -> Result<()> {
        let (call, scope) = self.planned()?;
        let planned = scope.plan.forwards[call].pos;
        if planned != pos {
            return Err(EngineError::Cuda(format!(
                "step graph: call {call} runs at position {pos}, planned at {planned}"
            )));
        }
        Ok(())
    }

    /// The current call's position in device memory (`[1]`).
    pub fn position(&self) -> Result<CudaView<'_, u32>> {
        let (call, _) = self.planned()?;
        let inputs = self.inputs.as_ref().ok_or_else(no_inputs)?;
        Ok(inputs.slice(call..call + 1))
    }

    /// The current call's ids in device memory, after checking that `tokens` are the
    /// planned ones (the values the step's start uploaded there).
    pub fn ids(&mut self, tokens: &[u32]) -> Result<CudaViewMut<'_, u32>> {
        let (call, scope) = self.planned()?;
        let planned = &scope.plan.forwards[call].ids;
        if planned.as_slice() != tokens {
            return Err(EngineError::Cuda(format!(
                "step graph: call {call} embeds {tokens:?}, planned {planned:?}"
            )));
        }
        let at = scope.ids_at[call];
        Ok(self.inputs_mut()?.slice_mut(at..at + tokens.len()))
    }

    /// The step has queued all its work: a recording is instantiated and launched, a replay
    /// checked complete.
    pub fn end(&mut self, device: &Device) -> Result<()> {
        let Some(scope) = self.scope.take() else {
            return Ok(());
        };
        let calls = scope.call.map_or(0, |c| c + 1);
        if calls != scope.plan.forwards.len() {
            if let Mode::Capture(_) = scope.mode {
                let _ = device.end_capture();
            }
            return Err(EngineError::Cuda(format!(
                "step graph: the step ran {calls} of its {} planned calls",
                scope.plan.forwards.len()
            )));
        }
        match scope.mode {
            Mode::Capture(ops) => {
                let graph = device.end_capture()?.ok_or_else(|| {
                    EngineError::Cuda("step graph: the capture recorded nothing".into())
                })?;
                graph.launch()?;
                self.counts.recorded += 1;
                self.seen.retain(|k| *k != scope.key);
                if self.recorded.len() == MAX_STEP_GRAPHS {
                    self.recorded.remove(0);
                }
                self.recorded.push(Recorded {
                    key: scope.key,
                    ops,
                    graph,
                });
                Ok(())
            }
            Mode::Replay { graph, next } => {
                if graph >= self.recorded.len() {
                    return Err(EngineError::Cuda(
                        "step graph: the replayed step's recording was dropped".into(),
                    ));
                }
                self.clocks.ended();
                let recorded = self.recorded.remove(graph);
                let ops = recorded.ops.len();
                self.recorded.push(recorded);
                if next != ops {
                    return Err(EngineError::Cuda(format!(
                        "step graph: the step ended after {next} of the {ops} recorded ops"
                    )));
                }
                Ok(())
            }
        }
    }

    /// The step failed half-way: a recording is dropped (none of it ran). A replay has run
    /// already; the caller turns graphs off.
    pub fn abort(&mut self, device: &Device) -> bool {
        match self.scope.take().map(|s| s.mode) {
            Some(Mode::Capture(_)) => {
                let _ = device.end_capture();
                false
            }
            Some(Mode::Replay { .. }) => true,
            None => false,
        }
    }

    /// Every recorded step dropped (buffers they use are about to be freed); an error in
    /// the middle of a replayed step, whose skipped ops would be lost.
    pub fn forget(&mut self) -> Result<()> {
        if let Some(Scope {
            mode: Mode::Replay { .. },
            ..
        }) = self.scope
        {
            return Err(EngineError::Cuda(
                "step graph: buffers of the replayed step were reallocated in its middle".into(),
            ));
        }
        self.recorded.clear();
        self.seen.clear();
        Ok(())
    }

    fn inputs_mut(&mut self) -> Result<&mut CudaSlice<u32>> {
        self.inputs.as_mut().ok_or_else(no_inputs)
    }
}

fn no_inputs() -> EngineError {
    EngineError::Cuda("step graph: inputs not allocated".into())
}

/// With `REDLITE_STEP_TIMES=1` (`step_times.rs`) the counts are printed at exit too.
impl Drop for StepGraphs {
    fn drop(&mut self) {
        let counts = self.counts;
        if counts.recorded > 0 && std::env::var("REDLITE_STEP_TIMES").as_deref() == Ok("1") {
            eprintln!(
                "step graphs (chained MTP steps): {} recorded, {} replayed",
                counts.recorded, counts.replayed
            );
        }
    }
}

/// The inputs a step's start uploads: each call's position, then each call's ids; and
/// where each call's ids start.
fn layout(plan: &StepPlan) -> Result<(Vec<u32>, Vec<usize>)> {
    let calls = plan.forwards.len();
    let mut values: Vec<u32> = Vec::with_capacity(INPUT_CAPACITY);
    for f in &plan.forwards {
        values.push(
            u32::try_from(f.pos)
                .map_err(|_| EngineError::Cuda(format!("position {} exceeds u32", f.pos)))?,
        );
    }
    let mut ids_at = Vec::with_capacity(calls);
    for f in &plan.forwards {
        ids_at.push(values.len());
        values.extend_from_slice(&f.ids);
    }
    if values.len() > INPUT_CAPACITY {
        return Err(EngineError::BadConfig(format!(
            "a step graph's inputs hold {INPUT_CAPACITY} values, the step has {}",
            values.len()
        )));
    }
    Ok((values, ids_at))
}

impl CudaBackend {
    /// `Backend::begin_step`: a step of small calls with every expert resident, graphs on.
    pub(super) fn begin_step_graph(
        &self,
        plan: StepPlan,
        states: [&CudaState; 2],
        acts: [&CudaAct; 6],
    ) -> Result<()> {
        graph::lock(&self.graphs)?.step.clocks.planning();
        let small = |n: usize| (1..=redlite_cuda::SMALL_BATCH_MAX_TOKENS).contains(&n);
        if !STEP_GRAPH.on()
            || self.residency != ExpertResidency::Resident
            || !plan.forwards.iter().all(|f| small(f.ids.len()))
            || !self.plan_in_bounds(&plan, states)?
        {
            return Ok(());
        }
        // A step whose inputs do not fit the inputs buffer runs as before.
        let Ok(inputs) = layout(&plan) else {
            return Ok(());
        };
        let mut identity = Vec::with_capacity(16);
        for state in states {
            state.identity(&mut identity)?;
        }
        for act in acts {
            identity.push(act.address(&self.device)?);
        }
        {
            let scratch = self.scratch(1)?;
            identity.push(scratch.generation);
            identity.push(self.device.address(&scratch.logits));
        }
        identity.push(
            self.mtp_buffers
                .lock()
                .map_err(|_| EngineError::Cuda("MTP buffers lock poisoned by a panic".into()))?
                .address(&self.device),
        );
        identity.push(self.kept()?.address(&self.device));
        let mut graphs = graph::lock(&self.graphs)?;
        if !graphs.enabled() {
            return Ok(());
        }
        // A one-token step left half-way (an error) must not swallow this one.
        graphs.abandon();
        identity.push(graphs.step.inputs_address(&self.device)?);
        let key = StepKey {
            shape: plan.forwards.iter().map(|f| f.ids.len()).collect(),
            identity,
        };
        graphs.step.begin(&self.device, key, plan, inputs)?;
        Ok(())
    }

    /// Whether every id of `plan` is in both embedding tables and every call fits its
    /// state's cache (the MTP block's calls, then the trunk's last): a replay runs the step
    /// before the walk's own checks, so a step that would fail them runs as before and
    /// reports its error there.
    fn plan_in_bounds(&self, plan: &StepPlan, [trunk, block]: [&CudaState; 2]) -> Result<bool> {
        let vocab = self
            .weights
            .token_embd
            .rows
            .min(self.weights.mtp_embed()?.rows);
        let calls = plan.forwards.len();
        Ok(plan.forwards.iter().enumerate().all(|(i, f)| {
            let state = if i + 1 == calls { trunk } else { block };
            f.ids.iter().all(|&id| (id as usize) < vocab) && f.pos + f.ids.len() <= state.capacity
        }))
    }

    /// How many chained steps were recorded as one graph and replayed so far.
    pub fn step_graph_counts(&self) -> Result<StepGraphCounts> {
        Ok(graph::lock(&self.graphs)?.step.counts)
    }

    /// `Backend::end_step`.
    pub(super) fn end_step_graph(&self) -> Result<()> {
        let mut graphs = graph::lock(&self.graphs)?;
        let ended = graphs.step.end(&self.device);
        if ended.is_err() {
            graphs.disable();
        }
        ended
    }

    /// `Backend::abort_step`.
    pub(super) fn abort_step_graph(&self) {
        if let Ok(mut graphs) = graph::lock(&self.graphs) {
            if graphs.step.abort(&self.device) {
                graphs.disable();
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::{layout, INPUT_CAPACITY};
    use crate::backend::{StepForward, StepPlan};

    fn call(ids: &[u32], pos: usize) -> StepForward {
        StepForward {
            ids: ids.to_vec(),
            pos,
        }
    }

    #[test]
    fn the_inputs_hold_every_position_then_every_call_s_ids() {
        let plan = StepPlan {
            forwards: vec![call(&[7, 9], 40), call(&[0], 42), call(&[9, 0, 0], 41)],
        };
        let (values, ids_at) = layout(&plan).unwrap();
        assert_eq!(values, [40, 42, 41, 7, 9, 0, 9, 0, 0]);
        assert_eq!(ids_at, [3, 5, 6]);
        let long = StepPlan {
            forwards: vec![call(&vec![1; INPUT_CAPACITY], 0)],
        };
        assert!(layout(&long).is_err(), "past the inputs buffer");
        let far = StepPlan {
            forwards: vec![call(&[1], usize::MAX)],
        };
        assert!(layout(&far).is_err(), "a position past u32");
    }
}
