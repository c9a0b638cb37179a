//! `redlite synth`: writes a qwen3next GGUF with the real tensor names, shapes and types,
//! filled with seeded random data. Same options, same bytes, on any machine and with any
//! number of threads; written as a stream, so the 80B file never sits in memory.

mod fill;
mod preset;
mod recipe;
mod rng;

use std::collections::HashMap;
use std::path::{Path, PathBuf};

use rayon::prelude::*;
use redlite_gguf::{GgmlType, GgufWriter, Metadata, TensorSpec, Value};

pub use preset::Preset;
pub use recipe::Recipe;

use crate::error::{EngineError, Result};
use crate::model::config::{DeltaNetLayout, HybridConfig};
use crate::model::tensors::{expected_tensors, TensorPlan};
use crate::vocab::{qwen_vocabulary, tiny_vocabulary, Vocabulary};
use fill::{calibrate, fill, role_std, Calibration};
use rng::{hash_name, Rng};

/// Which vocabulary the file carries.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum VocabChoice {
    /// The real Qwen2/Qwen3 vocabulary (151,643 BPE tokens + 26 added, padded).
    Qwen,
    /// A small byte-level BPE vocabulary for tiny test models.
    Tiny,
}

/// Everything that decides a synthetic file's bytes.
#[derive(Clone, Debug)]
pub struct SynthOptions {
    pub config: HybridConfig,
    pub recipe: Recipe,
    pub vocab: VocabChoice,
    pub seed: u64,
}

/// What was written.
#[derive(Clone, Debug)]
pub struct SynthSummary {
    pub path: PathBuf,
    pub tensors: usize,
    pub bytes: u64,
}

/// Bytes generated per parallel work item.
const CHUNK_BYTES: u64 = 8 << 20;

fn metadata(opts: &SynthOptions, vocab: &Vocabulary) -> Metadata {
    let mut md = Metadata::new();
    md.set("general.architecture", Value::String("qwen3next".into()));
    md.set("general.type", Value::String("model".into()));
    md.set(
        "general.name",
        Value::String(format!(
            "redlite synthetic qwen3next {} (random weights)",
            opts.recipe.name()
        )),
    );
    md.set("general.file_type", Value::U32(opts.recipe.file_type()));
    md.set("general.quantization_version", Value::U32(2));
    md.set("redlite.synth.seed", Value::U64(opts.seed));
    md.set(
        "redlite.synth.recipe",
        Value::String(opts.recipe.name().into()),
    );
    // Newer converters write the per-layer array; files in the legacy layout predate it.
    opts.config
        .write_metadata(&mut md, opts.config.layout == DeltaNetLayout::Split);
    write_vocabulary(&mut md, vocab);
    md
}

/// The `tokenizer.ggml.*` keys, as llama.cpp's converter writes them.
pub(crate) fn write_vocabulary(md: &mut Metadata, v: &Vocabulary) {
    md.set("tokenizer.ggml.model", Value::String(v.model.clone()));
    md.set("tokenizer.ggml.pre", Value::String(v.pre.clone()));
    md.set(
        "tokenizer.ggml.tokens",
        Value::strings(v.tokens.iter().cloned()),
    );
    md.set(
        "tokenizer.ggml.token_type",
        Value::i32s(v.token_types.iter().copied()),
    );
    md.set(
        "tokenizer.ggml.merges",
        Value::strings(v.merges.iter().cloned()),
    );
    md.set("tokenizer.ggml.eos_token_id", Value::U32(v.eos_token_id));
    md.set(
        "tokenizer.ggml.padding_token_id",
        Value::U32(v.padding_token_id),
    );
    if let Some(bos) = v.bos_token_id {
        md.set("tokenizer.ggml.bos_token_id", Value::U32(bos));
    }
    md.set("tokenizer.ggml.add_bos_token", Value::Bool(v.add_bos_token));
    md.set(
        "tokenizer.chat_template",
        Value::String(v.chat_template.clone()),
    );
}

fn vocabulary(opts: &SynthOptions) -> Result<Vocabulary> {
    let v = match opts.vocab {
        VocabChoice::Qwen => qwen_vocabulary(opts.config.n_vocab),
        VocabChoice::Tiny => tiny_vocabulary(opts.config.n_vocab),
    };
    v.map_err(|e| EngineError::Synth(format!("vocabulary: {e}")))
}

/// The tensor list with the recipe's types.
pub fn plan_tensors(config: &HybridConfig, recipe: Recipe) -> Vec<(TensorPlan, GgmlType)> {
    let plans = expected_tensors(config);
    let types = recipe::assign_types(recipe, &plans, config.n_layer, config.attention_layers());
    plans.into_iter().zip(types).collect()
}

/// Writes the file, reporting `(bytes written, total bytes)` as it goes.
pub fn write_synth(
    path: &Path,
    opts: &SynthOptions,
    progress: &mut dyn FnMut(u64, u64),
) -> Result<SynthSummary> {
    let vocab = vocabulary(opts)?;
    let md = metadata(opts, &vocab);
    let tensors = plan_tensors(&opts.config, opts.recipe);
    let specs: Vec<TensorSpec> = tensors
        .iter()
        .map(|(p, ty)| TensorSpec::new(p.name.clone(), *ty, &p.shape))
        .collect();

    let mut calibrations: HashMap<GgmlType, Calibration> = HashMap::new();
    for (_, ty) in &tensors {
        if ty.is_quantized() && !calibrations.contains_key(ty) {
            calibrations.insert(*ty, calibrate(*ty)?);
        }
    }

    let mut writer = GgufWriter::create(path, &md, &specs)?;
    let total: u64 = writer.tensors().iter().map(|t| t.bytes).sum();
    let mut done = 0u64;
    let batch = 2 * rayon::current_num_threads().max(1);
    for ((plan, ty), info) in tensors.iter().zip(writer.tensors().to_vec()) {
        let row_len = info.row_len();
        let row_bytes = info.bytes / info.rows().max(1);
        let rows_per_chunk = (CHUNK_BYTES / row_bytes.max(1)).max(1);
        let n_chunks = info.rows().div_ceil(rows_per_chunk);
        let std = role_std(plan.role, row_len);
        let stream = hash_name(&plan.name);
        let calibration = calibrations.get(ty).copied();
        let mut next_chunk = 0u64;
        while next_chunk < n_chunks {
            let end = (next_chunk + batch as u64).min(n_chunks);
            let pieces: Vec<Result<Vec<u8>>> = (next_chunk..end)
                .into_par_iter()
                .map(|chunk| {
                    let rows = rows_per_chunk.min(info.rows() - chunk * rows_per_chunk);
                    let mut buf = vec![0u8; (rows * row_bytes) as usize];
                    let mut rng = Rng::new(opts.seed, stream, chunk);
                    fill(*ty, plan.role, std, calibration, &mut rng, &mut buf)?;
                    Ok(buf)
                })
                .collect();
            for piece in pieces {
                let piece = piece?;
                writer.write_data(&piece)?;
                done += piece.len() as u64;
                progress(done, total);
            }
            next_chunk = end;
        }
    }
    writer.finish()?;
    let bytes = std::fs::metadata(path)
        .map_err(|source| EngineError::Io {
            path: path.to_path_buf(),
            source,
        })?
        .len();
    Ok(SynthSummary {
        path: path.to_path_buf(),
        tensors: specs.len(),
        bytes,
    })
}
