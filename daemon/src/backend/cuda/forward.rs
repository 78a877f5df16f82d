//! The CUDA forward step, written once against [`Gpu`]: the same sequence of
//! operations as the CPU forward (`model/forward.rs`), as kernel launches.
//!
//! embedding → per layer: RMSNorm → q, k, v (mat-vec, or dequantize + GEMM for large
//! steps; Qwen2's biases fused in) → Qwen3's per-head q/k RMSNorm → RoPE → KV write
//! into the paged cache → attention (split-K decode when every sequence brings one
//! token, else the causal prefill kernel) → output projection with the residual add
//! fused → RMSNorm → gate, up → SwiGLU → down with the residual fused → final RMSNorm of
//! the rows that want logits → output head → logits downloaded.
//!
//! The host uploads one small table per step (token ids, positions, cache slots, block
//! tables, per-sequence lengths), so each step costs one host-to-device copy and one
//! device-to-host copy of the logits.

use std::time::Duration;

use sparkd_kernels::consts::ATTN_PARTITION;

use super::backend::{ensure, token_bytes, CudaBackend};
use super::gpu::{i32_bytes, Buf, DevPtr, Gpu, GpuError};
use super::ops::{self, AttnInputs, AttnShape};
use super::weights::DevMatrix;
use crate::model::config::RopeStyle;
use crate::model::{SeqInput, BLOCK_TOKENS};

/// Where each per-step table sits in the step's metadata buffer (offsets in i32s).
struct Meta {
    tokens: usize,
    pos: usize,
    slots: usize,
    tables: usize,
    seq_lens: usize,
    q_start: usize,
    q_len: usize,
    start_pos: usize,
    max_blocks: usize,
    words: Vec<i32>,
}

