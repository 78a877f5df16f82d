//! Parses and validates a GGUF header (metadata and tensor infos) from file bytes.
//!
//! The parser touches only the header; tensor data is never read, only its ranges are
//! checked against the file length. Nothing is allocated for a count before the count
//! is checked against the bytes that remain (each element takes at least
//! `ValueType::min_size` bytes), so a crafted file cannot make the reader reserve more
//! than a small multiple of its own size.

use std::collections::HashMap;

use super::cursor::Cursor;
use super::error::GgufError;
use super::metadata::Metadata;
use super::tensor::{TensorInfo, MAX_DIMS};
use super::value::{Value, ValueType};
use crate::quant::GgmlType;

pub(crate) const MAGIC: &[u8; 4] = b"GGUF";
pub(crate) const DEFAULT_ALIGNMENT: u64 = 32;
pub(crate) const ALIGNMENT_KEY: &str = "general.alignment";
/// Deepest array nesting accepted (an array of arrays is depth 2).
pub(crate) const MAX_ARRAY_DEPTH: u32 = 4;

/// Smallest metadata entry: empty key (u64 length), value type (u32), one-byte value.
const MIN_KV_SIZE: u64 = 8 + 4 + 1;
/// Smallest tensor info: empty name, n_dims, one dim, type, offset.
const MIN_TENSOR_INFO_SIZE: u64 = 8 + 4 + 8 + 4 + 8;

/// Everything the header says, validated against the file length.
#[derive(Debug)]
pub(crate) struct Header {
    pub version: u32,
    pub metadata: Metadata,
    pub tensors: Vec<TensorInfo>,
    pub index: HashMap<String, usize>,
    pub alignment: u64,
    pub data_offset: u64,
}

pub(crate) fn parse(buf: &[u8]) -> Result<Header, GgufError> {
    let mut c = Cursor::new(buf);
    let magic = c.take(4, || "magic".into())?;
    if magic != MAGIC {
        return Err(GgufError::BadMagic);
    }
    let version = read_version(&mut c)?;

    let tensor_count = read_count(&mut c, "tensor count", "tensor infos", MIN_TENSOR_INFO_SIZE)?;
    let kv_count = read_count(&mut c, "metadata entry count", "entries", MIN_KV_SIZE)?;

    let metadata = read_metadata(&mut c, kv_count)?;
    let raw = read_tensor_infos(&mut c, tensor_count)?;

    let alignment = alignment(&metadata)?;
    let data_offset = align_up(c.pos(), alignment).ok_or_else(|| GgufError::BadAlignment {
        reason: format!("data section offset overflows with alignment {alignment}"),
    })?;
    let file_len = buf.len() as u64;

    let mut tensors = Vec::with_capacity(raw.len());
    let mut index = HashMap::with_capacity(raw.len());
    for t in raw {
        let info = place_tensor(t, alignment, data_offset, file_len)?;
        if index.contains_key(&info.name) {
            return Err(GgufError::DuplicateTensor(info.name));
        }
        index.insert(info.name.clone(), tensors.len());
        tensors.push(info);
    }

    Ok(Header {
        version,
        metadata,
        tensors,
        index,
        alignment,
        data_offset,
    })
}

fn read_version(c: &mut Cursor<'_>) -> Result<u32, GgufError> {
    let version = c.u32(|| "version".into())?;
    match version {
        2 | 3 => Ok(version),
        // A big-endian writer stores 3 as 00 00 00 03, which reads as 0x0300_0000.
        v if (1..=3).contains(&v.swap_bytes()) => Err(GgufError::BigEndian(v.swap_bytes())),
        v => Err(GgufError::UnsupportedVersion(v)),
    }
}

/// Reads a u64 count whose entries take at least `min_size` bytes each, and checks that
/// that many entries can fit in what is left of the file.
fn read_count(
    c: &mut Cursor<'_>,
    field: &str,
    entries: &str,
    min_size: u64,
) -> Result<usize, GgufError> {
    let at = c.pos();
    let count = c.u64(|| field.into())?;
    fits(count, min_size, c.remaining())
        .then_some(count as usize)
        .ok_or_else(|| GgufError::Truncated {
            what: format!("{field} {count} ({entries} of at least {min_size} bytes each)"),
            offset: at,
        })
}

/// Whether `count` entries of at least `min_size` bytes fit in `remaining` bytes (and so
/// also in a `usize`, since `remaining` came from a slice length).
fn fits(count: u64, min_size: u64, remaining: u64) -> bool {
    count <= remaining / min_size
}

