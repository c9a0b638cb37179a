//! The on-disk kernel cache: one CUBIN and one kernel-name file per compiled module, keyed
//! by a hash of everything that decides the output (source, architecture, options,
//! exported kernels, NVRTC version). Entries are never edited, only added, so a stale one
//! is simply never looked up again.

use crate::error::CudaError;
use crate::raw::Compiled;
use sha2::{Digest, Sha256};
use std::fs;
use std::path::{Path, PathBuf};

/// `$REDLITE_CUDA_CACHE`, else `$XDG_CACHE_HOME/redlite/cuda`, else
/// `$HOME/.cache/redlite/cuda`; `None` (no caching) when none is set or the first is empty.
pub fn cache_dir() -> Option<PathBuf> {
    let non_empty = |name: &str| std::env::var_os(name).filter(|v| !v.is_empty());
    if let Some(dir) = std::env::var_os("REDLITE_CUDA_CACHE") {
        return (!dir.is_empty()).then(|| PathBuf::from(dir));
    }
    if let Some(dir) = non_empty("XDG_CACHE_HOME") {
        return Some(PathBuf::from(dir).join("redlite").join("cuda"));
    }
    non_empty("HOME").map(|home| PathBuf::from(home).join(".cache/redlite/cuda"))
}

pub(crate) fn cache_key(
    source: &str,
    arch: &str,
    options: &[String],
    kernels: &[String],
    nvrtc_version: (i32, i32),
) -> String {
    let mut hasher = Sha256::new();
    for part in [source, arch] {
        hasher.update(part.as_bytes());
        hasher.update([0]);
    }
    for part in options.iter().chain(kernels) {
        hasher.update(part.as_bytes());
        hasher.update([0]);
    }
    hasher.update(format!("nvrtc {}.{}", nvrtc_version.0, nvrtc_version.1).as_bytes());
    hasher
        .finalize()
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect()
}

fn paths(dir: &Path, key: &str) -> (PathBuf, PathBuf) {
    (
        dir.join(format!("{key}.cubin")),
        dir.join(format!("{key}.names")),
    )
}

/// The cached module, or `None` when absent, unreadable or not the kernels asked for.
pub(crate) fn load(dir: &Path, key: &str, kernels: &[String]) -> Option<Compiled> {
    let (image_path, names_path) = paths(dir, key);
    let image = fs::read(image_path).ok()?;
    let names = fs::read_to_string(names_path).ok()?;
    let lowered: Vec<(String, String)> = names
        .lines()
        .filter_map(|line| line.split_once('\t'))
        .map(|(expr, name)| (expr.to_string(), name.to_string()))
        .collect();
    let complete = lowered.len() == kernels.len()
        && lowered.iter().zip(kernels).all(|((expr, _), k)| expr == k);
    (complete && !image.is_empty()).then_some(Compiled {
        image,
        lowered,
        log: String::new(),
    })
}

/// Writes an entry: each file goes to a temporary name first and is renamed into place,
/// so a concurrent reader sees a whole file or none; the names file lands last.
pub(crate) fn store(dir: &Path, key: &str, compiled: &Compiled) -> Result<(), CudaError> {
    let io = |path: &Path| {
        let path = path.to_path_buf();
        move |source| CudaError::Cache { path, source }
    };
    fs::create_dir_all(dir).map_err(io(dir))?;
    let (image_path, names_path) = paths(dir, key);
    let names: String = compiled
        .lowered
        .iter()
        .map(|(expr, name)| format!("{expr}\t{name}\n"))
        .collect();
    for (path, bytes) in [
        (&image_path, compiled.image.as_slice()),
        (&names_path, names.as_bytes()),
    ] {
        let temporary = path.with_extension(format!("tmp{}", std::process::id()));
        fs::write(&temporary, bytes).map_err(io(&temporary))?;
        fs::rename(&temporary, path).map_err(io(path))?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn store_then_load_round_trips() {
        let dir = std::env::temp_dir().join(format!("redlite-cuda-cache-{}", std::process::id()));
        let kernels = vec!["k<A, 4, true>".to_string()];
        let compiled = Compiled {
            image: vec![1, 2, 3],
            lowered: vec![(kernels[0].clone(), "_Z1kI1ALi4ELb1EEvv".to_string())],
            log: String::new(),
        };
        let key = cache_key("src", "sm_90", &[], &kernels, (13, 0));
        assert_ne!(key, cache_key("src", "sm_80", &[], &kernels, (13, 0)));
        assert_ne!(key, cache_key("src", "sm_90", &[], &kernels, (13, 1)));
        assert!(load(&dir, &key, &kernels).is_none());
        store(&dir, &key, &compiled).unwrap();
        assert_eq!(load(&dir, &key, &kernels), Some(compiled));
        assert!(load(&dir, &key, &["other".to_string()]).is_none());
        fs::remove_dir_all(&dir).unwrap();
    }
}
