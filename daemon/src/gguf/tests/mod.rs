//! Tests of the GGUF reader and writer working together: round trips, crafted files,
//! mutation fuzzing and the real default model. Shared builders live here.

mod alloc_counter;
mod fuzz;
mod hardening;
mod interop;
mod real_model;
mod roundtrip;

use super::{GgufWriter, Value};
use crate::quant::GgmlType;

/// Deterministic pseudo-random bytes (xorshift), so fixtures differ per tensor without
/// a seeded RNG dependency in every test.
pub(super) fn pattern(n: usize, seed: u64) -> Vec<u8> {
    let mut x = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    (0..n)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x as u8
        })
        .collect()
}

/// A small file with every kind of value (nested arrays included) and three tensors of
/// different types: the seed for truncation and mutation tests.
pub(super) fn sample_writer() -> GgufWriter {
    let mut w = GgufWriter::new();
    w.add("general.architecture", "llama".into());
    w.add("a.u8", Value::U8(200));
    w.add("a.i16", Value::I16(-300));
    w.add("a.u32", Value::U32(30));
    w.add("a.i64", Value::I64(-5));
    w.add("a.f32", Value::F32(1e-5));
    w.add("a.f64", Value::F64(0.5));
    w.add("a.bool", Value::Bool(true));
    w.add("tok.tokens", vec!["<s>", "hé", "", "▁x"].into());
    w.add("tok.scores", vec![0.0f32, -1.5, 2.25].into());
    w.add("tok.types", vec![1i32, 2, 3].into());
    w.add("a.nested", vec![vec![vec![1u16]], vec![vec![2, 3]]].into());
    w.add("a.empty", Value::Array(Vec::new()));
    let tensors = [
        ("t.f32", vec![4, 2], GgmlType::F32),
        ("t.q8", vec![32, 1], GgmlType::Q8_0),
        ("t.f16", vec![3], GgmlType::F16),
    ];
    for (i, (name, dims, ty)) in tensors.into_iter().enumerate() {
        let n = ty
            .bytes_for(dims.iter().product())
            .expect("fixture shapes are whole blocks");
        w.add_tensor(name, dims, ty, pattern(n as usize, i as u64))
            .expect("fixture tensors are valid");
    }
    w
}

pub(super) fn sample_bytes() -> Vec<u8> {
    sample_writer().to_bytes()
}

/// Writes GGUF fields by hand, to craft files the writer refuses to produce.
pub(super) struct Raw(pub Vec<u8>);

impl Raw {
    /// Magic, version and the two counts.
    pub fn header(version: u32, n_tensors: u64, n_kv: u64) -> Self {
        Self(b"GGUF".to_vec()).u32(version).u64(n_tensors).u64(n_kv)
    }

    pub fn u8(mut self, v: u8) -> Self {
        self.0.push(v);
        self
    }

    pub fn u32(mut self, v: u32) -> Self {
        self.0.extend_from_slice(&v.to_le_bytes());
        self
    }

    pub fn u64(mut self, v: u64) -> Self {
        self.0.extend_from_slice(&v.to_le_bytes());
        self
    }

    pub fn bytes(mut self, b: &[u8]) -> Self {
        self.0.extend_from_slice(b);
        self
    }

    pub fn str(self, s: &str) -> Self {
        self.u64(s.len() as u64).bytes(s.as_bytes())
    }

    /// A u32 metadata entry.
    pub fn kv_u32(self, key: &str, v: u32) -> Self {
        self.str(key).u32(4).u32(v)
    }

    pub fn tensor(self, name: &str, dims: &[u64], type_id: u32, rel_offset: u64) -> Self {
        let mut r = self.str(name).u32(dims.len() as u32);
        for &d in dims {
            r = r.u64(d);
        }
        r.u32(type_id).u64(rel_offset)
    }

    /// Zero padding up to a multiple of `align`.
    pub fn pad(mut self, align: usize) -> Self {
        while self.0.len() % align != 0 {
            self.0.push(0);
        }
        self
    }

    pub fn zeros(mut self, n: usize) -> Self {
        self.0.resize(self.0.len() + n, 0);
        self
    }
}

/// A v3 file with no metadata and one tensor, padded to 32 and followed by `data_len`
/// zero bytes of data.
pub(super) fn one_tensor(dims: &[u64], type_id: u32, rel_offset: u64, data_len: usize) -> Vec<u8> {
    Raw::header(3, 1, 0)
        .tensor("w", dims, type_id, rel_offset)
        .pad(32)
        .zeros(data_len)
        .0
}
