//! Per-sequence state: the KV cache of every attention layer (f32 or f16) and the conv window
//! and recurrent matrices of every DeltaNet layer, all in device memory, sized once for a
//! context length (the activations are in `act.rs`).
//!
//! `Backend::new_state` cannot fail, so an allocation failure is kept and reported by the
//! first op that uses the buffer (or by `check_room`).

use std::sync::Arc;

use redlite_cuda::{CudaSlice, DeltaNetShape, Device, ReplayLayer, ReplayTable};

use crate::backend::cuda::deltanet;
use crate::backend::cuda::graph::{self, SharedGraphs};
use crate::backend::SeqState;
use crate::error::{EngineError, Result};
use crate::model::config::{HybridConfig, LayerKind};
use crate::state::KvType;

/// K and V of one attention layer: `[capacity][kv_heads][head_dim]`.
pub enum LayerKv {
    F32 {
        k: CudaSlice<f32>,
        v: CudaSlice<f32>,
    },
    /// f16 values stored as their bits.
    F16 {
        k: CudaSlice<u16>,
        v: CudaSlice<u16>,
    },
}

impl LayerKv {
    /// The device address of the K cache (identity of a recorded decode step).
    pub(super) fn address(&self, device: &Device) -> u64 {
        match self {
            LayerKv::F32 { k, .. } => device.address(k),
            LayerKv::F16 { k, .. } => device.address(k),
        }
    }
}

/// Conv window and recurrent matrices of one DeltaNet layer.
pub struct DeltaState {
    /// The last `kernel - 1` raw conv inputs, oldest first: `[kernel - 1][channels]`.
    pub conv: CudaSlice<f32>,
    /// `S[v_head][key_dim][value_dim]`.
    pub recurrent: CudaSlice<f32>,
}

pub struct StateBuffers {
    pub kv: Vec<LayerKv>,
    pub deltanet: Vec<DeltaState>,
}

/// The state of one sequence on the GPU.
pub struct CudaState {
    device: Arc<Device>,
    /// The backend's decode-step recorder: `set_pos` ends a one-token step (and launches
    /// its graph).
    graphs: SharedGraphs,
    /// A decode step whose graph could not be launched; reported by `check_room`.
    step_error: Option<String>,
    /// Tokens processed so far (the next token's position).
    pos: usize,
    /// Positions the KV cache holds.
    pub capacity: usize,
    pub kv_type: KvType,
    /// For each layer, its index into `kv` or `deltanet`.
    slot: Vec<usize>,
    buffers: std::result::Result<StateBuffers, String>,
    /// Speculative decoding: the rows of a verification batch, recorded per DeltaNet layer.
    recording: Recording,
    /// The DeltaNet layers' heads (`tokens` unused): the sizes of a replay's buffers.
    delta_shape: DeltaNetShape,
}

/// What `checkpoint` arms: the next forward call keeps, per DeltaNet layer, the state after
/// each of its rows but the last, or what rebuilds it (`RecordedStates`; device buffers,
/// allocated for every layer by the first layer's call, before anything is recorded, and
/// reused), so `rollback_to` can keep any prefix of the batch without running the model
/// again.
#[derive(Default)]
struct Recording {
    armed: bool,
    /// Position before the recorded call; `None` until a call was recorded.
    pos0: Option<usize>,
    /// Rows of the recorded call.
    rows: usize,
    /// Per DeltaNet layer (slot order).
    states: Vec<RecordedRows>,
    /// The device table of a rollback's copies (`redlite_cuda::copy_spans`).
    copy_table: Option<CudaSlice<u64>>,
    /// The table of a replayed rollback (`redlite_cuda::deltanet_replay`).
    replay_table: ReplayTable,
}

/// What a recording call keeps for one DeltaNet layer: the conv window after row `i` at row
/// `i` of `conv`, and the recurrent state after each row as `recurrent` says.
pub struct RecordedRows {
    /// Rows the buffers hold.
    pub rows: usize,
    /// `[rows][kernel - 1][channels]`.
    pub conv: CudaSlice<f32>,
    pub recurrent: RecordedStates,
}

