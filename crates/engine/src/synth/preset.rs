//! Model shapes for synthetic files: the real 80B-A3B, and small test shapes.

use crate::model::config::{DeltaNetLayout, HybridConfig};

/// Named starting points; any dimension can then be overridden.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Preset {
    /// Qwen3-Next-80B-A3B exactly (48 layers, 512 experts, vocabulary 151,936).
    Full,
    /// A tiny model whose every row length is a multiple of 256, so every block type applies.
    Tiny,
}

impl Preset {
    pub fn parse(name: &str) -> Option<Preset> {
        match name {
            "full" | "80b" | "80b-a3b" => Some(Preset::Full),
            "tiny" => Some(Preset::Tiny),
            _ => None,
        }
    }

    pub fn config(self) -> HybridConfig {
        match self {
            Preset::Full => HybridConfig {
                n_layer: 48,
                n_mtp: 0,
                n_embd: 2048,
                n_vocab: 151_936,
                context_length: 262_144,
                feed_forward_length: 5120,
                n_head: 16,
                n_head_kv: 2,
                head_dim: 256,
                rope_dim: 64,
                rope_base: 1.0e7,
                rms_eps: 1e-6,
                n_expert: 512,
                n_expert_used: 10,
                expert_ff: 512,
                shared_ff: 512,
                conv_kernel: 4,
                ssm_head_dim: 128,
                ssm_k_heads: 16,
                ssm_v_heads: 32,
                full_attention_interval: 4,
                layers: HybridConfig::default_layers(48, 4),
                layout: DeltaNetLayout::Split,
            },
            Preset::Tiny => HybridConfig {
                n_layer: 4,
                n_mtp: 0,
                n_embd: 256,
                n_vocab: 1024,
                context_length: 4096,
                feed_forward_length: 512,
                n_head: 4,
                n_head_kv: 2,
                head_dim: 64,
                rope_dim: 16,
                rope_base: 1.0e7,
                rms_eps: 1e-6,
                n_expert: 16,
                n_expert_used: 4,
                expert_ff: 256,
                shared_ff: 256,
                conv_kernel: 4,
                ssm_head_dim: 32,
                ssm_k_heads: 4,
                ssm_v_heads: 8,
                full_attention_interval: 4,
                layers: HybridConfig::default_layers(4, 4),
                layout: DeltaNetLayout::Split,
            },
        }
    }
}
