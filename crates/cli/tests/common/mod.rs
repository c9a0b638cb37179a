//! Shared by the CLI tests: a tiny synthetic model in a temporary file.

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use redlite_engine::synth::{write_synth, Preset, Recipe, SynthOptions, VocabChoice};

/// A tiny model written for a test (removed by the guard).
pub struct TinyFile(pub PathBuf);

impl TinyFile {
    /// `tag` and `name` make the path unique per test binary and test.
    pub fn new(tag: &str, name: &str, recipe: Recipe, seed: u64, mtp: bool) -> TinyFile {
        let mut config = Preset::Tiny.config();
        config.n_mtp = usize::from(mtp);
        let opts = SynthOptions {
            config,
            recipe,
            vocab: VocabChoice::Tiny,
            seed,
        };
        let file = format!("redlite-{tag}-{}-{name}.gguf", std::process::id());
        let path = std::env::temp_dir().join(file);
        write_synth(&path, &opts, &mut |_, _| {}).unwrap();
        TinyFile(path)
    }
}

impl Drop for TinyFile {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.0);
    }
}

/// Runs `redlite COMMAND -m FILE ARGS...`.
pub fn redlite(file: &Path, command: &str, args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_redlite"))
        .arg(command)
        .arg("-m")
        .arg(file)
        .args(args)
        .output()
        .unwrap()
}

pub fn text(bytes: &[u8]) -> String {
    String::from_utf8_lossy(bytes).into_owned()
}