/// The recurrent half of a `RecordedRows`.
pub enum RecordedStates {
    /// The state after row `i` at row `i`: `[rows][v_head][key_dim][value_dim]`.
    Rows(CudaSlice<f32>),
    /// The state before the call (`[v_head][key_dim][value_dim]`) and each row's delta-rule
    /// inputs (`[rows][replay_row_floats]`), from which a rollback recomputes the rows it
    /// keeps (the fused step's verification: one state written instead of one a row).
    Replay {
        snapshot: CudaSlice<f32>,
        inputs: CudaSlice<f32>,
    },
}

impl RecordedStates {
    /// The buffer that tells this recording apart (a recorded graph's identity).
    pub(super) fn first_buffer(&self) -> &CudaSlice<f32> {
        match self {
            RecordedStates::Rows(states) => states,
            RecordedStates::Replay { snapshot, .. } => snapshot,
        }
    }

    fn replays(&self) -> bool {
        matches!(self, RecordedStates::Replay { .. })
    }
}

/// Buffers for the layers `kinds` (`None`: a layer this state does not hold).
fn allocate(
    device: &Device,
    config: &HybridConfig,
    kinds: &[Option<LayerKind>],
    capacity: usize,
    kv_type: KvType,
) -> std::result::Result<(Vec<usize>, StateBuffers), redlite_cuda::CudaError> {
    let width = config.n_head_kv * config.head_dim;
    let mut slot = Vec::with_capacity(kinds.len());
    let (mut kv, mut deltanet) = (Vec::new(), Vec::new());
    for kind in kinds {
        let Some(kind) = kind else {
            slot.push(usize::MAX);
            continue;
        };
        match kind {
            LayerKind::Attention => {
                slot.push(kv.len());
                let len = capacity * width;
                kv.push(match kv_type {
                    KvType::F32 => LayerKv::F32 {
                        k: device.alloc_zeros(len)?,
                        v: device.alloc_zeros(len)?,
                    },
                    KvType::F16 => LayerKv::F16 {
                        k: device.alloc_zeros(len)?,
                        v: device.alloc_zeros(len)?,
                    },
                });
            }
            LayerKind::DeltaNet => {
                slot.push(deltanet.len());
                let recurrent = config.ssm_v_heads * config.ssm_head_dim * config.ssm_head_dim;
                deltanet.push(DeltaState {
                    conv: device.alloc_zeros((config.conv_kernel - 1) * config.conv_channels())?,
                    recurrent: device.alloc_zeros(recurrent)?,
                });
            }
        }
    }
    Ok((slot, StateBuffers { kv, deltanet }))
}

impl CudaState {
    pub(super) fn new(
        device: Arc<Device>,
        graphs: SharedGraphs,
        config: &HybridConfig,
        capacity: usize,
        kv_type: KvType,
    ) -> CudaState {
        let kinds: Vec<Option<LayerKind>> = config.layers.iter().copied().map(Some).collect();
        CudaState::with_layers(device, graphs, config, &kinds, capacity, kv_type)
    }

    /// The state of the MTP block alone: the KV cache of its attention layer (`n_layer`).
    pub(super) fn new_mtp(
        device: Arc<Device>,
        graphs: SharedGraphs,
        config: &HybridConfig,
        capacity: usize,
        kv_type: KvType,
    ) -> CudaState {
        let mut kinds = vec![None; config.n_layer];
        kinds.push(Some(LayerKind::Attention));
        CudaState::with_layers(device, graphs, config, &kinds, capacity, kv_type)
    }

    fn with_layers(
        device: Arc<Device>,
        graphs: SharedGraphs,
        config: &HybridConfig,
        kinds: &[Option<LayerKind>],
        capacity: usize,
        kv_type: KvType,
    ) -> CudaState {
        let (slot, buffers) = match allocate(&device, config, kinds, capacity, kv_type) {
            Ok((slot, buffers)) => (slot, Ok(buffers)),
            Err(e) => (Vec::new(), Err(e.to_string())),
        };
        CudaState {
            device,
            graphs,
            step_error: None,
            pos: 0,
            capacity,
            kv_type,
            slot,
            buffers,
            recording: Recording::default(),
            delta_shape: DeltaNetShape {
                tokens: 0,
                k_heads: config.ssm_k_heads,
                v_heads: config.ssm_v_heads,
                head_dim: config.ssm_head_dim,
            },
        }
    }

