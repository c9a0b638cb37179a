//! The weights of a qwen3next model, organised per layer, generic over how a backend holds
//! a matrix (`M`: kept in its block format, in host or device memory) and a small vector
//! (`V`: norms, gates, conv taps decoded to f32). Every backend loads the same tensors by
//! the same names through [`load_weights`].

use crate::error::{EngineError, Result};
use crate::model::config::{DeltaNetLayout, HybridConfig, LayerKind};

pub struct DeltaNetWeights<M, V> {
    /// `attn_qkv` (split layout) or `ssm_in` (legacy: q k v z grouped per key head).
    pub in_proj: M,
    /// `attn_gate` (split layout only).
    pub gate_proj: Option<M>,
    pub ba: M,
    /// `[channels][kernel]`, tap `kernel - 1` multiplies the current token.
    pub conv: V,
    pub dt_bias: V,
    /// `-exp(A_log)` per v-head.
    pub a: V,
    pub norm: V,
    pub out: M,
}

pub struct AttentionWeights<M, V> {
    /// Per head: `head_dim` query rows then `head_dim` gate rows.
    pub q: M,
    pub k: M,
    pub v: M,
    pub out: M,
    pub q_norm: V,
    pub k_norm: V,
}

pub struct MoeWeights<M> {
    /// `[n_expert][n_embd]`, F32 in every known file.
    pub router: M,
    /// Stacks `[n_expert][expert_ff][n_embd]` (gate, up) and `[n_expert][n_embd][expert_ff]`.
    pub gate_exps: M,
    pub up_exps: M,
    pub down_exps: M,
    /// The shared expert's scalar gate: one row of `n_embd`.
    pub shared_gate_inp: M,
    pub shared_gate: M,
    pub shared_up: M,
    pub shared_down: M,
}

pub enum Mixer<M, V> {
    DeltaNet(DeltaNetWeights<M, V>),
    Attention(AttentionWeights<M, V>),
}

pub struct LayerWeights<M, V> {
    pub attn_norm: V,
    pub post_norm: V,
    pub mixer: Mixer<M, V>,
    pub moe: MoeWeights<M>,
}

/// The MTP block (spec §4): the projection of `[embedding ; hidden]`, its norms, and one
/// full-attention decoder layer with MoE, stored as block `n_layer`.
pub struct MtpWeights<M, V> {
    /// `nextn.eh_proj`: `[n_embd][2 * n_embd]`, the embedding half first.
    pub eh_proj: M,
    /// `nextn.enorm`: RMSNorm of the token embedding.
    pub enorm: V,
    /// `nextn.hnorm`: RMSNorm of the trunk's (final-normed) hidden state.
    pub hnorm: V,
    /// `nextn.shared_head_norm`: RMSNorm before the LM head.
    pub head_norm: V,
    /// The block's decoder layer (its mixer is always attention).
    pub layer: LayerWeights<M, V>,
    /// `nextn.embed_tokens`, when the file has its own; else the trunk's `token_embd`.
    pub embed: Option<M>,
    /// `nextn.shared_head_head`, when the file has its own; else the trunk's `output`.
    pub head: Option<M>,
}

pub struct ModelWeights<M, V> {
    pub token_embd: M,
    pub layers: Vec<LayerWeights<M, V>>,
    pub output_norm: V,
    /// `output.weight`, or the embedding when the file ties them.
    pub output: M,
    /// The MTP block, when the file has one and the caller asked for it.
    pub mtp: Option<MtpWeights<M, V>>,
}

impl<M, V> ModelWeights<M, V> {
    /// Layer `i`: a main-stack layer, or (`i == n_layer`) the MTP block's decoder layer.
    pub fn layer(&self, i: usize) -> Result<&LayerWeights<M, V>> {
        if let Some(layer) = self.layers.get(i) {
            return Ok(layer);
        }
        match &self.mtp {
            Some(mtp) if i == self.layers.len() => Ok(&mtp.layer),
            _ => Err(EngineError::BadConfig(format!(
                "layer {i} does not exist (the main stack has {} layers{})",
                self.layers.len(),
                if self.mtp.is_some() {
                    " and the MTP block"
                } else {
                    ", no MTP block loaded"
                }
            ))),
        }
    }

    /// The MTP block, or the error that says it was not loaded.
    pub fn mtp(&self) -> Result<&MtpWeights<M, V>> {
        self.mtp.as_ref().ok_or(EngineError::NoMtpBlock)
    }

    /// The LM head the MTP block uses.
    pub fn mtp_head(&self) -> Result<&M> {
        Ok(self.mtp()?.head.as_ref().unwrap_or(&self.output))
    }

    /// The embedding table the MTP block uses.
    pub fn mtp_embed(&self) -> Result<&M> {
        Ok(self.mtp()?.embed.as_ref().unwrap_or(&self.token_embd))
    }
}

