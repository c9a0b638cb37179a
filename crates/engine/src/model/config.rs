//! `HybridConfig`: every hyperparameter of a qwen3next model, read and validated in one
//! place, and written back by the synthetic-model writer.

use redlite_gguf::{Metadata, Value};

use crate::error::{EngineError, Result};

pub const ARCH: &str = "qwen3next";
/// Files without `full_attention_interval` use this (llama.cpp's default for qwen3next).
pub const DEFAULT_FULL_ATTENTION_INTERVAL: usize = 4;

/// What a layer's mixer is.
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize)]
pub enum LayerKind {
    /// Gated DeltaNet (linear attention with a recurrent state).
    DeltaNet,
    /// Gated full attention with a KV cache.
    Attention,
}

/// How a DeltaNet layer's input projection is stored.
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize)]
pub enum DeltaNetLayout {
    /// `attn_qkv` (q | k | v rows) + `attn_gate` (z rows): files converted since early 2026.
    Split,
    /// One `ssm_in` with rows grouped per key head `[q k v v z z]`: older files.
    Legacy,
}

/// The hyperparameters of a qwen3next model. Field comments give the 80B-A3B value.
#[derive(Clone, Debug, PartialEq, serde::Serialize)]
pub struct HybridConfig {
    /// Main-stack layers, without MTP blocks (48).
    pub n_layer: usize,
    /// MTP blocks stored after the main stack (0 or 1).
    pub n_mtp: usize,
    /// Hidden size (2048).
    pub n_embd: usize,
    /// Vocabulary size (151,936).
    pub n_vocab: usize,
    /// Trained context length (262,144).
    pub context_length: usize,
    /// Dense FFN width, unused by this architecture (5,120).
    pub feed_forward_length: usize,
    /// Attention query heads (16).
    pub n_head: usize,
    /// Attention KV heads (2).
    pub n_head_kv: usize,
    /// Attention head dimension (256).
    pub head_dim: usize,
    /// Leading dims of each head that RoPE rotates (64).
    pub rope_dim: usize,
    /// RoPE base (1e7; 5e6 in some files: always read).
    pub rope_base: f32,
    /// RMSNorm and L2-norm epsilon (1e-6).
    pub rms_eps: f32,
    /// Routed experts (512).
    pub n_expert: usize,
    /// Experts per token (10).
    pub n_expert_used: usize,
    /// Routed expert width (512).
    pub expert_ff: usize,
    /// Shared expert width (512).
    pub shared_ff: usize,
    /// Causal conv kernel (4).
    pub conv_kernel: usize,
    /// DeltaNet key and value head dimension (128).
    pub ssm_head_dim: usize,
    /// DeltaNet q/k heads (16).
    pub ssm_k_heads: usize,
    /// DeltaNet v heads (32).
    pub ssm_v_heads: usize,
    /// Every `interval`-th layer is attention (4).
    pub full_attention_interval: usize,
    /// Kind of each main-stack layer.
    pub layers: Vec<LayerKind>,
    /// DeltaNet input-projection layout.
    pub layout: DeltaNetLayout,
}

fn key(name: &str) -> String {
    format!("{ARCH}.{name}")
}

impl HybridConfig {
    /// Width of the DeltaNet value projection (4,096).
    pub fn ssm_inner(&self) -> usize {
        self.ssm_v_heads * self.ssm_head_dim
    }

    /// Channels of the causal conv: q, k and v (8,192).
    pub fn conv_channels(&self) -> usize {
        2 * self.ssm_k_heads * self.ssm_head_dim + self.ssm_inner()
    }

    pub fn attention_layers(&self) -> usize {
        self.layers
            .iter()
            .filter(|k| **k == LayerKind::Attention)
            .count()
    }

    pub fn deltanet_layers(&self) -> usize {
        self.layers.len() - self.attention_layers()
    }

    /// The default pattern: layer i is attention iff (i + 1) % interval == 0.
    pub fn default_layers(n_layer: usize, interval: usize) -> Vec<LayerKind> {
        (0..n_layer)
            .map(|i| {
                if interval > 0 && (i + 1) % interval == 0 {
                    LayerKind::Attention
                } else {
                    LayerKind::DeltaNet
                }
            })
            .collect()
    }

    /// KV-cache bytes per position over all attention layers (K and V).
    pub fn kv_bytes_per_position(&self, bytes_per_value: usize) -> u64 {
        (self.attention_layers() * 2 * self.n_head_kv * self.head_dim * bytes_per_value) as u64
    }

