//! Builds GGUF v3 files: test fixtures, synthetic models and converted weights.
//!
//! The writer only produces files its own reader accepts: values are checked against
//! the reader's limits and tensors against their type's block size when added or
//! before anything is written.

use std::collections::HashSet;
use std::fs::File;
use std::io::{self, BufWriter, Write};
use std::path::{Path, PathBuf};

use super::cursor::MAX_STRING_LEN;
use super::error::GgufError;
use super::metadata::Metadata;
use super::parse::{align_up, ALIGNMENT_KEY, DEFAULT_ALIGNMENT, MAGIC, MAX_ARRAY_DEPTH};
use super::tensor::MAX_DIMS;
use super::value::{Value, ValueType};
use crate::quant::GgmlType;

const VERSION: u32 = 3;

struct PendingTensor {
    name: String,
    dims: Vec<u64>,
    ty: GgmlType,
    data: Vec<u8>,
}

/// Collects metadata and tensors, then writes them as one GGUF v3 file.
///
/// Metadata keys keep the order they were first added in; adding a key again replaces
/// its value. Tensors are laid out in the order added, each at an aligned offset.
pub struct GgufWriter {
    metadata: Metadata,
    tensors: Vec<PendingTensor>,
    names: HashSet<String>,
}

impl Default for GgufWriter {
    fn default() -> Self {
        Self::new()
    }
}

impl GgufWriter {
    /// An empty v3 file with the default alignment of 32.
    pub fn new() -> Self {
        Self {
            metadata: Metadata::new(),
            tensors: Vec::new(),
            names: HashSet::new(),
        }
    }

    /// Sets the data alignment, recorded as `general.alignment` (which is where the
    /// writer and readers take it from). It must be a nonzero power of two; a bad value
    /// is reported when writing.
    pub fn with_alignment(mut self, a: u64) -> Self {
        let v = u32::try_from(a).map_or(Value::U64(a), Value::U32);
        self.metadata.insert(ALIGNMENT_KEY, v);
        self
    }

    /// Sets metadata `key` to `v`.
    pub fn add(&mut self, key: impl Into<String>, v: Value) {
        self.metadata.insert(key, v);
    }

    /// Adds a tensor. `data` must hold exactly `ty.bytes_for(n_elems)` bytes, `dims`
    /// (ggml order) 1 to 4 nonzero dimensions with `dims[0]` a whole number of blocks.
    pub fn add_tensor(
        &mut self,
        name: impl Into<String>,
        dims: Vec<u64>,
        ty: GgmlType,
        data: Vec<u8>,
    ) -> Result<(), GgufError> {
        let name = name.into();
        let bad = |reason: String| GgufError::BadTensor {
            tensor: name.clone(),
            reason,
        };
        if self.names.contains(&name) {
            return Err(GgufError::DuplicateTensor(name));
        }
        if name.len() as u64 > MAX_STRING_LEN {
            return Err(bad(format!("name is {} bytes long", name.len())));
        }
        if dims.is_empty() || dims.len() > MAX_DIMS || dims.contains(&0) {
            return Err(bad(format!(
                "shape {dims:?}: 1 to {MAX_DIMS} nonzero dimensions required"
            )));
        }
        let block = ty.block_elems() as u64;
        if dims[0] % block != 0 {
            return Err(bad(format!(
                "row length {} is not a whole number of {ty} blocks of {block}",
                dims[0]
            )));
        }
        let expected = dims
            .iter()
            .try_fold(1u64, |acc, &d| acc.checked_mul(d))
            .and_then(|n| ty.bytes_for(n))
            .ok_or_else(|| bad(format!("size of shape {dims:?} overflows")))?;
        if data.len() as u64 != expected {
            return Err(bad(format!(
                "data is {} bytes, {ty} {dims:?} needs {expected}",
                data.len()
            )));
        }
        self.names.insert(name.clone());
        self.tensors.push(PendingTensor {
            name,
            dims,
            ty,
            data,
        });
        Ok(())
    }

