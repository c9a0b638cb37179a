//! Per-sequence state: the KV cache of every attention layer (f32 or f16) and the conv and
//! recurrent state of every DeltaNet layer. Sized once for a context length.

use half::f16;

use crate::error::{EngineError, Result};
use crate::model::config::{HybridConfig, LayerKind};

/// Element type of the KV cache.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum KvType {
    F32,
    F16,
}

impl KvType {
    pub fn parse(s: &str) -> Option<KvType> {
        match s {
            "f32" => Some(KvType::F32),
            "f16" => Some(KvType::F16),
            _ => None,
        }
    }
}

#[derive(Clone, Debug)]
enum KvData {
    F32(Vec<f32>),
    F16(Vec<f16>),
}

impl KvData {
    fn new(ty: KvType, len: usize) -> KvData {
        match ty {
            KvType::F32 => KvData::F32(vec![0.0; len]),
            KvType::F16 => KvData::F16(vec![f16::ZERO; len]),
        }
    }

    fn write(&mut self, at: usize, values: &[f32]) {
        match self {
            KvData::F32(d) => d[at..at + values.len()].copy_from_slice(values),
            KvData::F16(d) => d[at..at + values.len()]
                .iter_mut()
                .zip(values)
                .for_each(|(o, v)| *o = f16::from_f32(*v)),
        }
    }

    fn read(&self, at: usize, out: &mut [f32]) {
        let n = out.len();
        match self {
            KvData::F32(d) => out.copy_from_slice(&d[at..at + n]),
            KvData::F16(d) => out
                .iter_mut()
                .zip(&d[at..at + n])
                .for_each(|(o, v)| *o = v.to_f32()),
        }
    }
}

/// Keys and values of one attention layer: `[position][kv_head][head_dim]`.
#[derive(Clone, Debug)]
pub struct KvCache {
    /// Values per position (`n_head_kv * head_dim`).
    pub width: usize,
    k: KvData,
    v: KvData,
}

impl KvCache {
    pub fn write(&mut self, pos: usize, k: &[f32], v: &[f32]) {
        self.k.write(pos * self.width, k);
        self.v.write(pos * self.width, v);
    }

    /// Reads `out.len()` key values starting at `(pos, offset)`.
    pub fn read_k(&self, pos: usize, offset: usize, out: &mut [f32]) {
        self.k.read(pos * self.width + offset, out);
    }

    pub fn read_v(&self, pos: usize, offset: usize, out: &mut [f32]) {
        self.v.read(pos * self.width + offset, out);
    }

    /// Positions the cache holds.
    pub fn capacity(&self) -> usize {
        let len = match &self.k {
            KvData::F32(d) => d.len(),
            KvData::F16(d) => d.len(),
        };
        len / self.width.max(1)
    }
}

/// Conv window and recurrent matrices of one DeltaNet layer.
#[derive(Clone, Debug, PartialEq)]
pub struct DeltaNetState {
    /// The last `kernel - 1` raw conv inputs, oldest first: `[kernel - 1][channels]`.
    pub conv: Vec<f32>,
    /// `S[v_head][key_dim][value_dim]`.
    pub recurrent: Vec<f32>,
}

/// What `snapshot` keeps: the DeltaNet state and the position. KV entries past the position
/// are simply overwritten later, so restoring truncates the attention cache too.
#[derive(Clone, Debug, PartialEq)]
pub struct Snapshot {
    pub pos: usize,
    pub deltanet: Vec<DeltaNetState>,
}

/// The state of one sequence.
#[derive(Clone, Debug)]
pub struct SequenceState {
    /// Tokens processed so far (the next token's position).
    pub pos: usize,
    /// Positions the KV cache holds.
    pub capacity: usize,
    pub kv_type: KvType,
    /// For each layer, its index into `kv` or `deltanet`.
    slot: Vec<usize>,
    pub kv: Vec<KvCache>,
    pub deltanet: Vec<DeltaNetState>,
    /// Speculative decoding: the rows of a verification batch, recorded per DeltaNet layer.
    recording: Recording,
}

/// What `checkpoint` arms: the next forward call keeps, per DeltaNet layer, the state after
/// each of its rows but the last, so `rollback_to` can keep any prefix of the batch
/// without running it again.
#[derive(Clone, Debug, Default)]
struct Recording {
    /// The next forward call records.
    armed: bool,
    /// Position before the recorded call; `None` until a call was recorded.
    pos0: Option<usize>,
    /// Per DeltaNet layer (slot order), the state after row `i` at index `i`.
    rows: Vec<Vec<DeltaNetState>>,
}