    /// f32 DeltaNet state of one sequence: recurrent matrices plus the conv window.
    pub fn deltanet_state_bytes(&self) -> u64 {
        let recurrent = self.ssm_v_heads * self.ssm_head_dim * self.ssm_head_dim;
        let conv = (self.conv_kernel - 1) * self.conv_channels();
        (self.deltanet_layers() * (recurrent + conv) * 4) as u64
    }

    /// Reads and validates the hyperparameters. `has_legacy_ssm_in` says which DeltaNet
    /// layout the tensors use (the metadata does not record it).
    pub fn from_metadata(
        md: &Metadata,
        n_vocab: usize,
        layout: DeltaNetLayout,
    ) -> Result<HybridConfig> {
        let arch = md.str("general.architecture")?;
        if arch != ARCH {
            return Err(EngineError::UnsupportedArchitecture {
                found: arch.to_string(),
            });
        }
        let usize_key = |name: &str| -> Result<usize> { Ok(md.u64(&key(name))? as usize) };
        let block_count = usize_key("block_count")?;
        let n_mtp = md.opt_u64(&key("nextn_predict_layers"))?.unwrap_or(0) as usize;
        if n_mtp > 1 || n_mtp >= block_count {
            return Err(EngineError::BadConfig(format!(
                "{} is {n_mtp} with block_count {block_count}; at most one MTP block is supported",
                key("nextn_predict_layers")
            )));
        }
        let n_layer = block_count - n_mtp;
        let interval = md
            .opt_u64(&key("full_attention_interval"))?
            .map_or(DEFAULT_FULL_ATTENTION_INTERVAL, |v| v as usize);
        let layers = match md.get(&key("attention.recurrent_layers")) {
            None => HybridConfig::default_layers(n_layer, interval),
            Some(v) => recurrent_array(v, block_count, n_layer)?,
        };
        let ssm_head_dim = usize_key("ssm.state_size")?;
        let ssm_v_heads = usize_key("ssm.time_step_rank")?;
        let config = HybridConfig {
            n_layer,
            n_mtp,
            n_embd: usize_key("embedding_length")?,
            n_vocab,
            context_length: usize_key("context_length")?,
            feed_forward_length: md.opt_u64(&key("feed_forward_length"))?.unwrap_or(0) as usize,
            n_head: usize_key("attention.head_count")?,
            n_head_kv: usize_key("attention.head_count_kv")?,
            head_dim: usize_key("attention.key_length")?,
            rope_dim: usize_key("rope.dimension_count")?,
            rope_base: md.f64(&key("rope.freq_base"))? as f32,
            rms_eps: md.f64(&key("attention.layer_norm_rms_epsilon"))? as f32,
            n_expert: usize_key("expert_count")?,
            n_expert_used: usize_key("expert_used_count")?,
            expert_ff: usize_key("expert_feed_forward_length")?,
            shared_ff: usize_key("expert_shared_feed_forward_length")?,
            conv_kernel: usize_key("ssm.conv_kernel")?,
            ssm_head_dim,
            ssm_k_heads: usize_key("ssm.group_count")?,
            ssm_v_heads,
            full_attention_interval: interval,
            layers,
            layout,
        };
        let value_length = usize_key("attention.value_length")?;
        let inner = usize_key("ssm.inner_size")?;
        config.validate(value_length, inner)?;
        Ok(config)
    }

    fn validate(&self, value_length: usize, inner: usize) -> Result<()> {
        let bad = |what: String| Err(EngineError::BadConfig(what));
        if value_length != self.head_dim {
            return bad(format!(
                "attention.value_length {value_length} differs from key_length {}",
                self.head_dim
            ));
        }
        if inner != self.ssm_inner() {
            return bad(format!(
                "ssm.inner_size is {inner}, expected time_step_rank {} x state_size {} = {}",
                self.ssm_v_heads,
                self.ssm_head_dim,
                self.ssm_inner()
            ));
        }
        let positive = [
            ("block_count", self.n_layer),
            ("embedding_length", self.n_embd),
            ("attention.head_count", self.n_head),
            ("attention.head_count_kv", self.n_head_kv),
            ("attention.key_length", self.head_dim),
            ("expert_count", self.n_expert),
            ("expert_used_count", self.n_expert_used),
            ("ssm.conv_kernel", self.conv_kernel),
            ("ssm.state_size", self.ssm_head_dim),
            ("ssm.group_count", self.ssm_k_heads),
            ("ssm.time_step_rank", self.ssm_v_heads),
        ];
        for (name, v) in positive {
            if v == 0 {
                return bad(format!("{} is 0", key(name)));
            }
        }
        if !self.n_head.is_multiple_of(self.n_head_kv) {
            return bad(format!(
                "head_count {} is not a multiple of head_count_kv {}",
                self.n_head, self.n_head_kv
            ));
        }
        if !self.ssm_v_heads.is_multiple_of(self.ssm_k_heads) {
            return bad(format!(
                "ssm.time_step_rank {} is not a multiple of ssm.group_count {}",
                self.ssm_v_heads, self.ssm_k_heads
            ));
        }
        if self.n_expert_used > self.n_expert {
            return bad(format!(
                "expert_used_count {} exceeds expert_count {}",
                self.n_expert_used, self.n_expert
            ));
        }
        if self.rope_dim > self.head_dim || !self.rope_dim.is_multiple_of(2) {
            return bad(format!(
                "rope.dimension_count {} must be even and at most the head dim {}",
                self.rope_dim, self.head_dim
            ));
        }
        Ok(())
    }

