//! The model used when a command gets no `-m`: until the trained demo model ships, a tiny
//! synthetic model with random weights, written once to the cache directory.

use std::path::PathBuf;

use anyhow::{Context, Result};
use redlite_engine::synth::{write_synth, Preset, Recipe, SynthOptions, VocabChoice};

fn cache_dir() -> PathBuf {
    if let Some(dir) = std::env::var_os("REDLITE_CACHE") {
        return PathBuf::from(dir);
    }
    let base = std::env::var_os("XDG_CACHE_HOME")
        .map(PathBuf::from)
        .or_else(|| std::env::var_os("HOME").map(|h| PathBuf::from(h).join(".cache")))
        .unwrap_or_else(std::env::temp_dir);
    base.join("redlite")
}

/// The default model's path, writing it first if needed.
pub fn path_or_create() -> Result<PathBuf> {
    let dir = cache_dir();
    let path = dir.join("default-tiny-random-F16-qwenvocab.gguf");
    if !path.exists() {
        std::fs::create_dir_all(&dir).with_context(|| format!("creating {}", dir.display()))?;
        eprintln!(
            "no model given: writing the default model, a tiny qwen3next with RANDOM weights (no trained model ships yet), to {}",
            path.display()
        );
        // The real Qwen vocabulary, so prompts tokenize as they would for the real model.
        let mut config = Preset::Tiny.config();
        config.n_vocab = 151_936;
        let opts = SynthOptions {
            config,
            recipe: Recipe::F16,
            vocab: VocabChoice::Qwen,
            seed: 1,
        };
        let partial = path.with_extension("partial");
        write_synth(&partial, &opts, &mut |_, _| {})?;
        std::fs::rename(&partial, &path)?;
    }
    Ok(path)
}
