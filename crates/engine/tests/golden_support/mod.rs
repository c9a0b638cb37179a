//! Reading the reference goldens of `tests/golden/` (format: tests/golden/README.md) and
//! regenerating the model files they were made from.

use std::collections::HashMap;
use std::path::{Path, PathBuf};

use redlite_engine::model::DeltaNetLayout;
use redlite_engine::synth::{write_synth, Preset, Recipe, SynthOptions, VocabChoice};
use sha2::{Digest, Sha256};

pub fn golden_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../../tests/golden")
}

pub enum Data {
    F32(Vec<f32>),
    I32(Vec<i32>),
}

pub struct Entry {
    pub shape: Vec<usize>,
    pub data: Data,
}

impl Entry {
    pub fn f32(&self) -> &[f32] {
        match &self.data {
            Data::F32(v) => v,
            Data::I32(_) => panic!("entry holds i32"),
        }
    }
    pub fn i32(&self) -> &[i32] {
        match &self.data {
            Data::I32(v) => v,
            Data::F32(_) => panic!("entry holds f32"),
        }
    }
}

/// All entries of a `.bin` golden file.
pub fn read_golden(path: &Path) -> HashMap<String, Entry> {
    let bytes = std::fs::read(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    assert_eq!(&bytes[..8], b"RLGOLD1\n", "{}: bad magic", path.display());
    let u32_at = |at: usize| u32::from_le_bytes(bytes[at..at + 4].try_into().unwrap());
    assert_eq!(u32_at(8), 1, "golden version");
    let count = u32_at(12) as usize;
    let mut at = 16;
    let mut out = HashMap::new();
    for _ in 0..count {
        let name_len = u16::from_le_bytes(bytes[at..at + 2].try_into().unwrap()) as usize;
        at += 2;
        let name = String::from_utf8(bytes[at..at + name_len].to_vec()).unwrap();
        at += name_len;
        let (dtype, ndim) = (bytes[at], bytes[at + 1] as usize);
        at += 2;
        let shape: Vec<usize> = (0..ndim).map(|d| u32_at(at + 4 * d) as usize).collect();
        at += 4 * ndim;
        let nbytes = u64::from_le_bytes(bytes[at..at + 8].try_into().unwrap()) as usize;
        at += 8;
        let raw = &bytes[at..at + nbytes];
        at += nbytes;
        let data = match dtype {
            0 => Data::F32(
                raw.chunks_exact(4)
                    .map(|c| f32::from_le_bytes(c.try_into().unwrap()))
                    .collect(),
            ),
            1 => Data::I32(
                raw.chunks_exact(4)
                    .map(|c| i32::from_le_bytes(c.try_into().unwrap()))
                    .collect(),
            ),
            other => panic!("unknown dtype {other}"),
        };
        out.insert(name, Entry { shape, data });
    }
    out
}

/// Options equivalent to the manifest's `synth_args` (`--preset tiny --vocab tiny --seed N
/// --recipe R [--layout legacy] [--mtp]`).
pub fn options_from_args(args: &[String]) -> SynthOptions {
    let value = |flag: &str| {
        args.iter()
            .position(|a| a == flag)
            .map(|i| args[i + 1].clone())
    };
    assert_eq!(value("--preset").as_deref(), Some("tiny"));
    assert_eq!(value("--vocab").as_deref(), Some("tiny"));
    let mut config = Preset::Tiny.config();
    if value("--layout").as_deref() == Some("legacy") {
        config.layout = DeltaNetLayout::Legacy;
    }
    config.n_mtp = usize::from(args.iter().any(|a| a == "--mtp"));
    SynthOptions {
        config,
        recipe: Recipe::parse(&value("--recipe").unwrap()).unwrap(),
        vocab: VocabChoice::Tiny,
        seed: value("--seed").unwrap().parse().unwrap(),
    }
}

/// Writes the model and checks its digest against the manifest.
pub fn regenerate(dir: &Path, name: &str, args: &[String], sha256: &str) -> PathBuf {
    let path = dir.join(format!("{name}.gguf"));
    write_synth(&path, &options_from_args(args), &mut |_, _| {}).unwrap();
    let digest: String = Sha256::digest(std::fs::read(&path).unwrap())
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect();
    assert_eq!(
        digest, sha256,
        "{name}: `redlite synth` no longer writes the file the goldens were made from; regenerate them (scripts/reference/make_goldens.sh)"
    );
    path
}

/// Relative L2 distance `|a - b| / |b|`.
pub fn rel_l2(a: &[f32], b: &[f32]) -> f64 {
    let num: f64 = a
        .iter()
        .zip(b)
        .map(|(x, y)| (f64::from(*x) - f64::from(*y)).powi(2))
        .sum();
    let den: f64 = b.iter().map(|y| f64::from(*y).powi(2)).sum();
    (num / den.max(1e-30)).sqrt()
}
