//! One GGUF file: its parsed header over its bytes (a memory map, or owned bytes in tests).

use std::fs::File;
use std::path::{Path, PathBuf};

use memmap2::Mmap;

use crate::error::{GgufError, Result};
use crate::parse::{memory_path, parse_header, Header};
use crate::tensor::TensorInfo;
use crate::value::Metadata;

enum Bytes {
    Mapped(Mmap),
    Owned(Vec<u8>),
}

impl Bytes {
    fn as_slice(&self) -> &[u8] {
        match self {
            Bytes::Mapped(m) => m,
            Bytes::Owned(v) => v,
        }
    }
}

/// One GGUF file.
pub struct GgufFile {
    path: PathBuf,
    bytes: Bytes,
    header: Header,
}

impl GgufFile {
    /// Maps a file and parses its header. Nothing of the tensor data is read.
    pub fn open(path: impl AsRef<Path>) -> Result<GgufFile> {
        let path = path.as_ref().to_path_buf();
        let io = |source| GgufError::Io {
            path: path.clone(),
            source,
        };
        let file = File::open(&path).map_err(io)?;
        // SAFETY: the map is read-only and lives as long as the views borrowed from it; a file
        // changed by another process while mapped is outside what any mmap reader can guard.
        let map = unsafe { Mmap::map(&file) }.map_err(io)?;
        let header = parse_header(&map, &path)?;
        Ok(GgufFile {
            path,
            bytes: Bytes::Mapped(map),
            header,
        })
    }

    /// Parses a file held in memory (tests, fuzzing).
    pub fn from_bytes(bytes: Vec<u8>) -> Result<GgufFile> {
        let path = memory_path();
        let header = parse_header(&bytes, &path)?;
        Ok(GgufFile {
            path,
            bytes: Bytes::Owned(bytes),
            header,
        })
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    pub fn version(&self) -> u32 {
        self.header.version
    }

    pub fn metadata(&self) -> &Metadata {
        &self.header.metadata
    }

    pub fn tensors(&self) -> &[TensorInfo] {
        &self.header.tensors
    }

    pub fn alignment(&self) -> u64 {
        self.header.alignment
    }

    /// Absolute offset of the data section.
    pub fn data_offset(&self) -> u64 {
        self.header.data_offset
    }

    /// Size of the whole file in bytes.
    pub fn len(&self) -> u64 {
        self.bytes.as_slice().len() as u64
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The bytes of a tensor of this file, without copying. Placement was validated when the
    /// header was parsed, so the range is inside the file.
    pub fn tensor_data(&self, tensor: &TensorInfo) -> &[u8] {
        let all = self.bytes.as_slice();
        let start = (self.header.data_offset + tensor.offset) as usize;
        let end = start + tensor.bytes as usize;
        all.get(start..end).unwrap_or(&[])
    }
}
