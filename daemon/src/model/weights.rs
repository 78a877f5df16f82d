//! The model's tensors, located in the memory-mapped GGUF file and checked against the
//! configuration at load, so that a missing or misshapen tensor is a clear error now
//! rather than a panic in the middle of a forward pass.
//!
//! Where the CPU kernels want it (`cpu::should_pack`), Q4_0 / Q4_1 / Q8_0 matrices are
//! packed at load into their lane-interleaved layout and the mapped pages they came from
//! are released, so the packed copy replaces the file's bytes in memory instead of
//! doubling them.

use std::sync::Arc;

use crate::backend::cpu::{should_pack, PackedMatrix, Weight, WeightMatrix};
use crate::gguf::{GgufFile, TensorInfo};
use crate::quant::{dequantize, GgmlType};

use super::config::{Arch, ModelConfig};

/// A 2-D weight: `rows` outputs of `cols` inputs each, in the mapped file or packed.
#[derive(Debug, Clone)]
pub struct MatrixRef {
    pub ty: GgmlType,
    pub rows: usize,
    pub cols: usize,
    offset: usize,
    len: usize,
    /// The packed copy, when the kernels use one (then the file bytes are not read);
    /// shared when the output head is the token embedding.
    packed: Option<Arc<PackedMatrix>>,
}

impl MatrixRef {
    pub fn view<'a>(&'a self, file: &'a GgufFile) -> Weight<'a> {
        match &self.packed {
            Some(p) => Weight::Packed(p),
            None => Weight::Gguf(self.gguf(file)),
        }
    }

    /// Whether both refer to the same tensor of the file (a tied output head).
    pub fn same_tensor(&self, other: &MatrixRef) -> bool {
        (self.offset, self.len) == (other.offset, other.len)
    }

    /// The matrix in the file's layout, for a device upload; `None` for a packed matrix,
    /// whose file bytes were given back at load (see [`Weights::load_unpacked`]).
    pub fn file_layout<'a>(&self, file: &'a GgufFile) -> Option<WeightMatrix<'a>> {
        self.packed.is_none().then(|| self.gguf(file))
    }

    fn gguf<'a>(&self, file: &'a GgufFile) -> WeightMatrix<'a> {
        WeightMatrix {
            ty: self.ty,
            rows: self.rows,
            cols: self.cols,
            data: &file.bytes()[self.offset..self.offset + self.len],
        }
    }

    /// Gives back the host memory of the matrix's file bytes once they were copied
    /// elsewhere (a device upload); see [`GgufFile::release_pages`]. Only over a file
    /// mapping, where a later read faults the bytes back in: a private copy would read
    /// zeros, and the CPU may still use a model loaded that way.
    pub fn release_file_pages(&self, file: &GgufFile) {
        self.release_file_range(file, 0, self.len);
    }

    /// [`Self::release_file_pages`] for bytes `start..start + len` of the tensor (the
    /// whole pages inside them).
    pub fn release_file_range(&self, file: &GgufFile, start: usize, len: usize) {
        if file.is_mapped() && start.saturating_add(len) <= self.len {
            file.release_pages(self.offset + start, len);
        }
    }

    /// Whether the matrix is held packed.
    pub fn is_packed(&self) -> bool {
        self.packed.is_some()
    }

    pub fn bytes(&self) -> usize {
        self.len
    }
}

pub struct LayerWeights {
    pub attn_norm: Vec<f32>,
    pub wq: MatrixRef,
    pub wk: MatrixRef,
    pub wv: MatrixRef,
    pub wo: MatrixRef,
    pub bq: Option<Vec<f32>>,
    pub bk: Option<Vec<f32>>,
    pub bv: Option<Vec<f32>>,
    pub q_norm: Option<Vec<f32>>,
    pub k_norm: Option<Vec<f32>>,
    pub ffn_norm: Vec<f32>,
    pub w_gate: MatrixRef,
    pub w_up: MatrixRef,
    pub w_down: MatrixRef,
}

