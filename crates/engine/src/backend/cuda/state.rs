//! Device activations and per-sequence state: the KV cache of every attention layer
//! (f32 or f16) and the conv window and recurrent matrices of every DeltaNet layer, all in
//! device memory, sized once for a context length.
//!
//! `Backend::new_act` and `Backend::new_state` cannot fail, so an allocation failure is
//! kept and reported by the first op that uses the buffer (or by `check_room`).

use std::sync::Arc;

use redlite_cuda::{
    CudaSlice, CudaView, CudaViewMut, Device, Q8Rows, Q8RowsMut, ONE_TOKEN_KERNELS_MAX_TOKENS,
    Q8_BLOCK_VALUES,
};

use crate::backend::cuda::graph::{self, SharedGraphs};
use crate::backend::SeqState;
use crate::error::{EngineError, Result};
use crate::model::config::{HybridConfig, LayerKind};
use crate::state::KvType;

/// Activations `[max_tokens][width]` in device memory, and for batches of decode size
/// their Q8_K codes when a norm wrote them (`q8`).
pub struct CudaAct {
    pub(super) width: usize,
    pub(super) max_tokens: usize,
    data: std::result::Result<CudaSlice<f32>, String>,
    q8: Option<Q8Side>,
}

/// The Q8_K codes of an activation buffer's first rows (`Q8Rows`' layout), written by the
/// norms (`rms_norm_quantized`) for the q8 products that read the buffer.
struct Q8Side {
    scales: CudaSlice<f32>,
    codes: CudaSlice<i8>,
    /// Rows the buffers hold: a batch of decode size at most.
    capacity: usize,
    /// Leading rows whose codes are those of the f32 rows now: set by the norm that wrote
    /// both, reset by every other write (`rows_mut`, `row_range_mut`).
    valid: usize,
}

impl CudaAct {
    /// `quantized`: keep the Q8_K codes of up to `ONE_TOKEN_KERNELS_MAX_TOKENS` rows (the
    /// backend's q8 products; widths of whole 256-value blocks).
    pub(super) fn new(
        device: &Device,
        max_tokens: usize,
        width: usize,
        quantized: bool,
    ) -> CudaAct {
        let capacity = max_tokens.min(ONE_TOKEN_KERNELS_MAX_TOKENS);
        let q8 = (quantized && width.is_multiple_of(Q8_BLOCK_VALUES) && capacity > 0)
            .then(|| {
                Some(Q8Side {
                    scales: device
                        .alloc_zeros(capacity * width / Q8_BLOCK_VALUES)
                        .ok()?,
                    codes: device.alloc_zeros(capacity * width).ok()?,
                    capacity,
                    valid: 0,
                })
            })
            .flatten();
        CudaAct {
            width,
            max_tokens,
            data: device
                .alloc_zeros(max_tokens * width)
                .map_err(|e| e.to_string()),
            q8,
        }
    }

    /// The first `tokens` rows and where their Q8_K codes go, when this buffer keeps codes
    /// for that many rows (`None`: a prompt, or no codes kept). The codes count as valid from
    /// here on: the caller writes both.
    pub(super) fn rows_mut_quantized(
        &mut self,
        tokens: usize,
    ) -> Result<(CudaViewMut<'_, f32>, Option<Q8RowsMut<'_>>)> {
        self.check(tokens)?;
        let quantizes = self.quantizes(tokens);
        let width = self.width;
        let data = match &mut self.data {
            Ok(d) => d.slice_mut(..tokens * width),
            Err(msg) => {
                return Err(EngineError::Cuda(format!(
                    "activation buffer of {} x {width} was not allocated: {msg}",
                    self.max_tokens
                )))
            }
        };
        let q8 = self
            .q8
            .as_mut()
            .filter(|_| quantizes)
            .map(|side| Q8RowsMut {
                scales: side.scales.slice_mut(..tokens * width / Q8_BLOCK_VALUES),
                codes: side.codes.slice_mut(..tokens * width),
            });
        Ok((data, q8))
    }

    /// Whether a norm of `tokens` rows into this buffer also quantizes them: what
    /// `rows_mut_quantized` will hand out, and what a replayed graph did when it recorded
    /// the norm (whose codes count as valid then too).
    pub(super) fn quantizes(&mut self, tokens: usize) -> bool {
        match &mut self.q8 {
            Some(side) if tokens <= side.capacity => {
                side.valid = tokens;
                true
            }
            Some(side) => {
                side.valid = 0;
                false
            }
            None => false,
        }
    }