/// Loads every main-stack weight the config implies (the MTP block is loaded on request,
/// by [`load_mtp`]). `matrix` and `vector` load one tensor by name; `has` says whether a
/// tensor exists (for the optional `output.weight`).
pub fn load_weights<M, V>(
    config: &HybridConfig,
    matrix: &dyn Fn(&str) -> Result<M>,
    vector: &dyn Fn(&str) -> Result<V>,
    has: &dyn Fn(&str) -> bool,
) -> Result<ModelWeights<M, V>> {
    let mut layers = Vec::with_capacity(config.n_layer);
    for (i, kind) in config.layers.iter().enumerate() {
        layers.push(load_layer(config, i, *kind, matrix, vector)?);
    }
    let output_name = if has("output.weight") {
        "output.weight"
    } else {
        "token_embd.weight"
    };
    Ok(ModelWeights {
        token_embd: matrix("token_embd.weight")?,
        output_norm: vector("output_norm.weight")?,
        output: matrix(output_name)?,
        layers,
        mtp: None,
    })
}

/// The MTP block, stored as llama.cpp's converter writes it: block `n_layer`, with
/// optional `nextn.embed_tokens` / `nextn.shared_head_head` (else the trunk's tables).
/// Refused when the file has no MTP block.
pub fn load_mtp<M, V>(
    config: &HybridConfig,
    matrix: &dyn Fn(&str) -> Result<M>,
    vector: &dyn Fn(&str) -> Result<V>,
    has: &dyn Fn(&str) -> bool,
) -> Result<MtpWeights<M, V>> {
    if config.n_mtp == 0 {
        return Err(EngineError::NoMtpBlock);
    }
    let i = config.n_layer;
    let name = |s: &str| format!("blk.{i}.nextn.{s}");
    let optional = |s: &str| -> Result<Option<M>> {
        let n = name(s);
        if has(&n) {
            Ok(Some(matrix(&n)?))
        } else {
            Ok(None)
        }
    };
    Ok(MtpWeights {
        eh_proj: matrix(&name("eh_proj.weight"))?,
        enorm: vector(&name("enorm.weight"))?,
        hnorm: vector(&name("hnorm.weight"))?,
        head_norm: vector(&name("shared_head_norm.weight"))?,
        layer: load_layer(config, i, LayerKind::Attention, matrix, vector)?,
        embed: optional("embed_tokens.weight")?,
        head: optional("shared_head_head.weight")?,
    })
}

fn load_layer<M, V>(
    config: &HybridConfig,
    i: usize,
    kind: LayerKind,
    matrix: &dyn Fn(&str) -> Result<M>,
    vector: &dyn Fn(&str) -> Result<V>,
) -> Result<LayerWeights<M, V>> {
    {
        let name = |s: &str| format!("blk.{i}.{s}");
        let mixer = match kind {
            LayerKind::DeltaNet => {
                let (in_proj, gate_proj) = match config.layout {
                    DeltaNetLayout::Split => (
                        matrix(&name("attn_qkv.weight"))?,
                        Some(matrix(&name("attn_gate.weight"))?),
                    ),
                    DeltaNetLayout::Legacy => (matrix(&name("ssm_in.weight"))?, None),
                };
                Mixer::DeltaNet(DeltaNetWeights {
                    in_proj,
                    gate_proj,
                    ba: matrix(&name("ssm_ba.weight"))?,
                    conv: vector(&name("ssm_conv1d.weight"))?,
                    dt_bias: vector(&name("ssm_dt.bias"))?,
                    a: vector(&name("ssm_a"))?,
                    norm: vector(&name("ssm_norm.weight"))?,
                    out: matrix(&name("ssm_out.weight"))?,
                })
            }
            LayerKind::Attention => Mixer::Attention(AttentionWeights {
                q: matrix(&name("attn_q.weight"))?,
                k: matrix(&name("attn_k.weight"))?,
                v: matrix(&name("attn_v.weight"))?,
                out: matrix(&name("attn_output.weight"))?,
                q_norm: vector(&name("attn_q_norm.weight"))?,
                k_norm: vector(&name("attn_k_norm.weight"))?,
            }),
        };
        Ok(LayerWeights {
            attn_norm: vector(&name("attn_norm.weight"))?,
            post_norm: vector(&name("post_attention_norm.weight"))?,
            mixer,
            moe: MoeWeights {
                router: matrix(&name("ffn_gate_inp.weight"))?,
                gate_exps: matrix(&name("ffn_gate_exps.weight"))?,
                up_exps: matrix(&name("ffn_up_exps.weight"))?,
                down_exps: matrix(&name("ffn_down_exps.weight"))?,
                shared_gate_inp: matrix(&name("ffn_gate_inp_shexp.weight"))?,
                shared_gate: matrix(&name("ffn_gate_shexp.weight"))?,
                shared_up: matrix(&name("ffn_up_shexp.weight"))?,
                shared_down: matrix(&name("ffn_down_shexp.weight"))?,
            },
        })
    }
}
