//! Where each GGUF tensor of a qwen3next file comes from in a Hugging Face checkpoint, and the
//! transforms llama.cpp's converter applies on the way (spec §2.5): `+1` on the zero-centred
//! RMSNorm weights (not the DeltaNet gated norm), `ssm_a = -exp(A_log)`, the conv weight
//! squeezed, experts stacked, `in_proj_qkvz` kept (legacy layout) or split into `attn_qkv`
//! and `attn_gate`, the MTP block's `mtp.*` tensors as block `n_layer` with `nextn.*` names.

use crate::error::{EngineError, Result};
use crate::model::config::HybridConfig;
use crate::model::tensors::TensorPlan;

use super::checkpoint::Checkpoint;

fn bad(what: String) -> EngineError {
    EngineError::Convert(what)
}

/// How values change between the checkpoint and the file.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Transform {
    None,
    /// Zero-centred RMSNorm weight: stored as `1 + w`.
    PlusOne,
    /// `A_log` → `-exp(A_log)`.
    NegExp,
}

/// The values of the GGUF tensor `plan` (outermost dimension first, as its shape).
pub fn tensor_values(ck: &Checkpoint, c: &HybridConfig, plan: &TensorPlan) -> Result<Vec<f32>> {
    let values = match plan.layer {
        None => global(ck, &plan.name)?,
        Some(layer) => {
            let suffix = plan
                .name
                .strip_prefix(&format!("blk.{layer}."))
                .ok_or_else(|| bad(format!("tensor {} has no block prefix", plan.name)))?;
            block(ck, c, layer, suffix)?
        }
    };
    let expected: u64 = plan.shape.iter().product();
    if values.len() as u64 != expected {
        return Err(bad(format!(
            "{}: the checkpoint gives {} values, the config's shape {:?} needs {expected}",
            plan.name,
            values.len(),
            plan.shape
        )));
    }
    Ok(values)
}

fn read(ck: &Checkpoint, name: &str, transform: Transform) -> Result<Vec<f32>> {
    let (_, mut values) = ck.read(name)?;
    match transform {
        Transform::None => {}
        Transform::PlusOne => values.iter_mut().for_each(|v| *v += 1.0),
        Transform::NegExp => values.iter_mut().for_each(|v| *v = -v.exp()),
    }
    Ok(values)
}

fn global(ck: &Checkpoint, name: &str) -> Result<Vec<f32>> {
    match name {
        "token_embd.weight" => read(ck, "model.embed_tokens.weight", Transform::None),
        "output_norm.weight" => read(ck, "model.norm.weight", Transform::PlusOne),
        // Tied embeddings: the converter falls back to the token table.
        "output.weight" if !ck.contains("lm_head.weight") => {
            read(ck, "model.embed_tokens.weight", Transform::None)
        }
        "output.weight" => read(ck, "lm_head.weight", Transform::None),
        other => Err(bad(format!("no checkpoint source for {other}"))),
    }
}

fn block(ck: &Checkpoint, c: &HybridConfig, layer: usize, suffix: &str) -> Result<Vec<f32>> {
    // The MTP block's own tensors, then its decoder layer under `mtp.layers.0.`.
    let prefix = if layer < c.n_layer {
        format!("model.layers.{layer}.")
    } else {
        match suffix {
            "nextn.eh_proj.weight" => return read(ck, "mtp.fc.weight", Transform::None),
            "nextn.enorm.weight" => {
                return read(ck, "mtp.pre_fc_norm_embedding.weight", Transform::PlusOne)
            }
            "nextn.hnorm.weight" => {
                return read(ck, "mtp.pre_fc_norm_hidden.weight", Transform::PlusOne)
            }
            "nextn.shared_head_norm.weight" => {
                return read(ck, "mtp.norm.weight", Transform::PlusOne)
            }
            _ => format!("mtp.layers.{}.", layer - c.n_layer),
        }
    };
    let one = |hf: &str, t: Transform| read(ck, &format!("{prefix}{hf}"), t);
    match suffix {
        "attn_norm.weight" => one("input_layernorm.weight", Transform::PlusOne),
        "post_attention_norm.weight" => one("post_attention_layernorm.weight", Transform::PlusOne),
        "ffn_gate_inp.weight" => one("mlp.gate.weight", Transform::None),
        "ffn_gate_exps.weight" => experts(ck, c, &prefix, "gate_proj"),
        "ffn_up_exps.weight" => experts(ck, c, &prefix, "up_proj"),
        "ffn_down_exps.weight" => experts(ck, c, &prefix, "down_proj"),
        "ffn_gate_inp_shexp.weight" => one("mlp.shared_expert_gate.weight", Transform::None),
        "ffn_gate_shexp.weight" => one("mlp.shared_expert.gate_proj.weight", Transform::None),
        "ffn_up_shexp.weight" => one("mlp.shared_expert.up_proj.weight", Transform::None),
        "ffn_down_shexp.weight" => one("mlp.shared_expert.down_proj.weight", Transform::None),
        "attn_q.weight" => one("self_attn.q_proj.weight", Transform::None),
        "attn_k.weight" => one("self_attn.k_proj.weight", Transform::None),
        "attn_v.weight" => one("self_attn.v_proj.weight", Transform::None),
        "attn_output.weight" => one("self_attn.o_proj.weight", Transform::None),
        "attn_q_norm.weight" => one("self_attn.q_norm.weight", Transform::PlusOne),
        "attn_k_norm.weight" => one("self_attn.k_norm.weight", Transform::PlusOne),
        "ssm_conv1d.weight" => one("linear_attn.conv1d.weight", Transform::None),
        "ssm_dt.bias" => one("linear_attn.dt_bias", Transform::None),
        "ssm_a" => one("linear_attn.A_log", Transform::NegExp),
        "ssm_ba.weight" => one("linear_attn.in_proj_ba.weight", Transform::None),
        "ssm_norm.weight" => one("linear_attn.norm.weight", Transform::None),
        "ssm_out.weight" => one("linear_attn.out_proj.weight", Transform::None),
        "ssm_in.weight" => one("linear_attn.in_proj_qkvz.weight", Transform::None),
        "attn_qkv.weight" | "attn_gate.weight" => {
            let qkvz = one("linear_attn.in_proj_qkvz.weight", Transform::None)?;
            split_qkvz(c, &qkvz, suffix == "attn_qkv.weight")
        }
        other => Err(bad(format!("no checkpoint source for blk.{layer}.{other}"))),
    }
}