    /// The Q8_K codes of rows `first..last` when the last write of those rows was a norm
    /// that also quantized them; `None` otherwise (the q8 products quantize the rows).
    pub(super) fn q8_range(&self, first: usize, last: usize) -> Option<Q8Rows<'_>> {
        let side = self.q8.as_ref()?;
        if first >= last || last > side.valid {
            return None;
        }
        let blocks = self.width / Q8_BLOCK_VALUES;
        Some(Q8Rows {
            scales: side.scales.slice(first * blocks..last * blocks),
            codes: side.codes.slice(first * self.width..last * self.width),
        })
    }

    /// Anything but a quantizing norm is about to write the rows: their codes are stale.
    fn forget_codes(&mut self) {
        if let Some(side) = &mut self.q8 {
            side.valid = 0;
        }
    }

    fn check(&self, tokens: usize) -> Result<()> {
        if tokens > self.max_tokens {
            return Err(EngineError::BadConfig(format!(
                "a batch of {tokens} tokens exceeds the activation buffer of {}",
                self.max_tokens
            )));
        }
        Ok(())
    }

    /// The device address of the buffer (identity of a recorded decode step).
    pub(super) fn address(&self, device: &Device) -> Result<u64> {
        match &self.data {
            Ok(d) => Ok(device.address(d)),
            Err(msg) => Err(self.unallocated(msg)),
        }
    }

    fn unallocated(&self, msg: &str) -> EngineError {
        EngineError::Cuda(format!(
            "activation buffer of {} x {} was not allocated: {msg}",
            self.max_tokens, self.width
        ))
    }

    /// The first `tokens` rows.
    pub(super) fn rows(&self, tokens: usize) -> Result<CudaView<'_, f32>> {
        self.check(tokens)?;
        match &self.data {
            Ok(d) => Ok(d.slice(..tokens * self.width)),
            Err(msg) => Err(self.unallocated(msg)),
        }
    }

    /// Rows `first..last`.
    pub(super) fn row_range(&self, first: usize, last: usize) -> Result<CudaView<'_, f32>> {
        self.check(last)?;
        match &self.data {
            Ok(d) => Ok(d.slice(first * self.width..last * self.width)),
            Err(msg) => Err(self.unallocated(msg)),
        }
    }

    /// Rows `first..last`, writable.
    pub(super) fn row_range_mut(
        &mut self,
        first: usize,
        last: usize,
    ) -> Result<CudaViewMut<'_, f32>> {
        self.check(last)?;
        self.forget_codes();
        let width = self.width;
        match &mut self.data {
            Ok(d) => Ok(d.slice_mut(first * width..last * width)),
            Err(msg) => Err(EngineError::Cuda(format!(
                "activation buffer of {} x {width} was not allocated: {msg}",
                self.max_tokens
            ))),
        }
    }

    pub(super) fn rows_mut(&mut self, tokens: usize) -> Result<CudaViewMut<'_, f32>> {
        self.check(tokens)?;
        self.forget_codes();
        let width = self.width;
        match &mut self.data {
            Ok(d) => Ok(d.slice_mut(..tokens * width)),
            Err(msg) => Err(EngineError::Cuda(format!(
                "activation buffer of {} x {width} was not allocated: {msg}",
                self.max_tokens
            ))),
        }
    }
}

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
}

/// What `checkpoint` arms: the next forward call keeps, per DeltaNet layer, the state after
/// each of its rows but the last (device buffers, allocated for every layer by the first
/// layer's call, before anything is recorded, and reused), so `rollback_to` can keep any
/// prefix of the batch without running it again.
#[derive(Default)]
struct Recording {
    armed: bool,
    /// Position before the recorded call; `None` until a call was recorded.
    pos0: Option<usize>,
    /// Rows of the recorded call.
    rows: usize,
    /// Per DeltaNet layer (slot order).
    states: Vec<RecordedRows>,
}

/// The states a recording call keeps for one DeltaNet layer, the state after row `i` at
/// row `i` of each buffer.
pub struct RecordedRows {
    /// Rows the buffers hold.
    pub rows: usize,
    /// `[rows][kernel - 1][channels]`.
    pub conv: CudaSlice<f32>,
    /// `[rows][v_head][key_dim][value_dim]`.
    pub recurrent: CudaSlice<f32>,
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
        }
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
            let short = self.recording.states.len() < layers
                || self.recording.states.iter().any(|r| r.rows < rows);
            if short {
                // Graphs recorded with the old buffers may not replay (and a new buffer may
                // reuse an old one's address, which the graphs' keys would not tell apart).
                graph::lock(&self.graphs)?.forget_recorded()?;
                self.recording.states.clear();
                for d in &buffers.deltanet {
                    self.recording.states.push(RecordedRows {
                        rows,
                        conv: device.alloc_zeros(rows * d.conv.len())?,
                        recurrent: device.alloc_zeros(rows * d.recurrent.len())?,
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
        let finished = graph::lock(&self.graphs).and_then(|mut g| g.finish());
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

    /// Copies the recorded state after row `kept - 1` back, within device memory.
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
        for (d, saved) in buffers.deltanet.iter_mut().zip(&self.recording.states) {
            if saved.rows < kept {
                return Err(EngineError::BadConfig(format!(
                    "no recorded state after row {}",
                    kept - 1
                )));
            }
            let row = kept - 1;
            let (conv, recurrent) = (d.conv.len(), d.recurrent.len());
            copy_state(
                &device,
                &saved.conv.slice(row * conv..(row + 1) * conv),
                &mut d.conv,
            )?;
            copy_state(
                &device,
                &saved
                    .recurrent
                    .slice(row * recurrent..(row + 1) * recurrent),
                &mut d.recurrent,
            )?;
        }
        self.pos = pos0 + kept;
        Ok(())
    }
}

/// Device-to-device copy of one buffer into another of the same length (queued).
fn copy_state(device: &Device, src: &CudaView<'_, f32>, dst: &mut CudaSlice<f32>) -> Result<()> {
    device
        .stream()
        .memcpy_dtod(src, dst)
        .map_err(|e| EngineError::Cuda(format!("state checkpoint copy: {e}")))
}

/// A sequence's DeltaNet state (conv window, recurrent matrices per layer) and position,
/// kept on the host.
pub struct CudaSnapshot {
    pos: usize,
    deltanet: Vec<(Vec<f32>, Vec<f32>)>,
}
