//! Writing GGUF v3 files as a stream: the header first, then tensor data in table order,
//! so a 20 GB model is written without ever being held in memory.

use std::fs::File;
use std::io::{BufWriter, Write};
use std::path::{Path, PathBuf};

use crate::error::{GgufError, Result};
use crate::parse::{ALIGNMENT_KEY, DEFAULT_ALIGNMENT, GGUF_MAGIC};
use crate::tensor::TensorInfo;
use crate::types::GgmlType;
use crate::value::{Metadata, Value};

/// A tensor to be written: name, type and shape (outermost first).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TensorSpec {
    pub name: String,
    pub ty: GgmlType,
    pub shape: Vec<u64>,
}

impl TensorSpec {
    pub fn new(name: impl Into<String>, ty: GgmlType, shape: &[u64]) -> TensorSpec {
        TensorSpec {
            name: name.into(),
            ty,
            shape: shape.to_vec(),
        }
    }
}

/// Streams one GGUF file. Call [`GgufWriter::write_data`] with the bytes of every tensor in
/// table order (in any number of pieces), then [`GgufWriter::finish`].
pub struct GgufWriter<W: Write> {
    out: W,
    path: PathBuf,
    tensors: Vec<TensorInfo>,
    alignment: u64,
    /// Index of the tensor being filled.
    current: usize,
    /// Bytes of it written so far.
    filled: u64,
}

impl GgufWriter<BufWriter<File>> {
    /// Creates `path` and writes the header.
    pub fn create(
        path: impl AsRef<Path>,
        metadata: &Metadata,
        tensors: &[TensorSpec],
    ) -> Result<Self> {
        let path = path.as_ref();
        let file = File::create(path).map_err(|source| GgufError::Io {
            path: path.to_path_buf(),
            source,
        })?;
        GgufWriter::new(
            BufWriter::with_capacity(8 << 20, file),
            path,
            metadata,
            tensors,
        )
    }
}

impl<W: Write> GgufWriter<W> {
    /// Writes the header to `out`; `path` only names the destination in errors.
    pub fn new(out: W, path: &Path, metadata: &Metadata, tensors: &[TensorSpec]) -> Result<Self> {
        let alignment = match metadata.get(ALIGNMENT_KEY) {
            None => DEFAULT_ALIGNMENT,
            Some(v) => match v.as_u64() {
                Some(a) if a > 0 && a.is_power_of_two() => a,
                _ => {
                    return Err(GgufError::BadAlignment {
                        path: path.to_path_buf(),
                        found: v.as_u64().unwrap_or(0),
                    })
                }
            },
        };
        let mut infos = Vec::with_capacity(tensors.len());
        let mut offset = 0u64;
        for spec in tensors {
            let info =
                TensorInfo::new(spec.name.clone(), spec.ty, spec.shape.clone(), offset, path)?;
            offset += info.bytes.div_ceil(alignment) * alignment;
            infos.push(info);
        }
        let mut writer = GgufWriter {
            out,
            path: path.to_path_buf(),
            tensors: infos,
            alignment,
            current: 0,
            filled: 0,
        };
        let header = encode_header(metadata, &writer.tensors);
        let padded = (header.len() as u64).div_ceil(alignment) * alignment;
        writer.put(&header)?;
        writer.pad(padded - header.len() as u64)?;
        writer.skip_empty_tensors()?;
        Ok(writer)
    }

    /// The table as it is written (offsets relative to the data section).
    pub fn tensors(&self) -> &[TensorInfo] {
        &self.tensors
    }

    fn put(&mut self, bytes: &[u8]) -> Result<()> {
        self.out.write_all(bytes).map_err(|source| GgufError::Io {
            path: self.path.clone(),
            source,
        })
    }

    fn pad(&mut self, n: u64) -> Result<()> {
        const ZEROS: [u8; 64] = [0; 64];
        let mut left = n;
        while left > 0 {
            let k = left.min(ZEROS.len() as u64);
            self.put(&ZEROS[..k as usize])?;
            left -= k;
        }
        Ok(())
    }

    /// Moves past tensors that take no bytes (and pads after a completed one).
    fn skip_empty_tensors(&mut self) -> Result<()> {
        while self.current < self.tensors.len() && self.filled == self.tensors[self.current].bytes {
            let bytes = self.tensors[self.current].bytes;
            self.pad(bytes.div_ceil(self.alignment) * self.alignment - bytes)?;
            self.current += 1;
            self.filled = 0;
        }
        Ok(())
    }

