//! The embedded default model: written to the cache on first use, reused after, and the
//! trained demo model (its perplexity on held-out chapters is far below a random model's).

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

/// A cache directory of this test's own (removed by the guard).
struct Cache(PathBuf);

impl Drop for Cache {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

fn redlite(cache: &Path, args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_redlite"))
        .env("REDLITE_CACHE", cache)
        .args(args)
        .output()
        .unwrap()
}

fn text(bytes: &[u8]) -> String {
    String::from_utf8_lossy(bytes).into_owned()
}

#[test]
fn the_default_model_is_the_trained_demo() {
    let cache = Cache(std::env::temp_dir().join(format!("redlite-default-{}", std::process::id())));
    // Held-out chapters (every 20th chapter was kept out of training; tools/train/corpus.sh).
    let excerpt = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/tests/data/kjv-heldout-excerpt.txt"
    );
    let out = redlite(&cache.0, &["perplexity", "-f", excerpt, "--ctx", "256"]);
    assert!(
        out.status.success(),
        "perplexity failed: {}",
        text(&out.stderr)
    );
    assert!(
        text(&out.stderr).contains("no model given: using redlite's demo model"),
        "the first use says where the default model went: {}",
        text(&out.stderr)
    );
    let stdout = text(&out.stdout);
    let ppl: f64 = stdout
        .split("PPL = ")
        .nth(1)
        .and_then(|rest| rest.split_whitespace().next())
        .and_then(|v| v.parse().ok())
        .unwrap_or_else(|| panic!("no perplexity in {stdout:?}"));
    // The demo model scores ~30 on held-out text at 512 tokens (tools/train/README.md); a
    // model with random weights scores around its vocabulary size, 4,096.
    assert!(
        ppl < 100.0,
        "perplexity {ppl}: the default model is not the trained one"
    );

    // The second use finds the file in the cache and says nothing about it.
    let prompt = "In the beginning God created";
    let out = redlite(
        &cache.0,
        &["generate", "-p", prompt, "-n", "12", "--temp", "0"],
    );
    assert!(
        out.status.success(),
        "generate failed: {}",
        text(&out.stderr)
    );
    assert!(!text(&out.stderr).contains("no model given"));
    let generated = text(&out.stdout);
    assert!(
        generated.starts_with(prompt) && generated.len() > prompt.len() + 8,
        "generated {generated:?}"
    );
}