fn read_metadata(c: &mut Cursor<'_>, kv_count: usize) -> Result<Metadata, GgufError> {
    let mut metadata = Metadata::with_capacity(kv_count);
    for i in 0..kv_count {
        let key_at = c.pos();
        let key = c.string(|| format!("key of metadata entry {i}"))?;
        let type_at = c.pos();
        let type_id = c.u32(|| format!("value type of `{key}`"))?;
        let ty = ValueType::from_id(type_id).ok_or_else(|| GgufError::UnknownValueType {
            key: key.to_owned(),
            type_id,
            offset: type_at,
        })?;
        let value = read_value(c, ty, key, 0)?;
        if metadata.contains_key(key) {
            return Err(GgufError::DuplicateKey {
                key: key.to_owned(),
                offset: key_at,
            });
        }
        metadata.insert(key, value);
    }
    Ok(metadata)
}

/// Reads one value of type `ty`; `depth` is how many arrays enclose it.
fn read_value(
    c: &mut Cursor<'_>,
    ty: ValueType,
    key: &str,
    depth: u32,
) -> Result<Value, GgufError> {
    let what = || format!("{} value of `{key}`", ty.name());
    Ok(match ty {
        ValueType::U8 => Value::U8(c.u8(what)?),
        ValueType::I8 => Value::I8(c.u8(what)? as i8),
        ValueType::U16 => Value::U16(c.u16(what)?),
        ValueType::I16 => Value::I16(c.u16(what)? as i16),
        ValueType::U32 => Value::U32(c.u32(what)?),
        ValueType::I32 => Value::I32(c.u32(what)? as i32),
        ValueType::U64 => Value::U64(c.u64(what)?),
        ValueType::I64 => Value::I64(c.u64(what)? as i64),
        ValueType::F32 => Value::F32(f32::from_bits(c.u32(what)?)),
        ValueType::F64 => Value::F64(f64::from_bits(c.u64(what)?)),
        // The format says 0 or 1; other bytes are read as true, as llama.cpp does.
        ValueType::Bool => Value::Bool(c.u8(what)? != 0),
        ValueType::String => Value::String(c.string(what)?.to_owned()),
        ValueType::Array => Value::Array(read_array(c, key, depth + 1)?),
    })
}

fn read_array(c: &mut Cursor<'_>, key: &str, depth: u32) -> Result<Vec<Value>, GgufError> {
    let at = c.pos();
    if depth > MAX_ARRAY_DEPTH {
        return Err(GgufError::TooLarge {
            what: format!("array nesting depth of `{key}`"),
            value: depth.into(),
            limit: MAX_ARRAY_DEPTH.into(),
            offset: at,
        });
    }
    let type_id = c.u32(|| format!("array element type of `{key}`"))?;
    let ty = ValueType::from_id(type_id).ok_or_else(|| GgufError::UnknownValueType {
        key: key.to_owned(),
        type_id,
        offset: at,
    })?;
    let count = c.u64(|| format!("array length of `{key}`"))?;
    if !fits(count, ty.min_size() as u64, c.remaining()) {
        return Err(GgufError::Truncated {
            what: format!("array `{key}` of {count} {} elements", ty.name()),
            offset: c.pos(),
        });
    }
    let mut items = Vec::with_capacity(count as usize);
    for _ in 0..count {
        items.push(read_value(c, ty, key, depth)?);
    }
    Ok(items)
}

/// A tensor info as read, before its offset is placed in the data section.
struct RawTensor {
    name: String,
    dims: Vec<u64>,
    ty: GgmlType,
    n_bytes: u64,
    rel_offset: u64,
    /// File offset of the info's offset field, for error messages.
    offset_at: u64,
}

