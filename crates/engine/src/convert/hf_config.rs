//! `config.json` of a Hugging Face Qwen3-Next checkpoint → [`HybridConfig`].

use serde_json::Value;

use crate::error::{EngineError, Result};
use crate::model::config::{DeltaNetLayout, HybridConfig, LayerKind};

fn field<'a>(json: &'a Value, name: &str) -> Result<&'a Value> {
    json.get(name)
        .ok_or_else(|| EngineError::Convert(format!("config.json has no {name:?}")))
}

fn count(json: &Value, name: &str) -> Result<usize> {
    field(json, name)?
        .as_u64()
        .and_then(|v| usize::try_from(v).ok())
        .ok_or_else(|| EngineError::Convert(format!("config.json {name:?} is not a count")))
}

fn number(json: &Value, name: &str) -> Result<f64> {
    field(json, name)?
        .as_f64()
        .ok_or_else(|| EngineError::Convert(format!("config.json {name:?} is not a number")))
}

/// The first of `names` present, as a count (checkpoints spell a few keys differently).
fn count_any(json: &Value, names: &[&str], default: usize) -> Result<usize> {
    match names.iter().find(|n| json.get(**n).is_some()) {
        Some(name) => count(json, name),
        None => Ok(default),
    }
}

/// Reads the architecture's hyperparameters; the DeltaNet input projection is written in
/// `layout`.
pub fn hybrid_config(json: &Value, layout: DeltaNetLayout) -> Result<HybridConfig> {
    let arch = json
        .get("architectures")
        .and_then(|a| a.get(0))
        .and_then(Value::as_str)
        .unwrap_or("");
    if arch != "Qwen3NextForCausalLM" {
        return Err(EngineError::Convert(format!(
            "config.json architecture {arch:?}, expected \"Qwen3NextForCausalLM\""
        )));
    }
    let n_layer = count(json, "num_hidden_layers")?;
    let head_dim = count(json, "head_dim")?;
    let key_dim = count(json, "linear_key_head_dim")?;
    let value_dim = count(json, "linear_value_head_dim")?;
    if key_dim != value_dim {
        return Err(EngineError::Convert(format!(
            "DeltaNet key head dim {key_dim} differs from value head dim {value_dim}: \
             not supported"
        )));
    }
    let interval = count_any(json, &["full_attention_interval"], 4)?;
    let layers = match json.get("layer_types").and_then(Value::as_array) {
        Some(types) => types
            .iter()
            .map(|t| match t.as_str() {
                Some("full_attention") => Ok(LayerKind::Attention),
                Some("linear_attention") => Ok(LayerKind::DeltaNet),
                other => Err(EngineError::Convert(format!(
                    "config.json layer type {other:?} is neither full_attention nor \
                     linear_attention"
                ))),
            })
            .collect::<Result<Vec<_>>>()?,
        None => HybridConfig::default_layers(n_layer, interval),
    };
    if layers.len() != n_layer {
        return Err(EngineError::Convert(format!(
            "config.json lists {} layer types for {n_layer} layers",
            layers.len()
        )));
    }
    // transformers 5 writes the RoPE keys under `rope_parameters`, older configs at the top.
    let rope = |name: &str| {
        json.get(name)
            .or_else(|| json.get("rope_parameters").and_then(|r| r.get(name)))
            .and_then(Value::as_f64)
    };
    let rotary = rope("partial_rotary_factor").unwrap_or(1.0);
    let rope_base = rope("rope_theta").ok_or_else(|| {
        EngineError::Convert("config.json has no rope_theta (top level or rope_parameters)".into())
    })?;
    Ok(HybridConfig {
        n_layer,
        n_mtp: count_any(
            json,
            &["num_nextn_predict_layers", "mtp_num_hidden_layers"],
            0,
        )?,
        n_embd: count(json, "hidden_size")?,
        n_vocab: count(json, "vocab_size")?,
        context_length: count(json, "max_position_embeddings")?,
        feed_forward_length: count_any(json, &["intermediate_size"], 0)?,
        n_head: count(json, "num_attention_heads")?,
        n_head_kv: count(json, "num_key_value_heads")?,
        head_dim,
        rope_dim: (head_dim as f64 * rotary).round() as usize,
        rope_base: rope_base as f32,
        rms_eps: number(json, "rms_norm_eps")? as f32,
        n_expert: count(json, "num_experts")?,
        n_expert_used: count(json, "num_experts_per_tok")?,
        expert_ff: count(json, "moe_intermediate_size")?,
        shared_ff: count(json, "shared_expert_intermediate_size")?,
        conv_kernel: count(json, "linear_conv_kernel_dim")?,
        ssm_head_dim: key_dim,
        ssm_k_heads: count(json, "linear_num_key_heads")?,
        ssm_v_heads: count(json, "linear_num_value_heads")?,
        full_attention_interval: interval,
        layers,
        layout,
    })
}
