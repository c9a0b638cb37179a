//! A tiny F32 model with an MTP block whose LM head only tells a few tokens apart: the trunk
//! and the (random) MTP block then agree on about half of the tokens, so speculative
//! decoding keeps some drafts, all of them, or none, and every path of the rollback runs.

use std::path::{Path, PathBuf};

use redlite_engine::synth::{write_synth, Preset, Recipe, SynthOptions, VocabChoice};
use redlite_gguf::{write_to_vec, GgufModel, TensorSpec};

/// Tokens the head can choose.
pub const TOKENS: usize = 4;

/// Writes the model into `dir`; `recipe` must be F32 (the head is rewritten as f32).
pub fn agreeing_model(dir: &Path) -> PathBuf {
    let mut config = Preset::Tiny.config();
    config.n_mtp = 1;
    let opts = SynthOptions {
        config,
        recipe: Recipe::F32,
        vocab: VocabChoice::Tiny,
        seed: 5,
    };
    let random = dir.join("random-mtp.gguf");
    write_synth(&random, &opts, &mut |_, _| {}).unwrap();
    let gguf = GgufModel::open(&random).unwrap();
    let tensors: Vec<(TensorSpec, Vec<u8>)> = gguf
        .tensors()
        .map(|t| {
            let mut data = gguf.tensor_data(&t.name).unwrap().to_vec();
            if t.name == "output.weight" {
                // Rows 0..TOKENS project the normed hidden state on fixed ±1 patterns;
                // every other row is zero, so only those tokens are ever chosen.
                let width = t.shape[1] as usize;
                let sign = |i: usize| {
                    if (i * 7919 + (i / width) * 104_729 + 17) % 31 < 15 {
                        1.0
                    } else {
                        -1.0
                    }
                };
                let values: Vec<f32> = (0..data.len() / 4)
                    .map(|i| if i < TOKENS * width { sign(i) } else { 0.0 })
                    .collect();
                data = values.iter().flat_map(|v| v.to_le_bytes()).collect();
            }
            (TensorSpec::new(t.name.clone(), t.ty, &t.shape), data)
        })
        .collect();
    let bytes = write_to_vec(gguf.metadata(), &tensors).unwrap();
    let path = dir.join("agreeing-mtp.gguf");
    std::fs::write(&path, bytes).unwrap();
    path
}