impl Meta {
    fn build(batch: &[SeqInput<'_>]) -> Meta {
        let n: usize = batch.iter().map(|s| s.tokens.len()).sum();
        let s = batch.len();
        let max_blocks = batch
            .iter()
            .map(|s| s.table.blocks().len())
            .max()
            .unwrap_or(0)
            .max(1);
        let tokens = 0;
        let pos = n;
        let slots = 2 * n;
        let tables = 3 * n;
        let seq_lens = tables + s * max_blocks;
        let q_start = seq_lens + s;
        let q_len = q_start + s;
        let start_pos = q_len + s;
        let mut words = vec![0i32; start_pos + s];
        // Token ids are written separately as u32 bytes over the first n words.
        let mut t = 0;
        for (i, seq) in batch.iter().enumerate() {
            for j in 0..seq.tokens.len() {
                let p = seq.start_pos + j;
                let (block, slot) = seq.table.locate(p);
                words[pos + t] = p as i32;
                words[slots + t] = (block * BLOCK_TOKENS + slot) as i32;
                t += 1;
            }
            for (b, &block) in seq.table.blocks().iter().enumerate() {
                words[tables + i * max_blocks + b] = block as i32;
            }
            words[seq_lens + i] = (seq.start_pos + seq.tokens.len()) as i32;
            words[q_start + i] = (t - seq.tokens.len()) as i32;
            words[q_len + i] = seq.tokens.len() as i32;
            words[start_pos + i] = seq.start_pos as i32;
        }
        Meta {
            tokens,
            pos,
            slots,
            tables,
            seq_lens,
            q_start,
            q_len,
            start_pos,
            max_blocks,
            words,
        }
    }
}

impl<G: Gpu> CudaBackend<G> {
    /// One forward step over a batch `check_batch` has accepted.
    pub(super) fn step(&mut self, batch: &[SeqInput<'_>]) -> Result<Duration, GpuError> {
        let cfg = self.cfg.clone();
        let n: usize = batch.iter().map(|s| s.tokens.len()).sum();
        let n_seqs = batch.len();
        let n_logits = batch.iter().filter(|s| s.want_logits).count();
        if n == 0 {
            self.fetch_logits(0)?;
            return Ok(Duration::ZERO);
        }
        let (d, q_dim, kv_dim, hd, ffn) = (
            cfg.d_model,
            cfg.q_dim(),
            cfg.kv_dim(),
            cfg.head_dim,
            cfg.ffn_dim,
        );
        let decode = batch.iter().all(|s| s.tokens.len() == 1);
        let max_len = batch
            .iter()
            .map(|s| s.start_pos + s.tokens.len())
            .max()
            .unwrap_or(1);
        let n_splits = max_len.div_ceil(ATTN_PARTITION).max(1);
        let use_gemm = n >= self.opts.gemm_min_tokens.max(1);

        let g = &mut self.gpu;
        let sc = &mut self.scratch;
        let f = 4; // bytes per f32
        let x = ensure(g, &mut sc.x, n * d * f, "activations")?;
        let xn = ensure(g, &mut sc.xn, n * d * f, "normed activations")?;
        let q = ensure(g, &mut sc.q, n * q_dim * f, "queries")?;
        let k = ensure(g, &mut sc.k, n * kv_dim * f, "keys")?;
        let v = ensure(g, &mut sc.v, n * kv_dim * f, "values")?;
        let attn = ensure(g, &mut sc.attn, n * q_dim * f, "attention output")?;
        let gate = ensure(g, &mut sc.gate, n * ffn * f, "ffn gate")?;
        let up = ensure(g, &mut sc.up, n * ffn * f, "ffn up")?;
        let last = ensure(g, &mut sc.last, n_logits.max(1) * d * f, "final norm rows")?;
        let logits = ensure(
            g,
            &mut sc.logits,
            n_logits.max(1) * cfg.vocab_size * f,
            "logits",
        )?;
        let part_o = ensure(
            g,
            &mut sc.part_o,
            n_seqs * cfg.n_heads * n_splits * hd * f,
            "attention splits",
        )?;
        let part_ml = ensure(
            g,
            &mut sc.part_ml,
            n_seqs * cfg.n_heads * n_splits * 2 * f,
            "attention split maxima",
        )?;
        let gemm_bufs = if use_gemm {
            let max_cols = d.max(q_dim).max(ffn);
            let max_elems = self
                .w
                .layers
                .iter()
                .flat_map(|l| [l.wq, l.wk, l.wv, l.wo, l.w_gate, l.w_up, l.w_down])
                .map(|m| m.rows * m.cols)
                .max()
                .unwrap_or(0);
            let w_bytes = (max_elems * 2).min(self.opts.gemm_scratch_max_bytes);
            let a16 = ensure(g, &mut sc.a16, n * max_cols * 2, "GEMM activations")?;
            let w16 = ensure(g, &mut sc.w16, w_bytes, "GEMM weights")?;
            Some((a16, w16))
        } else {
            None
        };

        let meta = Meta::build(batch);
        let meta_buf = ensure(g, &mut sc.meta, meta.words.len() * 4, "step tables")?;
        let at = |off: usize| meta_buf.at(off * 4);

        g.step_begin()?;
        g.upload(meta_buf.ptr(), &i32_bytes(&meta.words))?;
        g.upload(at(meta.tokens), &token_bytes(batch))?;

        // y = x W^T (+ bias) (+ y): the GEMM when the step is large and the matrix's f16
        // copy fits the scratch, else the mat-vec.
        let matmul = |g: &mut G,
                      w: &DevMatrix,
                      x: DevPtr,
                      y: DevPtr,
                      rows: usize,
                      bias: Option<Buf>,
                      acc: bool|
         -> Result<(), GpuError> {
            match gemm_bufs {
                Some((a16, w16)) if w.rows * w.cols * 2 <= w16.bytes => {
                    ops::gemm(g, w, x, y, rows, bias, acc, a16, w16)
                }
                _ => ops::matvec(g, w, x, y, rows, bias, acc),
            }
        };

        ops::embed(g, &self.w.tok_embd, at(meta.tokens), x.ptr(), n)?;
        let neox = cfg.arch.rope_style() == RopeStyle::Neox;
        let layer_kv_bytes = self.pool.total_blocks() * BLOCK_TOKENS * kv_dim * f;
        let shape = AttnShape {
            n_heads: cfg.n_heads,
            n_kv_heads: cfg.n_kv_heads,
            head_dim: hd,
            n_seqs,
            max_blocks: meta.max_blocks,
        };
        for (li, l) in self.w.layers.iter().enumerate() {
            ops::rmsnorm(g, x.ptr(), l.attn_norm, xn.ptr(), n, d, cfg.rms_eps)?;
            matmul(g, &l.wq, xn.ptr(), q.ptr(), n, l.bq, false)?;
            matmul(g, &l.wk, xn.ptr(), k.ptr(), n, l.bk, false)?;
            matmul(g, &l.wv, xn.ptr(), v.ptr(), n, l.bv, false)?;
            if let Some(gain) = l.q_norm {
                ops::rmsnorm(g, q.ptr(), gain, q.ptr(), n * cfg.n_heads, hd, cfg.rms_eps)?;
            }
            if let Some(gain) = l.k_norm {
                ops::rmsnorm(
                    g,
                    k.ptr(),
                    gain,
                    k.ptr(),
                    n * cfg.n_kv_heads,
                    hd,
                    cfg.rms_eps,
                )?;
            }
            ops::rope(
                g,
                q.ptr(),
                k.ptr(),
                at(meta.pos),
                self.w.rope_inv_freq,
                n,
                (cfg.n_heads, cfg.n_kv_heads),
                hd,
                cfg.rope_dim / 2,
                cfg.rope_linear_scale,
                neox,
            )?;
            let kc = self.k_cache.at(li * layer_kv_bytes);
            let vc = self.v_cache.at(li * layer_kv_bytes);
            ops::kv_write(g, k.ptr(), v.ptr(), kc, vc, at(meta.slots), n, kv_dim)?;
            let io = AttnInputs {
                q: q.ptr(),
                k_cache: kc,
                v_cache: vc,
                block_tables: at(meta.tables),
                out: attn.ptr(),
            };
            if decode {
                ops::attn_decode(g, shape, io, at(meta.seq_lens), n_splits, part_o, part_ml)?;
            } else {
                let max_q = batch.iter().map(|s| s.tokens.len()).max().unwrap_or(1);
                ops::attn_prefill(
                    g,
                    shape,
                    io,
                    at(meta.q_start),
                    at(meta.q_len),
                    at(meta.start_pos),
                    max_q,
                )?;
            }
            // The residual add is fused: x += attn Wo^T.
            matmul(g, &l.wo, attn.ptr(), x.ptr(), n, None, true)?;
            ops::rmsnorm(g, x.ptr(), l.ffn_norm, xn.ptr(), n, d, cfg.rms_eps)?;
            matmul(g, &l.w_gate, xn.ptr(), gate.ptr(), n, None, false)?;
            matmul(g, &l.w_up, xn.ptr(), up.ptr(), n, None, false)?;
            ops::swiglu(g, gate.ptr(), up.ptr(), n * ffn)?;
            matmul(g, &l.w_down, gate.ptr(), x.ptr(), n, None, true)?;
        }

        // Only the last new token of each sequence that wants logits goes through the
        // final norm and the output head, as on the CPU.
        let mut row = 0;
        let mut t_end = 0;
        for s in batch {
            t_end += s.tokens.len();
            if s.want_logits {
                ops::rmsnorm(
                    g,
                    x.at((t_end - 1) * d * f),
                    self.w.output_norm,
                    last.at(row * d * f),
                    1,
                    d,
                    cfg.rms_eps,
                )?;
                row += 1;
            }
        }
        if n_logits > 0 {
            // The head stays on the mat-vec: few rows, and its f16 copy would be the
            // largest scratch of all.
            ops::matvec(
                g,
                &self.w.output,
                last.ptr(),
                logits.ptr(),
                n_logits,
                None,
                false,
            )?;
        }
        let elapsed = g.step_end()?;
        if use_gemm {
            self.gemm_steps += 1;
        }
        self.fetch_logits(n_logits)?;
        Ok(elapsed)
    }
}