pub struct Weights {
    pub tok_embd: MatrixRef,
    pub layers: Vec<LayerWeights>,
    pub output_norm: Vec<f32>,
    /// The LM head; the token embedding itself when the model ties them.
    pub output: MatrixRef,
    /// Per rotated pair, the inverse frequency, with Llama 3 style frequency factors
    /// (`rope_freqs.weight`) and YaRN's interpolation already applied.
    pub rope_inv_freq: Vec<f32>,
}

#[derive(Debug, thiserror::Error)]
pub enum WeightsError {
    #[error("tensor `{0}` is missing from the model file")]
    Missing(String),
    #[error("tensor `{name}` has shape {found:?}, expected {expected:?}")]
    Shape {
        name: String,
        found: Vec<u64>,
        expected: Vec<u64>,
    },
    #[error("tensor `{name}` has type {ty}, which sparkd cannot use there")]
    Type { name: String, ty: GgmlType },
}

fn info<'a>(file: &'a GgufFile, name: &str) -> Result<&'a TensorInfo, WeightsError> {
    file.tensor(name)
        .ok_or_else(|| WeightsError::Missing(name.to_string()))
}

fn check_shape(t: &TensorInfo, expected: &[u64]) -> Result<(), WeightsError> {
    if t.dims != expected {
        return Err(WeightsError::Shape {
            name: t.name.clone(),
            found: t.dims.clone(),
            expected: expected.to_vec(),
        });
    }
    Ok(())
}

fn matrix(
    file: &GgufFile,
    name: &str,
    rows: usize,
    cols: usize,
    pack: bool,
) -> Result<MatrixRef, WeightsError> {
    let t = info(file, name)?;
    check_shape(t, &[cols as u64, rows as u64])?;
    if !t.ty.is_weight_type() {
        return Err(WeightsError::Type {
            name: name.to_string(),
            ty: t.ty,
        });
    }
    let mut m = MatrixRef {
        ty: t.ty,
        rows,
        cols,
        offset: t.offset as usize,
        len: t.n_bytes as usize,
        packed: None,
    };
    if pack && should_pack(m.ty) {
        let packed = PackedMatrix::pack(&m.gguf(file)).map_err(|_| WeightsError::Type {
            name: name.to_string(),
            ty: t.ty,
        })?;
        m.packed = Some(Arc::new(packed));
        file.release_pages(m.offset, m.len);
    }
    Ok(m)
}

/// A 1-D tensor (norm weights, biases) converted to f32 once at load.
fn vector(file: &GgufFile, name: &str, len: usize) -> Result<Vec<f32>, WeightsError> {
    let t = info(file, name)?;
    check_shape(t, &[len as u64])?;
    let mut out = vec![0.0; len];
    dequantize(t.ty, file.tensor_data(t), &mut out).map_err(|_| WeightsError::Type {
        name: name.to_string(),
        ty: t.ty,
    })?;
    Ok(out)
}

fn opt_vector(file: &GgufFile, name: &str, len: usize) -> Result<Option<Vec<f32>>, WeightsError> {
    match file.tensor(name) {
        Some(_) => vector(file, name, len).map(Some),
        None => Ok(None),
    }
}

impl Weights {
    /// The weights as the CPU kernels want them (packed where they pack).
    pub fn load(file: &GgufFile, cfg: &ModelConfig) -> Result<Self, WeightsError> {
        Self::load_with(file, cfg, true)
    }

    /// The weights in the file's own layout only, for a backend that copies them to a
    /// device: packing would build a second, host-side copy nobody reads.
    pub fn load_unpacked(file: &GgufFile, cfg: &ModelConfig) -> Result<Self, WeightsError> {
        Self::load_with(file, cfg, false)
    }