    fn alignment(&self) -> Result<u64, GgufError> {
        let Some(v) = self.metadata.get(ALIGNMENT_KEY) else {
            return Ok(DEFAULT_ALIGNMENT);
        };
        v.as_i128()
            .and_then(|a| u64::try_from(a).ok())
            .filter(|a| a.is_power_of_two())
            .ok_or_else(|| {
                GgufError::Unencodable(format!(
                    "`{ALIGNMENT_KEY}` must be a nonzero power of two, got {v:?}"
                ))
            })
    }

    /// Checks everything `write_to` would otherwise discover half-way through.
    fn validate(&self) -> Result<u64, GgufError> {
        for (key, value) in self.metadata.iter() {
            check_len(key.len(), || "a metadata key".into())?;
            check_value(key, value, 0)?;
        }
        self.alignment()
    }

    /// Writes the file. A value that cannot be encoded (an array mixing element
    /// types, nesting deeper than 4, a string over 16 MiB, a bad alignment) is an
    /// `InvalidInput` error, reported before anything is written.
    pub fn write_to(&self, w: &mut impl Write) -> io::Result<()> {
        let alignment = self
            .validate()
            .map_err(|e| io::Error::new(io::ErrorKind::InvalidInput, e))?;
        let mut w = CountingWriter { inner: w, n: 0 };

        w.write_all(MAGIC)?;
        w.write_all(&VERSION.to_le_bytes())?;
        w.write_all(&(self.tensors.len() as u64).to_le_bytes())?;
        w.write_all(&(self.metadata.len() as u64).to_le_bytes())?;
        for (key, value) in self.metadata.iter() {
            write_str(&mut w, key)?;
            w.write_all(&value.value_type().id().to_le_bytes())?;
            write_value(&mut w, value)?;
        }

        let mut rel = 0u64;
        for t in &self.tensors {
            write_str(&mut w, &t.name)?;
            w.write_all(&(t.dims.len() as u32).to_le_bytes())?;
            for d in &t.dims {
                w.write_all(&d.to_le_bytes())?;
            }
            w.write_all(&t.ty.id().to_le_bytes())?;
            w.write_all(&rel.to_le_bytes())?;
            rel = aligned(rel + t.data.len() as u64, alignment)?;
        }

        pad_to(&mut w, alignment)?;
        let data_start = w.n;
        for t in &self.tensors {
            w.write_all(&t.data)?;
            pad_to(&mut w, alignment)?;
        }
        debug_assert_eq!(w.n - data_start, rel);
        Ok(())
    }

    /// The file as bytes.
    ///
    /// # Panics
    /// If a value cannot be encoded (see [`write_to`](Self::write_to)), which is a bug
    /// in the caller, not a property of any input file.
    pub fn to_bytes(&self) -> Vec<u8> {
        let mut out = Vec::new();
        if let Err(e) = self.write_to(&mut out) {
            panic!("GgufWriter::to_bytes: {e}");
        }
        out
    }

    /// Writes the file to a temporary name beside `path`, syncs it, then renames it
    /// over `path`, so readers (and mappings of an older file) never see a partial file.
    pub fn write_file(&self, path: &Path) -> Result<(), GgufError> {
        self.validate()?;
        let tmp = temp_path(path);
        let result = self.write_synced(&tmp).and_then(|()| {
            std::fs::rename(&tmp, path).map_err(|source| GgufError::Io {
                path: path.to_owned(),
                source,
            })
        });
        if result.is_err() {
            // Best effort: the original error is the one worth reporting.
            let _ = std::fs::remove_file(&tmp);
        }
        result
    }

    fn write_synced(&self, tmp: &Path) -> Result<(), GgufError> {
        let io = |source| GgufError::Io {
            path: tmp.to_owned(),
            source,
        };
        let mut w = BufWriter::new(File::create(tmp).map_err(io)?);
        self.write_to(&mut w).map_err(io)?;
        let file = w.into_inner().map_err(|e| io(e.into_error()))?;
        file.sync_all().map_err(io)
    }
}

