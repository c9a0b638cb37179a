//! Every weight resident on the GPU, uploaded once: matrices in their GGUF block format
//! (decoded inside the kernels), small vectors (norms, gates, conv taps) decoded to f32.

use redlite_cuda::{CudaSlice, Device, WeightMatrix};
use redlite_gguf::{GgmlType, GgufModel};
use redlite_quant::dequantize_row;

use crate::error::{EngineError, Result};
use crate::model::config::{DeltaNetLayout, HybridConfig, LayerKind};

/// A weight matrix `[rows (out), cols (in)]` (or a stack of experts) in device memory.
pub struct DeviceMatrix {
    pub ty: GgmlType,
    pub rows: usize,
    pub cols: usize,
    bytes: CudaSlice<u8>,
}

impl DeviceMatrix {
    fn load(device: &Device, gguf: &GgufModel, name: &str) -> Result<DeviceMatrix> {
        let loc = gguf
            .locate(name)
            .ok_or_else(|| EngineError::MissingTensor { name: name.into() })?;
        let info = gguf.info(loc);
        Ok(DeviceMatrix {
            ty: info.ty,
            rows: info.rows() as usize,
            cols: info.row_len() as usize,
            bytes: device.upload(gguf.data(loc))?,
        })
    }

    pub fn view(&self) -> WeightMatrix<'_> {
        WeightMatrix {
            ty: self.ty,
            rows: self.rows,
            cols: self.cols,
            bytes: self.bytes.as_view(),
        }
    }
}

/// A small tensor decoded to f32 on the host, then uploaded.
fn vector(device: &Device, gguf: &GgufModel, name: &str) -> Result<CudaSlice<f32>> {
    let loc = gguf
        .locate(name)
        .ok_or_else(|| EngineError::MissingTensor { name: name.into() })?;
    let info = gguf.info(loc);
    let mut values = vec![0f32; info.elements() as usize];
    dequantize_row(info.ty, gguf.data(loc), &mut values)?;
    Ok(device.upload(&values)?)
}

pub struct DeltaNetWeights {
    /// `attn_qkv` (split layout) or `ssm_in` (legacy: q k v z grouped per key head).
    pub in_proj: DeviceMatrix,
    /// `attn_gate` (split layout only).
    pub gate_proj: Option<DeviceMatrix>,
    pub ba: DeviceMatrix,
    /// `[channels][kernel]`.
    pub conv: CudaSlice<f32>,
    pub dt_bias: CudaSlice<f32>,
    /// `-exp(A_log)` per v-head.
    pub a: CudaSlice<f32>,
    pub norm: CudaSlice<f32>,
    pub out: DeviceMatrix,
}

pub struct AttentionWeights {
    /// Per head: `head_dim` query rows then `head_dim` gate rows.
    pub q: DeviceMatrix,
    pub k: DeviceMatrix,
    pub v: DeviceMatrix,
    pub out: DeviceMatrix,
    pub q_norm: CudaSlice<f32>,
    pub k_norm: CudaSlice<f32>,
}

pub struct MoeWeights {
    /// F32 `[n_expert][n_embd]`.
    pub router: DeviceMatrix,
    /// Stacks `[n_expert][expert_ff][n_embd]` (gate, up) and `[n_expert][n_embd][expert_ff]`.
    pub gate_exps: DeviceMatrix,
    pub up_exps: DeviceMatrix,
    pub down_exps: DeviceMatrix,
    /// The shared expert's scalar gate: one row of `n_embd`.
    pub shared_gate_inp: DeviceMatrix,
    pub shared_gate: DeviceMatrix,
    pub shared_up: DeviceMatrix,
    pub shared_down: DeviceMatrix,
}

pub enum Mixer {
    DeltaNet(DeltaNetWeights),
    Attention(AttentionWeights),
}

pub struct LayerWeights {
    pub attn_norm: CudaSlice<f32>,
    pub post_norm: CudaSlice<f32>,
    pub mixer: Mixer,
    pub moe: MoeWeights,
}

pub struct CudaWeights {
    pub token_embd: DeviceMatrix,
    pub layers: Vec<LayerWeights>,
    pub output_norm: CudaSlice<f32>,
    /// `output.weight`, or the embedding when the file ties them.
    pub output: DeviceMatrix,
}

impl CudaWeights {
    pub fn upload(device: &Device, g: &GgufModel, config: &HybridConfig) -> Result<CudaWeights> {
        let matrix = |name: &str| DeviceMatrix::load(device, g, name);
        let vector = |name: &str| vector(device, g, name);
        let mut layers = Vec::with_capacity(config.n_layer);
        for (i, kind) in config.layers.iter().enumerate() {
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
            layers.push(LayerWeights {
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
            });
        }
        let output = match g.locate("output.weight") {
            Some(_) => matrix("output.weight")?,
            None => matrix("token_embd.weight")?,
        };
        Ok(CudaWeights {
            token_embd: matrix("token_embd.weight")?,
            output_norm: vector("output_norm.weight")?,
            output,
            layers,
        })
    }
}
