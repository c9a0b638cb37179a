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
    let path = dir.join("default-tiny-random-F32.gguf");
    if !path.exists() {
        std::fs::create_dir_all(&dir).with_context(|| format!("creating {}", dir.display()))?;
        eprintln!(
            "no model given: writing the default model, a tiny qwen3next with RANDOM weights (no trained model ships yet), to {}",
            path.display()
        );
        let opts = SynthOptions {
            config: Preset::Tiny.config(),
            recipe: Recipe::F32,
            vocab: VocabChoice::Tiny,
            seed: 1,
        };
        let partial = path.with_extension("partial");
        write_synth(&partial, &opts, &mut |_, _| {})?;
        std::fs::rename(&partial, &path)?;
    }
    Ok(path)
}