    /// What tells this state's device buffers apart (a step graph's identity): its first KV
    /// cache and DeltaNet state, and the rows a verification records into.
    pub(super) fn identity(&self, out: &mut Vec<u64>) -> Result<()> {
        let buffers = self
            .buffers
            .as_ref()
            .map_err(|msg| EngineError::Cuda(format!("sequence state: {msg}")))?;
        let device = &self.device;
        out.push(buffers.kv.first().map_or(0, |kv| kv.address(device)));
        out.push(
            buffers
                .deltanet
                .first()
                .map_or(0, |d| device.address(&d.recurrent)),
        );
        out.push(
            self.recording
                .states
                .first()
                .map_or(0, |r| device.address(r.recurrent.first_buffer())),
        );
        Ok(())
    }

    fn buffers_mut(&mut self) -> Result<&mut StateBuffers> {
        self.buffers
            .as_mut()
            .map_err(|msg| EngineError::Cuda(format!("sequence state: {msg}")))
    }

    /// The KV cache of attention layer `layer`.
    pub(super) fn kv_mut(&mut self, layer: usize) -> Result<&mut LayerKv> {
        let slot = self.slot.get(layer).copied().unwrap_or(usize::MAX);
        self.buffers_mut()?
            .kv
            .get_mut(slot)
            .ok_or_else(|| EngineError::BadConfig(format!("layer {layer} has no KV cache")))
    }

    /// The state of DeltaNet layer `layer` and, when the current call of `tokens` rows
    /// records (see `checkpoint`), where the states after its rows but the last go. The
    /// first layer's call makes room for every layer's rows (before a recorded graph starts,
    /// so that the graph never sees an allocation).
    pub(super) fn deltanet_recording(
        &mut self,
        device: &Device,
        layer: usize,
        tokens: usize,
    ) -> Result<(&mut DeltaState, Option<&mut RecordedRows>)> {
        let slot = self.slot.get(layer).copied().unwrap_or(usize::MAX);
        let armed = self.recording.armed && tokens > 1;
        let buffers = self
            .buffers
            .as_mut()
            .map_err(|msg| EngineError::Cuda(format!("sequence state: {msg}")))?;
        if armed {
            self.recording.rows = tokens;
            let rows = tokens - 1;
            let layers = buffers.deltanet.len();
            // A replay from REPLAY_MIN_ROWS rows on; a shorter call keeps replaying into
            // buffers made for a longer one rather than making others (and forgetting the
            // graphs recorded with them).
            let fit = self.recording.states.len() >= layers
                && self.recording.states.iter().all(|r| r.rows >= rows);
            let replaying = self.recording.states.first().map(|r| r.recurrent.replays());
            let replay = deltanet::replays(tokens)
                && (tokens >= deltanet::REPLAY_MIN_ROWS || fit && replaying == Some(true));
            let short = !fit
                || self
                    .recording
                    .states
                    .iter()
                    .any(|r| r.recurrent.replays() != replay);
            if short {
                // Graphs recorded with the old buffers may not replay (and a new buffer may
                // reuse an old one's address, which the graphs' keys would not tell apart).
                graph::lock(&self.graphs)?.forget_recorded()?;
                self.recording.states.clear();
                let row_floats = redlite_cuda::replay_row_floats(&self.delta_shape);
                for d in &buffers.deltanet {
                    let recurrent = match replay {
                        true => RecordedStates::Replay {
                            snapshot: device.alloc_zeros(d.recurrent.len())?,
                            inputs: device.alloc_zeros(rows * row_floats)?,
                        },
                        false => {
                            RecordedStates::Rows(device.alloc_zeros(rows * d.recurrent.len())?)
                        }
                    };
                    self.recording.states.push(RecordedRows {
                        rows,
                        conv: device.alloc_zeros(rows * d.conv.len())?,
                        recurrent,
                    });
                }
            }
        }
        let state = buffers.deltanet.get_mut(slot).ok_or_else(|| {
            EngineError::BadConfig(format!("layer {layer} has no DeltaNet state"))
        })?;
        let record = if armed {
            self.recording.states.get_mut(slot)
        } else {
            None
        };
        Ok((state, record))
    }
}