/// The experts' `proj` matrices stacked in expert order: from one tensor per expert
/// (`mlp.experts.{e}.{proj}.weight`), or from transformers' packed tensors
/// (`mlp.experts.gate_up_proj` `[n_expert, 2 ff, n_embd]`, gate rows first, and
/// `mlp.experts.down_proj` `[n_expert, n_embd, ff]`).
fn experts(ck: &Checkpoint, c: &HybridConfig, prefix: &str, proj: &str) -> Result<Vec<f32>> {
    let packed_gate_up = format!("{prefix}mlp.experts.gate_up_proj");
    let packed_down = format!("{prefix}mlp.experts.down_proj");
    match proj {
        "down_proj" if ck.contains(&packed_down) => {
            return read(ck, &packed_down, Transform::None);
        }
        "gate_proj" | "up_proj" if ck.contains(&packed_gate_up) => {
            let (shape, values) = ck.read(&packed_gate_up)?;
            let (ff, e) = (c.expert_ff, c.n_embd);
            if shape != [c.n_expert, 2 * ff, e] {
                return Err(bad(format!(
                    "{packed_gate_up} has shape {shape:?}, expected [{}, {}, {e}]",
                    c.n_expert,
                    2 * ff
                )));
            }
            let half = if proj == "gate_proj" { 0 } else { ff * e };
            let mut out = Vec::with_capacity(c.n_expert * ff * e);
            for expert in values.chunks_exact(2 * ff * e) {
                out.extend_from_slice(&expert[half..half + ff * e]);
            }
            return Ok(out);
        }
        _ => {}
    }
    let mut out = Vec::new();
    for e in 0..c.n_expert {
        out.extend(read(
            ck,
            &format!("{prefix}mlp.experts.{e}.{proj}.weight"),
            Transform::None,
        )?);
    }
    Ok(out)
}

/// `in_proj_qkvz` rows, per key-head group g: `[q_g (dk) | k_g (dk) | v (r·dv) | z (r·dv)]`
/// (r = v heads per key head) → `attn_qkv` = all q, then all k, then all v; `attn_gate` =
/// all z, in group order.
fn split_qkvz(c: &HybridConfig, qkvz: &[f32], qkv: bool) -> Result<Vec<f32>> {
    let (g, d, e) = (c.ssm_k_heads, c.ssm_head_dim, c.n_embd);
    if g == 0 || !c.ssm_v_heads.is_multiple_of(g) {
        return Err(bad(format!(
            "{} value heads do not divide over {g} key heads",
            c.ssm_v_heads
        )));
    }
    let r = c.ssm_v_heads / g;
    let group_rows = 2 * d + 2 * r * d;
    if qkvz.len() != g * group_rows * e {
        return Err(bad(format!(
            "in_proj_qkvz has {} values, expected {} groups of {group_rows} rows of {e}",
            qkvz.len(),
            g
        )));
    }
    // (first row inside a group, rows) of each part.
    let parts: &[(usize, usize)] = if qkv {
        &[(0, d), (d, d), (2 * d, r * d)]
    } else {
        &[(2 * d + r * d, r * d)]
    };
    let mut out = Vec::new();
    for &(start, rows) in parts {
        for group in 0..g {
            let first = (group * group_rows + start) * e;
            out.extend_from_slice(&qkvz[first..first + rows * e]);
        }
    }
    Ok(out)
}