fn temp_path(path: &Path) -> PathBuf {
    let name = path
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default();
    path.with_file_name(format!(".{name}.tmp-{}", std::process::id()))
}

fn check_len(len: usize, what: impl FnOnce() -> String) -> Result<(), GgufError> {
    if len as u64 > MAX_STRING_LEN {
        return Err(GgufError::Unencodable(format!(
            "{} is {len} bytes, the limit is {MAX_STRING_LEN}",
            what()
        )));
    }
    Ok(())
}

/// Checks that `v` is representable and readable back: arrays homogeneous (GGUF stores
/// one element type per array) and nested at most `MAX_ARRAY_DEPTH` deep.
fn check_value(key: &str, v: &Value, depth: u32) -> Result<(), GgufError> {
    match v {
        Value::String(s) => check_len(s.len(), || format!("a string in `{key}`")),
        Value::Array(items) => {
            if depth + 1 > MAX_ARRAY_DEPTH {
                return Err(GgufError::Unencodable(format!(
                    "`{key}` nests arrays deeper than {MAX_ARRAY_DEPTH}"
                )));
            }
            let ty = items.first().map(Value::value_type);
            for item in items {
                if Some(item.value_type()) != ty {
                    return Err(GgufError::Unencodable(format!(
                        "array `{key}` mixes {} and {} elements",
                        ty.map_or("?", ValueType::name),
                        item.type_name()
                    )));
                }
                check_value(key, item, depth + 1)?;
            }
            Ok(())
        }
        _ => Ok(()),
    }
}

fn write_str(w: &mut impl Write, s: &str) -> io::Result<()> {
    w.write_all(&(s.len() as u64).to_le_bytes())?;
    w.write_all(s.as_bytes())
}

fn write_value(w: &mut impl Write, v: &Value) -> io::Result<()> {
    match v {
        Value::U8(x) => w.write_all(&x.to_le_bytes()),
        Value::I8(x) => w.write_all(&x.to_le_bytes()),
        Value::U16(x) => w.write_all(&x.to_le_bytes()),
        Value::I16(x) => w.write_all(&x.to_le_bytes()),
        Value::U32(x) => w.write_all(&x.to_le_bytes()),
        Value::I32(x) => w.write_all(&x.to_le_bytes()),
        Value::U64(x) => w.write_all(&x.to_le_bytes()),
        Value::I64(x) => w.write_all(&x.to_le_bytes()),
        Value::F32(x) => w.write_all(&x.to_le_bytes()),
        Value::F64(x) => w.write_all(&x.to_le_bytes()),
        Value::Bool(x) => w.write_all(&[u8::from(*x)]),
        Value::String(s) => write_str(w, s),
        Value::Array(items) => {
            // An empty array still needs an element type; any will do.
            let ty = items.first().map_or(ValueType::U8, Value::value_type);
            w.write_all(&ty.id().to_le_bytes())?;
            w.write_all(&(items.len() as u64).to_le_bytes())?;
            items.iter().try_for_each(|item| write_value(w, item))
        }
    }
}

fn aligned(pos: u64, alignment: u64) -> io::Result<u64> {
    align_up(pos, alignment)
        .ok_or_else(|| io::Error::new(io::ErrorKind::InvalidInput, "tensor data offset overflows"))
}

fn pad_to<W: Write>(w: &mut CountingWriter<W>, alignment: u64) -> io::Result<()> {
    const ZEROS: [u8; 256] = [0; 256];
    let mut pad = aligned(w.n, alignment)? - w.n;
    while pad > 0 {
        let n = pad.min(ZEROS.len() as u64) as usize;
        w.write_all(&ZEROS[..n])?;
        pad -= n as u64;
    }
    Ok(())
}

/// Counts bytes written, to place padding without requiring `Seek`.
struct CountingWriter<W> {
    inner: W,
    n: u64,
}

impl<W: Write> Write for CountingWriter<W> {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        let n = self.inner.write(buf)?;
        self.n += n as u64;
        Ok(n)
    }

    fn flush(&mut self) -> io::Result<()> {
        self.inner.flush()
    }
}