impl SeqState for CudaState {
    fn pos(&self) -> usize {
        self.pos
    }

    /// Called by `forward` after the layers: a recorded one-token step runs here.
    fn set_pos(&mut self, pos: usize) {
        self.pos = pos;
        self.recording.armed = false;
        let finished = graph::lock(&self.graphs).and_then(|mut g| {
            // After a chained step's picks: the session's accept begins here.
            g.step.clocks.accepting();
            g.finish()
        });
        if let Err(e) = finished {
            self.step_error = Some(e.to_string());
        }
    }

    fn check_room(&self, tokens: usize) -> Result<()> {
        if let Err(msg) = &self.buffers {
            return Err(EngineError::Cuda(format!("sequence state: {msg}")));
        }
        if let Some(msg) = &self.step_error {
            return Err(EngineError::Cuda(format!("sequence state: {msg}")));
        }
        // A step that failed half-way left its capture open: drop it before running more.
        graph::lock(&self.graphs)?.abandon();
        if self.pos + tokens > self.capacity {
            return Err(EngineError::ContextFull {
                needed: self.pos + tokens,
                capacity: self.capacity,
            });
        }
        Ok(())
    }

    /// Zeroes the DeltaNet state (KV entries past the position are simply overwritten). A
    /// failure leaves the state unusable; `check_room` then reports it.
    fn reset_state(&mut self) {
        self.pos = 0;
        self.recording.armed = false;
        self.recording.pos0 = None;
        self.step_error = None;
        if let Ok(mut graphs) = graph::lock(&self.graphs) {
            graphs.abandon();
        }
        let device = self.device.clone();
        let Ok(buffers) = &mut self.buffers else {
            return;
        };
        let zeroed = buffers.deltanet.iter_mut().try_for_each(|d| {
            device.zero(&mut d.conv)?;
            device.zero(&mut d.recurrent)
        });
        if let Err(e) = zeroed {
            self.buffers = Err(format!("reset failed: {e}"));
        }
    }

    type Snapshot = CudaSnapshot;

    /// Copies the DeltaNet state to the host (a snapshot waits off the GPU's memory).
    fn snapshot(&self) -> Result<CudaSnapshot> {
        // A step that failed half-way left its capture open: copies must not join it.
        graph::lock(&self.graphs)?.abandon();
        let buffers = self
            .buffers
            .as_ref()
            .map_err(|msg| EngineError::Cuda(format!("sequence state: {msg}")))?;
        let deltanet = buffers
            .deltanet
            .iter()
            .map(|d| {
                Ok((
                    self.device.download(&d.conv)?,
                    self.device.download(&d.recurrent)?,
                ))
            })
            .collect::<std::result::Result<Vec<_>, redlite_cuda::CudaError>>()?;
        Ok(CudaSnapshot {
            pos: self.pos,
            deltanet,
        })
    }

    fn restore(&mut self, snapshot: &CudaSnapshot) -> Result<()> {
        graph::lock(&self.graphs)?.abandon();
        let device = self.device.clone();
        let buffers = self.buffers_mut()?;
        if buffers.deltanet.len() != snapshot.deltanet.len() {
            return Err(EngineError::BadConfig(
                "a snapshot of another model's state".into(),
            ));
        }
        for (d, (conv, recurrent)) in buffers.deltanet.iter_mut().zip(&snapshot.deltanet) {
            device.copy_to_device(conv, &mut d.conv.as_view_mut())?;
            device.copy_to_device(recurrent, &mut d.recurrent.as_view_mut())?;
        }
        self.pos = snapshot.pos;
        self.recording.pos0 = None;
        Ok(())
    }

    /// Arms the recording of the next forward call (its DeltaNet state per row).
    fn checkpoint(&mut self) -> Result<()> {
        graph::lock(&self.graphs)?.abandon();
        self.recording.armed = true;
        self.recording.pos0 = Some(self.pos);
        self.recording.rows = 0;
        Ok(())
    }

