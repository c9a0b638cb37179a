//! Parsing the header of one GGUF file (magic, metadata, tensor table) from its bytes.
//!
//! Every count read from the file is bounded by the bytes that remain before anything is
//! allocated, so a header claiming 2^60 tensors is refused instead of exhausting memory.

use std::path::{Path, PathBuf};

use crate::error::{GgufError, Result};
use crate::tensor::TensorInfo;
use crate::types::GgmlType;
use crate::value::{Metadata, Value, ValueType};

pub const GGUF_MAGIC: [u8; 4] = *b"GGUF";
pub const DEFAULT_ALIGNMENT: u64 = 32;
pub const ALIGNMENT_KEY: &str = "general.alignment";
/// ggml tensors have at most 4 dimensions.
pub const MAX_DIMS: u32 = 4;
const MAX_ARRAY_NESTING: usize = 8;

/// What the header of one file says.
#[derive(Debug)]
pub struct Header {
    pub version: u32,
    pub metadata: Metadata,
    /// Tensors in file order; offsets are relative to `data_offset`.
    pub tensors: Vec<TensorInfo>,
    pub alignment: u64,
    /// Absolute offset of the data section in the file.
    pub data_offset: u64,
}

struct Cursor<'a> {
    bytes: &'a [u8],
    pos: usize,
    path: &'a Path,
}

impl<'a> Cursor<'a> {
    fn remaining(&self) -> u64 {
        (self.bytes.len() - self.pos) as u64
    }

    fn take(&mut self, n: u64, what: &dyn Fn() -> String) -> Result<&'a [u8]> {
        if n > self.remaining() {
            return Err(GgufError::Truncated {
                path: self.path.to_path_buf(),
                what: what(),
                offset: self.pos as u64,
                needed: n,
                available: self.remaining(),
            });
        }
        // n <= remaining <= usize::MAX, so the cast is exact.
        let start = self.pos;
        self.pos += n as usize;
        Ok(&self.bytes[start..self.pos])
    }

    fn array<const N: usize>(&mut self, what: &dyn Fn() -> String) -> Result<[u8; N]> {
        let slice = self.take(N as u64, what)?;
        let mut out = [0u8; N];
        out.copy_from_slice(slice);
        Ok(out)
    }

    fn u32(&mut self, what: &dyn Fn() -> String) -> Result<u32> {
        Ok(u32::from_le_bytes(self.array(what)?))
    }

    fn u64(&mut self, what: &dyn Fn() -> String) -> Result<u64> {
        Ok(u64::from_le_bytes(self.array(what)?))
    }

    /// A count of items each at least `min_item_bytes` long, checked against what remains.
    /// (GGUF v2 and v3 both store counts and lengths as u64.)
    fn count(&mut self, min_item_bytes: u64, what: &dyn Fn() -> String) -> Result<u64> {
        let count = self.u64(what)?;
        let limit = self.remaining() / min_item_bytes.max(1);
        if count > limit {
            return Err(GgufError::CountTooLarge {
                path: self.path.to_path_buf(),
                what: what(),
                count,
                limit,
            });
        }
        Ok(count)
    }

    fn string(&mut self, what: &dyn Fn() -> String) -> Result<String> {
        let len = self.count(1, what)?;
        let bytes = self.take(len, what)?;
        String::from_utf8(bytes.to_vec()).map_err(|_| GgufError::BadUtf8 {
            path: self.path.to_path_buf(),
            what: what(),
        })
    }

    fn value(&mut self, ty: ValueType, key: &str, depth: usize) -> Result<Value> {
        let what = || format!("the value of {key:?}");
        Ok(match ty {
            ValueType::U8 => Value::U8(self.array::<1>(&what)?[0]),
            ValueType::I8 => Value::I8(i8::from_le_bytes(self.array(&what)?)),
            ValueType::U16 => Value::U16(u16::from_le_bytes(self.array(&what)?)),
            ValueType::I16 => Value::I16(i16::from_le_bytes(self.array(&what)?)),
            ValueType::U32 => Value::U32(u32::from_le_bytes(self.array(&what)?)),
            ValueType::I32 => Value::I32(i32::from_le_bytes(self.array(&what)?)),
            ValueType::F32 => Value::F32(f32::from_le_bytes(self.array(&what)?)),
            ValueType::Bool => Value::Bool(self.array::<1>(&what)?[0] != 0),
            ValueType::String => Value::String(self.string(&what)?),
            ValueType::U64 => Value::U64(u64::from_le_bytes(self.array(&what)?)),
            ValueType::I64 => Value::I64(i64::from_le_bytes(self.array(&what)?)),
            ValueType::F64 => Value::F64(f64::from_le_bytes(self.array(&what)?)),
            ValueType::Array => {
                if depth >= MAX_ARRAY_NESTING {
                    return Err(GgufError::NestingTooDeep {
                        path: self.path.to_path_buf(),
                        key: key.to_string(),
                        limit: MAX_ARRAY_NESTING,
                    });
                }
                let item_type = self.value_type(key)?;
                let count = self.count(item_type.min_encoded_bytes(), &|| {
                    format!("the array length of {key:?}")
                })?;
                let mut items = Vec::with_capacity(count as usize);
                for _ in 0..count {
                    items.push(self.value(item_type, key, depth + 1)?);
                }
                Value::Array { item_type, items }
            }
        })
    }

    fn value_type(&mut self, key: &str) -> Result<ValueType> {
        let id = self.u32(&|| format!("the value type of {key:?}"))?;
        ValueType::from_id(id).ok_or_else(|| GgufError::UnknownValueType {
            path: self.path.to_path_buf(),
            key: key.to_string(),
            found: id,
        })
    }
}

