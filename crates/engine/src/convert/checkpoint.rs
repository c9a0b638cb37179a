//! The tensors of a Hugging Face checkpoint: every `*.safetensors` file of a folder (one file
//! or shards), memory-mapped, each header read once; values read as f32.

use std::collections::HashMap;
use std::fs::File;
use std::path::{Path, PathBuf};

use half::{bf16, f16};
use memmap2::Mmap;
use safetensors::{Dtype, SafeTensors};

use crate::error::{EngineError, Result};

struct Entry {
    file: usize,
    dtype: Dtype,
    shape: Vec<usize>,
    /// Byte range in the file (header included).
    range: (usize, usize),
}

pub struct Checkpoint {
    maps: Vec<Mmap>,
    entries: HashMap<String, Entry>,
}

fn bad(what: String) -> EngineError {
    EngineError::Convert(what)
}

impl Checkpoint {
    pub fn open(dir: &Path) -> Result<Checkpoint> {
        let io = |path: &Path| {
            let path = path.to_path_buf();
            move |source| EngineError::Io { path, source }
        };
        let mut files: Vec<PathBuf> = std::fs::read_dir(dir)
            .map_err(io(dir))?
            .filter_map(|e| e.ok().map(|e| e.path()))
            .filter(|p| p.extension().is_some_and(|x| x == "safetensors"))
            .collect();
        files.sort();
        if files.is_empty() {
            return Err(bad(format!("no .safetensors file in {}", dir.display())));
        }
        let mut maps = Vec::new();
        let mut entries = HashMap::new();
        for (file, path) in files.iter().enumerate() {
            let handle = File::open(path).map_err(io(path))?;
            // SAFETY: the checkpoint is read-only input; a file changed underneath gives
            // wrong values, not undefined behaviour in this process's own memory.
            let map = unsafe { Mmap::map(&handle) }.map_err(io(path))?;
            let (header, metadata) = SafeTensors::read_metadata(&map)
                .map_err(|e| bad(format!("{}: {e}", path.display())))?;
            let data_start = 8 + header;
            for (name, info) in metadata.tensors() {
                let (begin, end) = info.data_offsets;
                if data_start + end > map.len() || begin > end {
                    return Err(bad(format!(
                        "{}: tensor {name} is truncated",
                        path.display()
                    )));
                }
                entries.insert(
                    name,
                    Entry {
                        file,
                        dtype: info.dtype,
                        shape: info.shape.clone(),
                        range: (data_start + begin, data_start + end),
                    },
                );
            }
            maps.push(map);
        }
        Ok(Checkpoint { maps, entries })
    }

    /// The stored name of `name`: the MTP block's tensors are `mtp.*` in Qwen's checkpoints
    /// and `model.mtp.*` in some re-saved ones.
    fn resolve<'a>(&'a self, name: &str) -> Option<&'a Entry> {
        self.entries
            .get(name)
            .or_else(|| self.entries.get(&format!("model.{name}")))
    }

    pub fn contains(&self, name: &str) -> bool {
        self.resolve(name).is_some()
    }

    /// MTP layers stored (`mtp.layers.N.*`): Qwen3-Next's config.json does not count them.
    pub fn mtp_layers(&self) -> usize {
        self.entries
            .keys()
            .filter_map(|k| {
                let k = k.strip_prefix("model.").unwrap_or(k);
                let rest = k.strip_prefix("mtp.layers.")?;
                rest.split('.').next()?.parse::<usize>().ok()
            })
            .map(|n| n + 1)
            .max()
            .unwrap_or(0)
    }

    /// The tensor's shape and values (F32, F16 and BF16 sources).
    pub fn read(&self, name: &str) -> Result<(Vec<usize>, Vec<f32>)> {
        let e = self
            .resolve(name)
            .ok_or_else(|| bad(format!("the checkpoint has no tensor {name}")))?;
        let bytes = &self.maps[e.file][e.range.0..e.range.1];
        let values: Vec<f32> = match e.dtype {
            Dtype::F32 => bytes
                .chunks_exact(4)
                .map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]]))
                .collect(),
            Dtype::F16 => bytes
                .chunks_exact(2)
                .map(|b| f16::from_le_bytes([b[0], b[1]]).to_f32())
                .collect(),
            Dtype::BF16 => bytes
                .chunks_exact(2)
                .map(|b| bf16::from_le_bytes([b[0], b[1]]).to_f32())
                .collect(),
            other => return Err(bad(format!("tensor {name} has dtype {other:?}"))),
        };
        if values.len() != e.shape.iter().product::<usize>() {
            return Err(bad(format!(
                "tensor {name}: byte length does not match its shape"
            )));
        }
        Ok((e.shape.clone(), values))
    }
}