    /// Puts the recorded state after row `kept - 1` back, within device memory: a copy of
    /// each layer's recorded rows, or one launch that replays the kept rows from each
    /// layer's snapshot.
    fn rollback_to(&mut self, kept: usize) -> Result<()> {
        graph::lock(&self.graphs)?.abandon();
        let pos0 = self.recording.pos0.ok_or_else(|| {
            EngineError::BadConfig("rollback without a recorded verification batch".into())
        })?;
        if kept == 0 || kept >= self.recording.rows {
            return Err(EngineError::BadConfig(format!(
                "rollback to {kept} rows of a batch of {}",
                self.recording.rows
            )));
        }
        let device = self.device.clone();
        let buffers = self
            .buffers
            .as_mut()
            .map_err(|msg| EngineError::Cuda(format!("sequence state: {msg}")))?;
        let Recording {
            states,
            copy_table,
            replay_table,
            ..
        } = &mut self.recording;
        if states.iter().any(|saved| saved.rows < kept) {
            return Err(EngineError::BadConfig(format!(
                "no recorded state after row {}",
                kept - 1
            )));
        }
        let layers = buffers.deltanet.iter_mut().zip(states.iter());
        match states
            .first()
            .is_some_and(|saved| saved.recurrent.replays())
        {
            true => replay_rows(&device, &self.delta_shape, kept, layers, replay_table)?,
            false => copy_row(&device, kept - 1, layers, copy_table)?,
        }
        self.pos = pos0 + kept;
        graph::lock(&self.graphs)?.step.clocks.rolled_back();
        Ok(())
    }
}

/// A replayed rollback: every layer's state rebuilt from its snapshot through the `kept`
/// rows, in one launch.
fn replay_rows<'a>(
    device: &Device,
    shape: &DeltaNetShape,
    kept: usize,
    layers: impl Iterator<Item = (&'a mut DeltaState, &'a RecordedRows)>,
    table: &mut ReplayTable,
) -> Result<()> {
    let mut replays = Vec::new();
    for (d, saved) in layers {
        let RecordedStates::Replay { snapshot, inputs } = &saved.recurrent else {
            return Err(EngineError::BadConfig(
                "a recording of both kinds".to_string(),
            ));
        };
        replays.push(ReplayLayer {
            snapshot: snapshot.as_view(),
            inputs: inputs.as_view(),
            conv_record: saved.conv.as_view(),
            state: d.recurrent.as_view_mut(),
            conv: d.conv.as_view_mut(),
        });
    }
    Ok(redlite_cuda::deltanet_replay(
        device,
        shape,
        kept,
        &mut replays,
        table,
    )?)
}

/// A copied rollback: every layer's recorded state after `row` copied back, in one launch.
fn copy_row<'a>(
    device: &Device,
    row: usize,
    layers: impl Iterator<Item = (&'a mut DeltaState, &'a RecordedRows)>,
    table: &mut Option<CudaSlice<u64>>,
) -> Result<()> {
    let mut copies = Vec::new();
    for (d, saved) in layers {
        let RecordedStates::Rows(recurrent_rows) = &saved.recurrent else {
            return Err(EngineError::BadConfig(
                "a recording of both kinds".to_string(),
            ));
        };
        let (conv, recurrent) = (d.conv.len(), d.recurrent.len());
        copies.push((
            saved.conv.slice(row * conv..(row + 1) * conv),
            d.conv.as_view_mut(),
        ));
        copies.push((
            recurrent_rows.slice(row * recurrent..(row + 1) * recurrent),
            d.recurrent.as_view_mut(),
        ));
    }
    // Three addresses a copy.
    let table = table_of(device, table, 3 * copies.len())?;
    Ok(redlite_cuda::copy_spans(device, &mut copies, table)?)
}

/// The rollback's device table, kept between calls and grown to `len` values when shorter.
fn table_of<'a>(
    device: &Device,
    kept: &'a mut Option<CudaSlice<u64>>,
    len: usize,
) -> Result<&'a mut CudaSlice<u64>> {
    if kept.as_ref().is_none_or(|table| table.len() < len) {
        *kept = Some(device.alloc_zeros(len)?);
    }
    kept.as_mut()
        .ok_or_else(|| EngineError::Cuda("no rollback table".to_string()))
}

/// A sequence's DeltaNet state (conv window, recurrent matrices per layer) and position,
/// kept on the host.
pub struct CudaSnapshot {
    pos: usize,
    deltanet: Vec<(Vec<f32>, Vec<f32>)>,
}