    /// Appends tensor data; a piece may finish one tensor and start the next.
    pub fn write_data(&mut self, mut bytes: &[u8]) -> Result<()> {
        while !bytes.is_empty() {
            let Some(t) = self.tensors.get(self.current) else {
                return Err(GgufError::Write {
                    path: self.path.clone(),
                    problem: format!("{} bytes beyond the last tensor", bytes.len()),
                });
            };
            let room = t.bytes - self.filled;
            let n = room.min(bytes.len() as u64) as usize;
            self.put(&bytes[..n])?;
            self.filled += n as u64;
            bytes = &bytes[n..];
            self.skip_empty_tensors()?;
        }
        Ok(())
    }

    /// Name of the tensor the next bytes belong to, if any.
    pub fn current_tensor(&self) -> Option<&TensorInfo> {
        self.tensors.get(self.current)
    }

    /// Checks that every tensor got all its bytes and flushes.
    pub fn finish(mut self) -> Result<W> {
        if let Some(t) = self.tensors.get(self.current) {
            return Err(GgufError::Write {
                path: self.path.clone(),
                problem: format!(
                    "tensor {:?} got {} of its {} bytes",
                    t.name, self.filled, t.bytes
                ),
            });
        }
        self.out.flush().map_err(|source| GgufError::Io {
            path: self.path.clone(),
            source,
        })?;
        Ok(self.out)
    }
}

/// A whole file in memory, for tests: `tensors` pairs each spec with its bytes.
pub fn write_to_vec(metadata: &Metadata, tensors: &[(TensorSpec, Vec<u8>)]) -> Result<Vec<u8>> {
    let specs: Vec<TensorSpec> = tensors.iter().map(|(s, _)| s.clone()).collect();
    let mut w = GgufWriter::new(Vec::new(), Path::new("<memory>"), metadata, &specs)?;
    for (_, data) in tensors {
        w.write_data(data)?;
    }
    w.finish()
}

fn encode_header(metadata: &Metadata, tensors: &[TensorInfo]) -> Vec<u8> {
    let mut out = Vec::new();
    out.extend_from_slice(&GGUF_MAGIC);
    out.extend_from_slice(&3u32.to_le_bytes());
    out.extend_from_slice(&(tensors.len() as u64).to_le_bytes());
    out.extend_from_slice(&(metadata.len() as u64).to_le_bytes());
    for (key, value) in metadata.iter() {
        encode_string(&mut out, key);
        out.extend_from_slice(&(value.value_type() as u32).to_le_bytes());
        encode_value(&mut out, value);
    }
    for t in tensors {
        encode_string(&mut out, &t.name);
        out.extend_from_slice(&(t.shape.len() as u32).to_le_bytes());
        for d in t.ggml_shape() {
            out.extend_from_slice(&d.to_le_bytes());
        }
        out.extend_from_slice(&t.ty.id().to_le_bytes());
        out.extend_from_slice(&t.offset.to_le_bytes());
    }
    out
}

fn encode_string(out: &mut Vec<u8>, s: &str) {
    out.extend_from_slice(&(s.len() as u64).to_le_bytes());
    out.extend_from_slice(s.as_bytes());
}

fn encode_value(out: &mut Vec<u8>, value: &Value) {
    match value {
        Value::U8(v) => out.push(*v),
        Value::I8(v) => out.extend_from_slice(&v.to_le_bytes()),
        Value::U16(v) => out.extend_from_slice(&v.to_le_bytes()),
        Value::I16(v) => out.extend_from_slice(&v.to_le_bytes()),
        Value::U32(v) => out.extend_from_slice(&v.to_le_bytes()),
        Value::I32(v) => out.extend_from_slice(&v.to_le_bytes()),
        Value::F32(v) => out.extend_from_slice(&v.to_le_bytes()),
        Value::Bool(v) => out.push(u8::from(*v)),
        Value::String(s) => encode_string(out, s),
        Value::Array { item_type, items } => {
            out.extend_from_slice(&(*item_type as u32).to_le_bytes());
            out.extend_from_slice(&(items.len() as u64).to_le_bytes());
            for item in items {
                encode_value(out, item);
            }
        }
        Value::U64(v) => out.extend_from_slice(&v.to_le_bytes()),
        Value::I64(v) => out.extend_from_slice(&v.to_le_bytes()),
        Value::F64(v) => out.extend_from_slice(&v.to_le_bytes()),
    }
}