impl SequenceState {
    pub fn new(config: &HybridConfig, capacity: usize, kv_type: KvType) -> SequenceState {
        let width = config.n_head_kv * config.head_dim;
        let mut slot = Vec::with_capacity(config.layers.len());
        let (mut kv, mut deltanet) = (Vec::new(), Vec::new());
        for kind in &config.layers {
            match kind {
                LayerKind::Attention => {
                    slot.push(kv.len());
                    kv.push(KvCache {
                        width,
                        k: KvData::new(kv_type, capacity * width),
                        v: KvData::new(kv_type, capacity * width),
                    });
                }
                LayerKind::DeltaNet => {
                    slot.push(deltanet.len());
                    deltanet.push(DeltaNetState {
                        conv: vec![0.0; (config.conv_kernel - 1) * config.conv_channels()],
                        recurrent: vec![
                            0.0;
                            config.ssm_v_heads
                                * config.ssm_head_dim
                                * config.ssm_head_dim
                        ],
                    });
                }
            }
        }
        SequenceState {
            pos: 0,
            capacity,
            kv_type,
            slot,
            kv,
            deltanet,
            recording: Recording::default(),
        }
    }

    /// The state of the MTP block alone: the KV cache of its attention layer (layer
    /// `n_layer`); no DeltaNet state.
    pub fn new_mtp(config: &HybridConfig, capacity: usize, kv_type: KvType) -> SequenceState {
        let width = config.n_head_kv * config.head_dim;
        let mut slot = vec![usize::MAX; config.n_layer];
        slot.push(0);
        SequenceState {
            pos: 0,
            capacity,
            kv_type,
            slot,
            kv: vec![KvCache {
                width,
                k: KvData::new(kv_type, capacity * width),
                v: KvData::new(kv_type, capacity * width),
            }],
            deltanet: Vec::new(),
            recording: Recording::default(),
        }
    }

    /// The KV cache of attention layer `layer`.
    pub fn kv_mut(&mut self, layer: usize) -> &mut KvCache {
        &mut self.kv[self.slot[layer]]
    }

    /// The state of DeltaNet layer `layer`.
    pub fn deltanet_mut(&mut self, layer: usize) -> &mut DeltaNetState {
        &mut self.deltanet[self.slot[layer]]
    }

    /// Refuses a batch that would run past the cache.
    pub fn check_room(&self, tokens: usize) -> Result<()> {
        if self.pos + tokens > self.capacity {
            return Err(EngineError::ContextFull {
                needed: self.pos + tokens,
                capacity: self.capacity,
            });
        }
        Ok(())
    }

    /// Back to an empty sequence.
    pub fn reset(&mut self) {
        self.pos = 0;
        self.recording.armed = false;
        self.recording.pos0 = None;
        for d in &mut self.deltanet {
            d.conv.iter_mut().for_each(|v| *v = 0.0);
            d.recurrent.iter_mut().for_each(|v| *v = 0.0);
        }
    }

    pub fn snapshot(&self) -> Snapshot {
        Snapshot {
            pos: self.pos,
            deltanet: self.deltanet.clone(),
        }
    }

    pub fn restore(&mut self, snapshot: &Snapshot) {
        self.pos = snapshot.pos;
        self.recording.pos0 = None;
        self.deltanet.clone_from(&snapshot.deltanet);
    }

    /// The next forward call records the DeltaNet state after each of its rows (see
    /// `rollback_to`).
    pub fn checkpoint(&mut self) {
        self.recording.armed = true;
        self.recording.pos0 = Some(self.pos);
        let layers = self.deltanet.len();
        self.recording.rows.resize_with(layers, Vec::new);
        self.recording.rows.iter_mut().for_each(Vec::clear);
    }

    /// The state of DeltaNet layer `layer`, and where to record its rows when the current
    /// forward call records.
    pub fn deltanet_recording(
        &mut self,
        layer: usize,
    ) -> (&mut DeltaNetState, Option<&mut Vec<DeltaNetState>>) {
        let slot = self.slot[layer];
        let rows = if self.recording.armed {
            self.recording.rows.get_mut(slot)
        } else {
            None
        };
        (&mut self.deltanet[slot], rows)
    }

    /// After a recorded forward call: the state after its first `kept` rows (at least one,
    /// fewer than the call's rows). KV entries past the position are overwritten later.
    pub fn rollback_to(&mut self, kept: usize) -> Result<()> {
        let pos0 = self.recording.pos0.ok_or_else(|| {
            EngineError::BadConfig("rollback without a recorded verification batch".into())
        })?;
        for (state, rows) in self.deltanet.iter_mut().zip(&self.recording.rows) {
            let saved = kept
                .checked_sub(1)
                .and_then(|i| rows.get(i))
                .ok_or_else(|| {
                    EngineError::BadConfig(format!(
                        "rollback to {kept} rows of a batch that recorded {}",
                        rows.len()
                    ))
                })?;
            state.conv.copy_from_slice(&saved.conv);
            state.recurrent.copy_from_slice(&saved.recurrent);
        }
        self.pos = pos0 + kept;
        Ok(())
    }

    /// The end of a forward call: the position moves on and a recording stops.
    pub fn advance_to(&mut self, pos: usize) {
        self.pos = pos;
        self.recording.armed = false;
    }
}
