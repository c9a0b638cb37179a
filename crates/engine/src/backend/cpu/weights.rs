//! CPU views of the weights: matrices stay in the memory map and are decoded row by row;
//! small vectors (norms, gates, conv taps) are decoded to f32 once at load.

use std::sync::Arc;

use redlite_gguf::{GgmlType, GgufModel, TensorRef};
use redlite_quant::dequantize_row;

use crate::error::{EngineError, Result};
use crate::model::config::{DeltaNetLayout, HybridConfig, LayerKind};

/// A weight matrix `[rows (out), cols (in)]`, or a stack of them (`experts` slabs).
#[derive(Clone, Debug)]
pub struct Matrix {
    pub loc: TensorRef,
    pub ty: GgmlType,
    pub rows: usize,
    pub cols: usize,
    pub row_bytes: usize,
}

impl Matrix {
    fn load(gguf: &GgufModel, name: &str) -> Result<Matrix> {
        let loc = gguf
            .locate(name)
            .ok_or_else(|| EngineError::MissingTensor { name: name.into() })?;
        let info = gguf.info(loc);
        let cols = info.row_len() as usize;
        let rows = info.rows() as usize;
        Ok(Matrix {
            loc,
            ty: info.ty,
            rows,
            cols,
            row_bytes: (info.bytes as usize) / rows.max(1),
        })
    }
}

/// Decodes a small tensor to f32.
fn vector(gguf: &GgufModel, name: &str) -> Result<Vec<f32>> {
    let loc = gguf
        .locate(name)
        .ok_or_else(|| EngineError::MissingTensor { name: name.into() })?;
    let info = gguf.info(loc);
    let mut out = vec![0f32; info.elements() as usize];
    dequantize_row(info.ty, gguf.data(loc), &mut out)?;
    Ok(out)
}

pub struct DeltaNetWeights {
    /// `attn_qkv` (split layout) or `ssm_in` (legacy: q k v z grouped per key head).
    pub in_proj: Matrix,
    /// `attn_gate` (split layout only).
    pub gate_proj: Option<Matrix>,
    pub ba: Matrix,
    /// `[channels][kernel]`, tap `kernel - 1` multiplies the current token.
    pub conv: Vec<f32>,
    pub dt_bias: Vec<f32>,
    /// `-exp(A_log)` per v-head.
    pub a: Vec<f32>,
    pub norm: Vec<f32>,
    pub out: Matrix,
}

pub struct AttentionWeights {
    /// Per head: `head_dim` query rows then `head_dim` gate rows.
    pub q: Matrix,
    pub k: Matrix,
    pub v: Matrix,
    pub out: Matrix,
    pub q_norm: Vec<f32>,
    pub k_norm: Vec<f32>,
}

pub struct MoeWeights {
    pub router: Matrix,
    pub gate_exps: Matrix,
    pub up_exps: Matrix,
    pub down_exps: Matrix,
    /// The shared expert's scalar gate: one row of `n_embd`.
    pub shared_gate_inp: Matrix,
    pub shared_gate: Matrix,
    pub shared_up: Matrix,
    pub shared_down: Matrix,
}

pub enum Mixer {
    DeltaNet(DeltaNetWeights),
    Attention(AttentionWeights),
}

pub struct LayerWeights {
    pub attn_norm: Vec<f32>,
    pub post_norm: Vec<f32>,
    pub mixer: Mixer,
    pub moe: MoeWeights,
}

pub struct CpuWeights {
    pub gguf: Arc<GgufModel>,
    pub token_embd: Matrix,
    pub layers: Vec<LayerWeights>,
    pub output_norm: Vec<f32>,
    /// `output.weight`, or the embedding when the file ties them.
    pub output: Matrix,
}

impl CpuWeights {
    pub fn load(gguf: Arc<GgufModel>, config: &HybridConfig) -> Result<CpuWeights> {
        let g = &*gguf;
        let mut layers = Vec::with_capacity(config.n_layer);
        for (i, kind) in config.layers.iter().enumerate() {
            let name = |s: &str| format!("blk.{i}.{s}");
            let mixer = match kind {
                LayerKind::DeltaNet => {
                    let (in_proj, gate_proj) = match config.layout {
                        DeltaNetLayout::Split => (
                            Matrix::load(g, &name("attn_qkv.weight"))?,
                            Some(Matrix::load(g, &name("attn_gate.weight"))?),
                        ),
                        DeltaNetLayout::Legacy => (Matrix::load(g, &name("ssm_in.weight"))?, None),
                    };
                    Mixer::DeltaNet(DeltaNetWeights {
                        in_proj,
                        gate_proj,
                        ba: Matrix::load(g, &name("ssm_ba.weight"))?,
                        conv: vector(g, &name("ssm_conv1d.weight"))?,
                        dt_bias: vector(g, &name("ssm_dt.bias"))?,
                        a: vector(g, &name("ssm_a"))?,
                        norm: vector(g, &name("ssm_norm.weight"))?,
                        out: Matrix::load(g, &name("ssm_out.weight"))?,
                    })
                }
                LayerKind::Attention => Mixer::Attention(AttentionWeights {
                    q: Matrix::load(g, &name("attn_q.weight"))?,
                    k: Matrix::load(g, &name("attn_k.weight"))?,
                    v: Matrix::load(g, &name("attn_v.weight"))?,
                    out: Matrix::load(g, &name("attn_output.weight"))?,
                    q_norm: vector(g, &name("attn_q_norm.weight"))?,
                    k_norm: vector(g, &name("attn_k_norm.weight"))?,
                }),
            };
            layers.push(LayerWeights {
                attn_norm: vector(g, &name("attn_norm.weight"))?,
                post_norm: vector(g, &name("post_attention_norm.weight"))?,
                mixer,
                moe: MoeWeights {
                    router: Matrix::load(g, &name("ffn_gate_inp.weight"))?,
                    gate_exps: Matrix::load(g, &name("ffn_gate_exps.weight"))?,
                    up_exps: Matrix::load(g, &name("ffn_up_exps.weight"))?,
                    down_exps: Matrix::load(g, &name("ffn_down_exps.weight"))?,
                    shared_gate_inp: Matrix::load(g, &name("ffn_gate_inp_shexp.weight"))?,
                    shared_gate: Matrix::load(g, &name("ffn_gate_shexp.weight"))?,
                    shared_up: Matrix::load(g, &name("ffn_up_shexp.weight"))?,
                    shared_down: Matrix::load(g, &name("ffn_down_shexp.weight"))?,
                },
            });
        }
        let output = match g.locate("output.weight") {
            Some(_) => Matrix::load(g, "output.weight")?,
            None => Matrix::load(g, "token_embd.weight")?,
        };
        Ok(CpuWeights {
            token_embd: Matrix::load(g, "token_embd.weight")?,
            output_norm: vector(g, "output_norm.weight")?,
            output,
            layers,
            gguf,
        })
    }
}
