//! The model's weights on the device: uploaded once at start, tensor by tensor straight
//! from the memory-mapped file (no host copy of the whole model is ever made, so peak
//! host memory stays one tensor's staging), in their GGUF block layout, which is what
//! the kernels read. Norm gains and biases, converted to f32 at load on the host, go up
//! as f32.

use sparkd_kernels::names::WeightType;

use super::gpu::{f32_bytes, Buf, Gpu, GpuError};
use crate::model::config::ModelConfig;
use crate::model::weights::MatrixRef;
use crate::model::Model;

/// A weight matrix on the device: `rows` outputs of `cols` inputs, GGUF layout.
#[derive(Debug, Clone, Copy)]
pub struct DevMatrix {
    pub buf: Buf,
    pub ty: WeightType,
    pub rows: usize,
    pub cols: usize,
}

pub struct DevLayer {
    pub attn_norm: Buf,
    pub wq: DevMatrix,
    pub wk: DevMatrix,
    pub wv: DevMatrix,
    pub wo: DevMatrix,
    pub bq: Option<Buf>,
    pub bk: Option<Buf>,
    pub bv: Option<Buf>,
    pub q_norm: Option<Buf>,
    pub k_norm: Option<Buf>,
    pub ffn_norm: Buf,
    pub w_gate: DevMatrix,
    pub w_up: DevMatrix,
    pub w_down: DevMatrix,
}

pub struct DevWeights {
    pub tok_embd: DevMatrix,
    pub layers: Vec<DevLayer>,
    pub output_norm: Buf,
    pub output: DevMatrix,
    pub rope_inv_freq: Buf,
    /// Bytes uploaded.
    pub bytes: u64,
    /// Bytes of weights one decode step reads (every layer matrix and the head).
    pub bytes_per_step: u64,
}

/// Checks the shapes the kernels assume before anything is uploaded, so an unsupported
/// model is refused at start with a reason rather than failing in a launch.
pub fn check_config(cfg: &ModelConfig) -> Result<(), GpuError> {
    use sparkd_kernels::consts::{MAX_GQA_GROUP, MAX_HEAD_DIM};
    let bad = |m: String| Err(GpuError::Unsupported(m));
    if cfg.head_dim > MAX_HEAD_DIM || cfg.head_dim % 16 != 0 {
        return bad(format!(
            "head size {} (the CUDA attention kernels need a multiple of 16 up to {MAX_HEAD_DIM})",
            cfg.head_dim
        ));
    }
    if cfg.n_heads / cfg.n_kv_heads > MAX_GQA_GROUP {
        return bad(format!(
            "{} query heads per kv head (the CUDA kernels handle up to {MAX_GQA_GROUP})",
            cfg.n_heads / cfg.n_kv_heads
        ));
    }
    if cfg.vocab_size > i32::MAX as usize || cfg.ffn_dim > i32::MAX as usize {
        return bad("dimensions past i32".into());
    }
    Ok(())
}

/// Uploads one weight matrix from the model file in chunks of `chunk` bytes, each
/// chunk's pages of the mapping (and their page cache) given back once it is up: the
/// host holds about one chunk of the model at a time, not a tensor (an 8B model's
/// output head is 430 MB), let alone the model (on GB10 host and device share memory).
fn upload_matrix(
    gpu: &mut dyn Gpu,
    model: &Model,
    m: &MatrixRef,
    name: &str,
    chunk: usize,
    bytes: &mut u64,
) -> Result<DevMatrix, GpuError> {
    let ty = WeightType::from_ggml_id(m.ty.id())
        .filter(|t| t.supports_cols(m.cols))
        .ok_or_else(|| {
            GpuError::Unsupported(format!(
                "tensor {name}: {} rows of {} elements have no CUDA kernel",
                m.ty, m.cols
            ))
        })?;
    let data = m
        .file_layout(&model.file)
        .ok_or_else(|| {
            GpuError::Unsupported(format!(
                "tensor {name} was packed for the CPU; load the model with Model::load_mapped"
            ))
        })?
        .data;
    let buf = gpu.alloc(data.len(), name)?;
    let chunk = chunk.max(1);
    for (i, part) in data.chunks(chunk).enumerate() {
        gpu.upload(buf.at(i * chunk), part)?;
        m.release_file_range(&model.file, i * chunk, part.len());
    }
    *bytes += data.len() as u64;
    // The pages that straddle two chunks, which neither chunk's release could drop.
    m.release_file_pages(&model.file);
    Ok(DevMatrix {
        buf,
        ty,
        rows: m.rows,
        cols: m.cols,
    })
}