/// Parses the header of `bytes` (a whole file) and validates the tensor table against the
/// file's length.
pub fn parse_header(bytes: &[u8], path: &Path) -> Result<Header> {
    let mut cur = Cursor {
        bytes,
        pos: 0,
        path,
    };
    let magic: [u8; 4] = cur.array(&|| "the magic".to_string())?;
    if magic != GGUF_MAGIC {
        return Err(GgufError::BadMagic {
            path: path.to_path_buf(),
            found: magic,
        });
    }
    let version = cur.u32(&|| "the version".to_string())?;
    if version != 2 && version != 3 {
        return Err(GgufError::UnsupportedVersion {
            path: path.to_path_buf(),
            found: version,
        });
    }
    // A tensor entry takes at least 8 (name length) + 4 + 8 + 4 + 8 bytes; a KV at least 8 + 4 + 1.
    let n_tensors = cur.count(32, &|| "the tensor count".to_string())?;
    let n_kv = cur.count(13, &|| "the metadata count".to_string())?;

    let mut metadata = Metadata::new();
    for i in 0..n_kv {
        let key = cur.string(&|| format!("metadata key #{i}"))?;
        if metadata.contains(&key) {
            return Err(GgufError::DuplicateKey {
                path: path.to_path_buf(),
                key,
            });
        }
        let ty = cur.value_type(&key)?;
        let value = cur.value(ty, &key, 0)?;
        metadata.set(key, value);
    }

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

    let mut tensors = Vec::with_capacity(n_tensors as usize);
    for i in 0..n_tensors {
        tensors.push(read_tensor_info(&mut cur, i, alignment)?);
    }
    let data_offset = (cur.pos as u64).div_ceil(alignment) * alignment;
    let data_len = (bytes.len() as u64).saturating_sub(data_offset);
    check_tensor_placement(&mut tensors, data_len, path)?;
    Ok(Header {
        version,
        metadata,
        tensors,
        alignment,
        data_offset,
    })
}

fn read_tensor_info(cur: &mut Cursor<'_>, index: u64, alignment: u64) -> Result<TensorInfo> {
    let path = cur.path.to_path_buf();
    let name = cur.string(&|| format!("the name of tensor #{index}"))?;
    let n_dims = cur.u32(&|| format!("the dimension count of {name:?}"))?;
    if n_dims == 0 || n_dims > MAX_DIMS {
        return Err(GgufError::BadDimensionCount {
            path,
            tensor: name,
            found: n_dims,
            limit: MAX_DIMS,
        });
    }
    let mut ne = Vec::with_capacity(n_dims as usize);
    for d in 0..n_dims {
        ne.push(cur.u64(&|| format!("dimension {d} of {name:?}"))?);
    }
    let type_id = cur.u32(&|| format!("the type of {name:?}"))?;
    let ty = GgmlType::from_id(type_id).ok_or_else(|| GgufError::UnknownTensorType {
        path: path.clone(),
        tensor: name.clone(),
        found: type_id,
    })?;
    let offset = cur.u64(&|| format!("the offset of {name:?}"))?;
    if !offset.is_multiple_of(alignment) {
        return Err(GgufError::MisalignedTensor {
            path,
            tensor: name,
            offset,
            alignment,
        });
    }
    // The file stores the fastest-varying dimension first; we keep outermost first.
    ne.reverse();
    TensorInfo::new(name, ty, ne, offset, &path)
}

/// Refuses tensors outside the data section and tensors whose bytes overlap.
fn check_tensor_placement(tensors: &mut [TensorInfo], data_len: u64, path: &Path) -> Result<()> {
    let mut names = std::collections::HashSet::with_capacity(tensors.len());
    for t in tensors.iter() {
        if !names.insert(t.name.as_str()) {
            return Err(GgufError::DuplicateTensor {
                path: path.to_path_buf(),
                name: t.name.clone(),
            });
        }
        let end = t.offset.checked_add(t.bytes);
        match end {
            Some(end) if end <= data_len => {}
            _ => {
                return Err(GgufError::TensorOutOfBounds {
                    path: path.to_path_buf(),
                    tensor: t.name.clone(),
                    start: t.offset,
                    end: end.unwrap_or(u64::MAX),
                    data_len,
                })
            }
        }
    }
    let mut order: Vec<usize> = (0..tensors.len()).collect();
    order.sort_by_key(|&i| tensors[i].offset);
    for pair in order.windows(2) {
        let (a, b) = (&tensors[pair[0]], &tensors[pair[1]]);
        if a.bytes > 0 && b.bytes > 0 && a.offset + a.bytes > b.offset {
            return Err(GgufError::TensorsOverlap {
                path: path.to_path_buf(),
                first: a.name.clone(),
                second: b.name.clone(),
            });
        }
    }
    Ok(())
}

/// A path for error messages when bytes did not come from a file.
pub fn memory_path() -> PathBuf {
    PathBuf::from("<memory>")
}