fn read_tensor_infos(c: &mut Cursor<'_>, count: usize) -> Result<Vec<RawTensor>, GgufError> {
    // The count was checked before the metadata was read; reserve only what can still
    // fit after it (a shortfall then shows up as a truncated tensor info).
    let fit = (c.remaining() / MIN_TENSOR_INFO_SIZE) as usize;
    let mut out = Vec::with_capacity(count.min(fit));
    for i in 0..count {
        let name = c.string(|| format!("name of tensor {i}"))?.to_owned();
        let dims_at = c.pos();
        let n_dims = c.u32(|| format!("dimension count of tensor `{name}`"))?;
        if n_dims == 0 || n_dims as usize > MAX_DIMS {
            return Err(bad_tensor(
                &name,
                format!("{n_dims} dimensions at offset {dims_at} (1 to {MAX_DIMS} supported)"),
            ));
        }
        let mut dims = Vec::with_capacity(n_dims as usize);
        for d in 0..n_dims {
            let at = c.pos();
            let dim = c.u64(|| format!("dimension {d} of tensor `{name}`"))?;
            if dim == 0 {
                return Err(bad_tensor(
                    &name,
                    format!("dimension {d} at offset {at} is 0"),
                ));
            }
            dims.push(dim);
        }
        let type_at = c.pos();
        let type_id = c.u32(|| format!("type of tensor `{name}`"))?;
        let ty = GgmlType::from_id(type_id).ok_or_else(|| GgufError::UnknownTensorType {
            tensor: name.clone(),
            type_id,
        })?;
        let n_bytes = tensor_bytes(&name, &dims, ty, type_at)?;
        let offset_at = c.pos();
        let rel_offset = c.u64(|| format!("data offset of tensor `{name}`"))?;
        out.push(RawTensor {
            name,
            dims,
            ty,
            n_bytes,
            rel_offset,
            offset_at,
        });
    }
    Ok(out)
}

/// Byte size of a tensor, checking that each row is a whole number of blocks (ggml
/// quantizes along `dims[0]`, so a partial block per row cannot be represented).
fn tensor_bytes(name: &str, dims: &[u64], ty: GgmlType, type_at: u64) -> Result<u64, GgufError> {
    let n_elems = dims
        .iter()
        .try_fold(1u64, |acc, &d| acc.checked_mul(d))
        .ok_or_else(|| bad_tensor(name, format!("element count of shape {dims:?} overflows")))?;
    let block = ty.block_elems() as u64;
    if dims[0] % block != 0 {
        return Err(bad_tensor(
            name,
            format!(
                "row length {} is not a whole number of {ty} blocks of {block} (type at offset {type_at})",
                dims[0]
            ),
        ));
    }
    let n_bytes = ty.bytes_for(n_elems).ok_or_else(|| {
        bad_tensor(
            name,
            format!("byte size of {n_elems} {ty} elements overflows"),
        )
    })?;
    // Tensor bytes are sliced out of the file, so the size must be addressable.
    if usize::try_from(n_bytes).is_err() {
        return Err(bad_tensor(
            name,
            format!("{n_bytes} bytes do not fit in memory"),
        ));
    }
    Ok(n_bytes)
}

fn place_tensor(
    t: RawTensor,
    alignment: u64,
    data_offset: u64,
    file_len: u64,
) -> Result<TensorInfo, GgufError> {
    if t.rel_offset % alignment != 0 {
        return Err(bad_tensor(
            &t.name,
            format!(
                "data offset {} (at offset {}) is not a multiple of the alignment {alignment}",
                t.rel_offset, t.offset_at
            ),
        ));
    }
    let start = data_offset.checked_add(t.rel_offset);
    let end = start.and_then(|s| s.checked_add(t.n_bytes));
    match (start, end) {
        (Some(start), Some(end)) if end <= file_len => Ok(TensorInfo {
            name: t.name,
            dims: t.dims,
            ty: t.ty,
            offset: start,
            n_bytes: t.n_bytes,
        }),
        _ => Err(bad_tensor(
            &t.name,
            format!(
                "data [{} + {}, {} bytes) (offset field at {}) extends past the end of the {file_len}-byte file",
                data_offset, t.rel_offset, t.n_bytes, t.offset_at
            ),
        )),
    }
}

fn alignment(metadata: &Metadata) -> Result<u64, GgufError> {
    let Some(value) = metadata.get(ALIGNMENT_KEY) else {
        return Ok(DEFAULT_ALIGNMENT);
    };
    let a = value.as_i128().ok_or_else(|| GgufError::BadAlignment {
        reason: format!("type {}, expected an integer", value.type_name()),
    })?;
    match u64::try_from(a) {
        Ok(a) if a.is_power_of_two() => Ok(a),
        _ => Err(GgufError::BadAlignment {
            reason: format!("{a} is not a nonzero power of two"),
        }),
    }
}

pub(crate) fn align_up(pos: u64, alignment: u64) -> Option<u64> {
    Some(pos.checked_add(alignment - 1)? & !(alignment - 1))
}

fn bad_tensor(name: &str, reason: String) -> GgufError {
    GgufError::BadTensor {
        tensor: name.to_owned(),
        reason,
    }
}
