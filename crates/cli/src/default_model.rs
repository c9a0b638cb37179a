//! The model used when a command gets no `-m`: redlite's demo model, a 31 M-parameter
//! qwen3next with its MTP block, trained on the King James Bible (tools/train/README.md). It
//! is embedded in the binary and written once to the cache directory, from where it is mapped
//! like any other file.

use std::path::PathBuf;

use anyhow::{Context, Result};

/// The file's name in the cache; a new demo file gets a new name, so an old copy is never
/// taken for it.
const NAME: &str = "redlite-demo-kjv-IQ2_XS.gguf";
static BYTES: &[u8] = include_bytes!("../../../assets/models/redlite-demo-kjv-IQ2_XS.gguf");

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

/// The default model's path, writing it first if it is missing or not the embedded bytes.
pub fn path_or_create() -> Result<PathBuf> {
    let dir = cache_dir();
    let path = dir.join(NAME);
    // A full comparison (14 MB, milliseconds): a truncated or edited copy is rewritten.
    let current = std::fs::read(&path).is_ok_and(|bytes| bytes == BYTES);
    if !current {
        std::fs::create_dir_all(&dir).with_context(|| format!("creating {}", dir.display()))?;
        eprintln!(
            "no model given: using redlite's demo model (31 M parameters, trained on the King James Bible), written to {}",
            path.display()
        );
        // Written beside and renamed, so a run stopped halfway leaves no partial file under the name.
        let partial = path.with_extension(format!("partial-{}", std::process::id()));
        std::fs::write(&partial, BYTES)
            .with_context(|| format!("writing {}", partial.display()))?;
        std::fs::rename(&partial, &path)
            .with_context(|| format!("renaming {} to {}", partial.display(), path.display()))?;
    }
    Ok(path)
}