fn upload_f32(gpu: &mut dyn Gpu, v: &[f32], name: &str, bytes: &mut u64) -> Result<Buf, GpuError> {
    let data = f32_bytes(v);
    let buf = gpu.alloc(data.len(), name)?;
    gpu.upload(buf.ptr(), &data)?;
    *bytes += data.len() as u64;
    Ok(buf)
}

fn upload_opt(
    gpu: &mut dyn Gpu,
    v: &Option<Vec<f32>>,
    name: &str,
    bytes: &mut u64,
) -> Result<Option<Buf>, GpuError> {
    v.as_ref()
        .map(|v| upload_f32(gpu, v, name, bytes))
        .transpose()
}

impl DevWeights {
    /// Every tensor of `model` to the device; matrices go up in chunks of `chunk` bytes.
    pub fn upload(gpu: &mut dyn Gpu, model: &Model, chunk: usize) -> Result<Self, GpuError> {
        check_config(&model.config)?;
        let w = &model.weights;
        let mut bytes = 0u64;
        let tok_embd = upload_matrix(
            gpu,
            model,
            &w.tok_embd,
            "token_embd.weight",
            chunk,
            &mut bytes,
        )?;
        let mut layers = Vec::with_capacity(w.layers.len());
        for (i, l) in w.layers.iter().enumerate() {
            let n = |s: &str| format!("blk.{i}.{s}");
            let mut m = |r: &MatrixRef, s: &str, b: &mut u64| -> Result<DevMatrix, GpuError> {
                upload_matrix(gpu, model, r, &n(s), chunk, b)
            };
            let wq = m(&l.wq, "attn_q.weight", &mut bytes)?;
            let wk = m(&l.wk, "attn_k.weight", &mut bytes)?;
            let wv = m(&l.wv, "attn_v.weight", &mut bytes)?;
            let wo = m(&l.wo, "attn_output.weight", &mut bytes)?;
            let w_gate = m(&l.w_gate, "ffn_gate.weight", &mut bytes)?;
            let w_up = m(&l.w_up, "ffn_up.weight", &mut bytes)?;
            let w_down = m(&l.w_down, "ffn_down.weight", &mut bytes)?;
            layers.push(DevLayer {
                attn_norm: upload_f32(gpu, &l.attn_norm, &n("attn_norm"), &mut bytes)?,
                wq,
                wk,
                wv,
                wo,
                bq: upload_opt(gpu, &l.bq, &n("attn_q.bias"), &mut bytes)?,
                bk: upload_opt(gpu, &l.bk, &n("attn_k.bias"), &mut bytes)?,
                bv: upload_opt(gpu, &l.bv, &n("attn_v.bias"), &mut bytes)?,
                q_norm: upload_opt(gpu, &l.q_norm, &n("attn_q_norm"), &mut bytes)?,
                k_norm: upload_opt(gpu, &l.k_norm, &n("attn_k_norm"), &mut bytes)?,
                ffn_norm: upload_f32(gpu, &l.ffn_norm, &n("ffn_norm"), &mut bytes)?,
                w_gate,
                w_up,
                w_down,
            });
        }
        let output_norm = upload_f32(gpu, &w.output_norm, "output_norm.weight", &mut bytes)?;
        // A tied head is the embedding itself: one copy on the device.
        let tied = w.output.same_tensor(&w.tok_embd);
        let output = if tied {
            tok_embd
        } else {
            upload_matrix(gpu, model, &w.output, "output.weight", chunk, &mut bytes)?
        };
        let rope_inv_freq = upload_f32(
            gpu,
            &w.rope_inv_freq,
            "rope inverse frequencies",
            &mut bytes,
        )?;
        Ok(DevWeights {
            tok_embd,
            layers,
            output_norm,
            output,
            rope_inv_freq,
            bytes,
            bytes_per_step: w.bytes_per_token(),
        })
    }
}
