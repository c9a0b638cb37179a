//! Reading a model's configuration from a GGUF file and checking its tensors against it.

use redlite_gguf::GgufModel;

use crate::error::{EngineError, Result};
use crate::model::config::{DeltaNetLayout, HybridConfig, LayerKind};
use crate::model::tensors::expected_tensors;

/// Which DeltaNet layout a file uses: `attn_qkv` + `attn_gate`, or the legacy `ssm_in`.
pub fn detect_layout(model: &GgufModel, config_layers: &[LayerKind]) -> DeltaNetLayout {
    let first_deltanet = config_layers.iter().position(|k| *k == LayerKind::DeltaNet);
    match first_deltanet {
        Some(i)
            if model.tensor(&format!("blk.{i}.attn_qkv.weight")).is_none()
                && model.tensor(&format!("blk.{i}.ssm_in.weight")).is_some() =>
        {
            DeltaNetLayout::Legacy
        }
        _ => DeltaNetLayout::Split,
    }
}

/// The vocabulary size: the rows of `token_embd.weight`.
fn vocab_size(model: &GgufModel) -> Result<usize> {
    let embd = model
        .tensor("token_embd.weight")
        .ok_or_else(|| EngineError::MissingTensor {
            name: "token_embd.weight".into(),
        })?;
    Ok(embd.shape.first().copied().unwrap_or(0) as usize)
}

/// Reads the config and checks that every tensor it implies is present with its shape.
/// (`output.weight` may be absent: the embedding is then used as the head, as llama.cpp does.)
pub fn config_from_gguf(model: &GgufModel) -> Result<HybridConfig> {
    let n_vocab = vocab_size(model)?;
    let mut config = HybridConfig::from_metadata(model.metadata(), n_vocab, DeltaNetLayout::Split)?;
    config.layout = detect_layout(model, &config.layers);
    for plan in expected_tensors(&config) {
        match model.tensor(&plan.name) {
            None if plan.name == "output.weight" => {}
            None => return Err(EngineError::MissingTensor { name: plan.name }),
            Some(t) => {
                // A trailing 1 (`{2048, 1}` for a vector) is the same tensor.
                let mut found = t.shape.clone();
                while found.len() > plan.shape.len() && found.first() == Some(&1) {
                    found.remove(0);
                }
                if found != plan.shape {
                    return Err(EngineError::ShapeMismatch {
                        name: plan.name,
                        expected: plan.shape,
                        found: t.shape.clone(),
                    });
                }
            }
        }
    }
    Ok(config)
}
