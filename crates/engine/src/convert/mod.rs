//! `redlite convert`: a Hugging Face Qwen3-Next checkpoint (`config.json`, `*.safetensors`,
//! one file or shards, `tokenizer.json`, `tokenizer_config.json`) → a qwen3next GGUF in F32,
//! F16 or BF16, with the tensors, metadata and vocabulary llama.cpp's converter writes (the
//! MTP block too, as llama.cpp stores it), streamed tensor by tensor.

mod checkpoint;
mod hf_config;
mod hf_vocab;
mod tensors;

use std::path::{Path, PathBuf};

use half::{bf16, f16};
use redlite_gguf::{GgmlType, GgufWriter, Metadata, TensorSpec, Value};
use serde_json::Value as Json;

use crate::error::{EngineError, Result};
use crate::model::config::DeltaNetLayout;
use crate::model::tensors::{expected_tensors, Role, TensorPlan};
use crate::synth::write_vocabulary;
use checkpoint::Checkpoint;

pub use hf_config::hybrid_config;

/// What to write.
#[derive(Clone, Copy, Debug)]
pub struct ConvertOptions {
    /// F32, F16 or BF16 for the matrices; vectors, the conv taps and the router stay F32.
    pub ty: GgmlType,
    /// The DeltaNet input projection: split (`attn_qkv` + `attn_gate`, current llama.cpp)
    /// or legacy (`ssm_in`).
    pub layout: DeltaNetLayout,
}

/// What was written.
#[derive(Clone, Debug)]
pub struct ConvertSummary {
    pub path: PathBuf,
    pub tensors: usize,
    pub bytes: u64,
}

pub(crate) fn read_json(path: &Path) -> Result<Json> {
    let text = std::fs::read_to_string(path).map_err(|source| EngineError::Io {
        path: path.to_path_buf(),
        source,
    })?;
    serde_json::from_str(&text)
        .map_err(|e| EngineError::Convert(format!("{}: {e}", path.display())))
}

fn file_type(ty: GgmlType) -> Result<u32> {
    match ty {
        GgmlType::F32 => Ok(0),
        GgmlType::F16 => Ok(1),
        GgmlType::BF16 => Ok(32),
        other => Err(EngineError::Convert(format!(
            "output type {other:?}: convert writes F32, F16 or BF16 (quantize afterwards)"
        ))),
    }
}

fn encode(ty: GgmlType, values: &[f32]) -> Vec<u8> {
    match ty {
        GgmlType::F16 => values
            .iter()
            .flat_map(|&v| f16::from_f32(v).to_le_bytes())
            .collect(),
        GgmlType::BF16 => values
            .iter()
            .flat_map(|&v| bf16::from_f32(v).to_le_bytes())
            .collect(),
        _ => values.iter().flat_map(|v| v.to_le_bytes()).collect(),
    }
}

#[allow(clippy::too_many_arguments)]
fn write_tensors(
    path: &Path,
    md: &Metadata,
    specs: &[TensorSpec],
    ckpt: &Checkpoint,
    config: &crate::model::config::HybridConfig,
    plans: &[TensorPlan],
    types: &[GgmlType],
    progress: &mut dyn FnMut(usize, usize),
) -> Result<()> {
    let mut writer = GgufWriter::create(path, md, specs)?;
    for (i, (plan, &ty)) in plans.iter().zip(types).enumerate() {
        let values = tensors::tensor_values(ckpt, config, plan)?;
        writer.write_data(&encode(ty, &values))?;
        progress(i + 1, plans.len());
    }
    writer.finish()?;
    Ok(())
}

/// Converts the checkpoint in `dir` to `out`, reporting `(tensors done, tensors)`.
pub fn convert(
    dir: &Path,
    out: &Path,
    opts: &ConvertOptions,
    progress: &mut dyn FnMut(usize, usize),
) -> Result<ConvertSummary> {
    let file_type = file_type(opts.ty)?;
    let json = read_json(&dir.join("config.json"))?;
    let mut config = hybrid_config(&json, opts.layout)?;
    let ckpt = Checkpoint::open(dir)?;
    if config.n_mtp == 0 {
        // As llama.cpp's converter: the MTP block is counted from the tensors.
        config.n_mtp = ckpt.mtp_layers();
    }
    let vocab = hf_vocab::vocabulary(dir, &json, config.n_vocab)?;

    let mut md = Metadata::new();
    md.set("general.architecture", Value::String("qwen3next".into()));
    md.set("general.type", Value::String("model".into()));
    let name = dir
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_else(|| "qwen3next".into());
    md.set("general.name", Value::String(name));
    md.set("general.file_type", Value::U32(file_type));
    md.set("general.quantization_version", Value::U32(2));
    config.write_metadata(&mut md, opts.layout == DeltaNetLayout::Split);
    write_vocabulary(&mut md, &vocab);

    let plans = expected_tensors(&config);
    let types: Vec<GgmlType> = plans
        .iter()
        .map(|p| {
            if p.role.is_always_f32() {
                GgmlType::F32
            } else {
                opts.ty
            }
        })
        .collect();
    let specs: Vec<TensorSpec> = plans
        .iter()
        .zip(&types)
        .map(|(p, &ty)| {
            // llama.cpp's converter keeps the shared-expert gate 2-D ([1, n_embd]).
            let shape = match p.role {
                Role::SharedExpertGate => [&[1], p.shape.as_slice()].concat(),
                _ => p.shape.clone(),
            };
            TensorSpec::new(p.name.clone(), ty, &shape)
        })
        .collect();
    // Written next to `out` and renamed at the end: a failure leaves no half file behind.
    let partial = out.with_extension("gguf.partial");
    let written = write_tensors(
        &partial, &md, &specs, &ckpt, &config, &plans, &types, progress,
    );
    if let Err(e) = written {
        let _ = std::fs::remove_file(&partial);
        return Err(e);
    }
    std::fs::rename(&partial, out).map_err(|source| EngineError::Io {
        path: out.to_path_buf(),
        source,
    })?;
    let bytes = std::fs::metadata(out)
        .map_err(|source| EngineError::Io {
            path: out.to_path_buf(),
            source,
        })?
        .len();
    Ok(ConvertSummary {
        path: out.to_path_buf(),
        tensors: plans.len(),
        bytes,
    })
}