    /// The `qwen3next.*` keys of this config, as the llama.cpp converter writes them.
    /// `with_layer_array` adds `attention.recurrent_layers` (newer converters write it).
    pub fn write_metadata(&self, md: &mut Metadata, with_layer_array: bool) {
        let u32v = |v: usize| Value::U32(v as u32);
        md.set(key("block_count"), u32v(self.n_layer + self.n_mtp));
        md.set(key("context_length"), u32v(self.context_length));
        md.set(key("embedding_length"), u32v(self.n_embd));
        md.set(key("feed_forward_length"), u32v(self.feed_forward_length));
        md.set(key("attention.head_count"), u32v(self.n_head));
        md.set(key("attention.head_count_kv"), u32v(self.n_head_kv));
        md.set(key("rope.freq_base"), Value::F32(self.rope_base));
        md.set(
            key("attention.layer_norm_rms_epsilon"),
            Value::F32(self.rms_eps),
        );
        md.set(key("expert_used_count"), u32v(self.n_expert_used));
        md.set(key("attention.key_length"), u32v(self.head_dim));
        md.set(key("attention.value_length"), u32v(self.head_dim));
        md.set(key("expert_count"), u32v(self.n_expert));
        md.set(key("expert_feed_forward_length"), u32v(self.expert_ff));
        md.set(
            key("expert_shared_feed_forward_length"),
            u32v(self.shared_ff),
        );
        md.set(key("ssm.conv_kernel"), u32v(self.conv_kernel));
        md.set(key("ssm.state_size"), u32v(self.ssm_head_dim));
        md.set(key("ssm.group_count"), u32v(self.ssm_k_heads));
        md.set(key("ssm.time_step_rank"), u32v(self.ssm_v_heads));
        md.set(key("ssm.inner_size"), u32v(self.ssm_inner()));
        md.set(
            key("full_attention_interval"),
            u32v(self.full_attention_interval),
        );
        md.set(key("rope.dimension_count"), u32v(self.rope_dim));
        if with_layer_array {
            let mut recurrent: Vec<bool> = self
                .layers
                .iter()
                .map(|k| *k == LayerKind::DeltaNet)
                .collect();
            recurrent.extend(std::iter::repeat_n(false, self.n_mtp));
            md.set(key("attention.recurrent_layers"), Value::bools(recurrent));
        }
        if self.n_mtp > 0 {
            md.set(key("nextn_predict_layers"), u32v(self.n_mtp));
        }
    }
}

/// `attention.recurrent_layers`: one bool per block, `true` = DeltaNet; MTP blocks must be false.
fn recurrent_array(v: &Value, block_count: usize, n_layer: usize) -> Result<Vec<LayerKind>> {
    let name = key("attention.recurrent_layers");
    let items = v.as_array().ok_or_else(|| {
        EngineError::BadConfig(format!(
            "{name} is {}, expected an array of bools",
            v.describe()
        ))
    })?;
    if items.len() != block_count {
        return Err(EngineError::BadConfig(format!(
            "{name} has {} entries, block_count is {block_count}",
            items.len()
        )));
    }
    let mut kinds = Vec::with_capacity(n_layer);
    for (i, item) in items.iter().enumerate() {
        let recurrent = item
            .as_bool()
            .or_else(|| item.as_u64().map(|x| x != 0))
            .ok_or_else(|| {
                EngineError::BadConfig(format!(
                    "{name}[{i}] is {}, expected a bool",
                    item.describe()
                ))
            })?;
        if i >= n_layer {
            if recurrent {
                return Err(EngineError::BadConfig(format!(
                    "{name}[{i}] marks an MTP block as recurrent"
                )));
            }
            continue;
        }
        kinds.push(if recurrent {
            LayerKind::DeltaNet
        } else {
            LayerKind::Attention
        });
    }
    Ok(kinds)
}
