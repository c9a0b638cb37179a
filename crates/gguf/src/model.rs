//! A model as one GGUF file or as a set of split files (`NAME-00001-of-00003.gguf`), the
//! form in which community files of large models ship. Split files each carry a header;
//! the first one holds the model's metadata, every one holds `split.no`, `split.count` and
//! `split.tensors.count`.

use std::collections::HashMap;
use std::path::{Path, PathBuf};

use crate::error::{GgufError, Result};
use crate::file::GgufFile;
use crate::tensor::TensorInfo;
use crate::value::Metadata;

pub const SPLIT_NO: &str = "split.no";
pub const SPLIT_COUNT: &str = "split.count";
pub const SPLIT_TENSORS_COUNT: &str = "split.tensors.count";

/// Where one tensor of a model lives: resolve a name once, then read its bytes without a
/// lookup on the hot path.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct TensorRef {
    file: usize,
    index: usize,
}

/// A model read from one or more GGUF files.
pub struct GgufModel {
    files: Vec<GgufFile>,
    /// Tensors of all files in file order.
    order: Vec<TensorRef>,
    by_name: HashMap<String, TensorRef>,
}

/// For `X-0000k-of-0000n.gguf`, the paths of all n parts; `None` for a plain file name.
pub fn split_paths(path: &Path) -> Option<Vec<PathBuf>> {
    let name = path.file_name()?.to_str()?;
    let stem = name.strip_suffix(".gguf")?;
    // "-00001-of-00003" is 15 characters.
    if stem.len() < 15 || !stem.is_char_boundary(stem.len() - 15) {
        return None;
    }
    let (prefix, tail) = stem.split_at(stem.len() - 15);
    let tail = tail.as_bytes();
    let digits = |s: &[u8]| s.iter().all(u8::is_ascii_digit);
    if tail[0] != b'-' || &tail[6..10] != b"-of-" || !digits(&tail[1..6]) || !digits(&tail[10..15])
    {
        return None;
    }
    let count: usize = std::str::from_utf8(&tail[10..15]).ok()?.parse().ok()?;
    if count == 0 {
        return None;
    }
    let dir = path.parent().unwrap_or(Path::new(""));
    Some(
        (1..=count)
            .map(|k| dir.join(format!("{prefix}-{k:05}-of-{count:05}.gguf")))
            .collect(),
    )
}

impl GgufModel {
    /// Opens a file; a name of the split form opens every part of the set.
    pub fn open(path: impl AsRef<Path>) -> Result<GgufModel> {
        let path = path.as_ref();
        let files = match split_paths(path) {
            None => vec![GgufFile::open(path)?],
            Some(parts) => {
                let mut files = Vec::with_capacity(parts.len());
                for part in &parts {
                    if !part.exists() {
                        return Err(GgufError::Split {
                            path: path.to_path_buf(),
                            problem: format!(
                                "part {} of {} is missing",
                                part.display(),
                                parts.len()
                            ),
                        });
                    }
                    files.push(GgufFile::open(part)?);
                }
                files
            }
        };
        GgufModel::from_files(files)
    }

    /// Joins already-opened files (in split order).
    pub fn from_files(files: Vec<GgufFile>) -> Result<GgufModel> {
        if files.len() > 1 {
            check_split_set(&files)?;
        }
        let mut order = Vec::new();
        let mut by_name = HashMap::new();
        for (file_index, file) in files.iter().enumerate() {
            for (index, t) in file.tensors().iter().enumerate() {
                let r = TensorRef {
                    file: file_index,
                    index,
                };
                if by_name.insert(t.name.clone(), r).is_some() {
                    return Err(GgufError::DuplicateTensor {
                        path: file.path().to_path_buf(),
                        name: t.name.clone(),
                    });
                }
                order.push(r);
            }
        }
        Ok(GgufModel {
            files,
            order,
            by_name,
        })
    }

    /// The model's metadata (the first file's).
    pub fn metadata(&self) -> &Metadata {
        self.files[0].metadata()
    }

    pub fn files(&self) -> &[GgufFile] {
        &self.files
    }

    /// Every tensor, in file order.
    pub fn tensors(&self) -> impl Iterator<Item = &TensorInfo> {
        self.order
            .iter()
            .map(|r| &self.files[r.file].tensors()[r.index])
    }

    pub fn tensor_count(&self) -> usize {
        self.order.len()
    }

    pub fn tensor(&self, name: &str) -> Option<&TensorInfo> {
        self.by_name
            .get(name)
            .map(|r| &self.files[r.file].tensors()[r.index])
    }

    /// A tensor that must exist.
    pub fn require(&self, name: &str) -> Result<&TensorInfo> {
        self.tensor(name).ok_or_else(|| GgufError::MissingTensor {
            name: name.to_string(),
        })
    }

    /// Resolves a name to a reference usable with [`GgufModel::data`].
    pub fn locate(&self, name: &str) -> Option<TensorRef> {
        self.by_name.get(name).copied()
    }

    /// The table entry of a located tensor.
    pub fn info(&self, r: TensorRef) -> &TensorInfo {
        &self.files[r.file].tensors()[r.index]
    }

    /// The bytes of a located tensor, without copying.
    pub fn data(&self, r: TensorRef) -> &[u8] {
        let file = &self.files[r.file];
        file.tensor_data(&file.tensors()[r.index])
    }

    /// The bytes of a named tensor, without copying.
    pub fn tensor_data(&self, name: &str) -> Result<&[u8]> {
        let r = self
            .by_name
            .get(name)
            .ok_or_else(|| GgufError::MissingTensor {
                name: name.to_string(),
            })?;
        let file = &self.files[r.file];
        Ok(file.tensor_data(&file.tensors()[r.index]))
    }

    /// Total bytes of all files.
    pub fn file_bytes(&self) -> u64 {
        self.files.iter().map(GgufFile::len).sum()
    }
}

fn check_split_set(files: &[GgufFile]) -> Result<()> {
    let n = files.len() as u64;
    let total: u64 = files.iter().map(|f| f.tensors().len() as u64).sum();
    for (k, file) in files.iter().enumerate() {
        let problem = |problem: String| GgufError::Split {
            path: file.path().to_path_buf(),
            problem,
        };
        let md = file.metadata();
        let no = md.u64(SPLIT_NO)?;
        let count = md.u64(SPLIT_COUNT)?;
        if no != k as u64 {
            return Err(problem(format!("{SPLIT_NO} is {no}, expected {k}")));
        }
        if count != n {
            return Err(problem(format!("{SPLIT_COUNT} is {count}, expected {n}")));
        }
        if k == 0 {
            let claimed = md.u64(SPLIT_TENSORS_COUNT)?;
            if claimed != total {
                return Err(problem(format!(
                    "{SPLIT_TENSORS_COUNT} is {claimed}, the parts hold {total} tensors"
                )));
            }
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn split_names() {
        let parts = split_paths(Path::new("/m/Qwen-IQ2_XXS-00002-of-00003.gguf")).unwrap();
        assert_eq!(parts.len(), 3);
        assert_eq!(parts[0], Path::new("/m/Qwen-IQ2_XXS-00001-of-00003.gguf"));
        assert!(split_paths(Path::new("plain.gguf")).is_none());
        assert!(split_paths(Path::new("x-00001-of-00000.gguf")).is_none());
        assert!(split_paths(Path::new("x-0000a-of-00002.gguf")).is_none());
    }
}