    fn load_with(file: &GgufFile, cfg: &ModelConfig, pack: bool) -> Result<Self, WeightsError> {
        let d = cfg.d_model;
        let tok_embd = matrix(file, "token_embd.weight", cfg.vocab_size, d, pack)?;
        let output = match file.tensor("output.weight") {
            Some(_) => matrix(file, "output.weight", cfg.vocab_size, d, pack)?,
            None => tok_embd.clone(),
        };
        let mut layers = Vec::with_capacity(cfg.n_layers);
        for i in 0..cfg.n_layers {
            let n = |s: &str| format!("blk.{i}.{s}");
            let needs_bias = cfg.arch == Arch::Qwen2;
            let needs_qk_norm = cfg.arch == Arch::Qwen3;
            let bias = |s: &str, len| -> Result<Option<Vec<f32>>, WeightsError> {
                if needs_bias {
                    vector(file, &n(s), len).map(Some)
                } else {
                    opt_vector(file, &n(s), len)
                }
            };
            let qk_norm = |s: &str| -> Result<Option<Vec<f32>>, WeightsError> {
                if needs_qk_norm {
                    vector(file, &n(s), cfg.head_dim).map(Some)
                } else {
                    Ok(None)
                }
            };
            layers.push(LayerWeights {
                attn_norm: vector(file, &n("attn_norm.weight"), d)?,
                wq: matrix(file, &n("attn_q.weight"), cfg.q_dim(), d, pack)?,
                wk: matrix(file, &n("attn_k.weight"), cfg.kv_dim(), d, pack)?,
                wv: matrix(file, &n("attn_v.weight"), cfg.kv_dim(), d, pack)?,
                wo: matrix(file, &n("attn_output.weight"), d, cfg.q_dim(), pack)?,
                bq: bias("attn_q.bias", cfg.q_dim())?,
                bk: bias("attn_k.bias", cfg.kv_dim())?,
                bv: bias("attn_v.bias", cfg.kv_dim())?,
                q_norm: qk_norm("attn_q_norm.weight")?,
                k_norm: qk_norm("attn_k_norm.weight")?,
                ffn_norm: vector(file, &n("ffn_norm.weight"), d)?,
                w_gate: matrix(file, &n("ffn_gate.weight"), cfg.ffn_dim, d, pack)?,
                w_up: matrix(file, &n("ffn_up.weight"), cfg.ffn_dim, d, pack)?,
                w_down: matrix(file, &n("ffn_down.weight"), d, cfg.ffn_dim, pack)?,
            });
        }
        let output_norm = vector(file, "output_norm.weight", d)?;
        let factors = opt_vector(file, "rope_freqs.weight", cfg.rope_dim / 2)?;
        let rope_inv_freq =
            cfg.rope_scaling
                .inverse_frequencies(cfg.rope_dim, cfg.rope_base, factors.as_deref());
        Ok(Weights {
            tok_embd,
            layers,
            output_norm,
            output,
            rope_inv_freq,
        })
    }

    /// Parameters in the matrices and vectors the forward pass uses.
    pub fn parameter_count(&self, cfg: &ModelConfig) -> u64 {
        let m = |w: &MatrixRef| (w.rows * w.cols) as u64;
        let mut n = m(&self.tok_embd) + cfg.d_model as u64;
        if self.output.offset != self.tok_embd.offset {
            n += m(&self.output);
        }
        for l in &self.layers {
            n += m(&l.wq)
                + m(&l.wk)
                + m(&l.wv)
                + m(&l.wo)
                + m(&l.w_gate)
                + m(&l.w_up)
                + m(&l.w_down);
            n += 2 * cfg.d_model as u64;
        }
        n
    }

    /// Bytes of weights one decode step reads (every matrix once, plus one embedding row).
    pub fn bytes_per_token(&self) -> u64 {
        let mut n = self.output.bytes() as u64;
        for l in &self.layers {
            for w in [&l.wq, &l.wk, &l.wv, &l.wo, &l.w_gate, &l.w_up, &l.w_down] {
                n += w.bytes() as u64;
            }
        }
        n
    }
}
