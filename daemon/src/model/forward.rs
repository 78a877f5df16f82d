//! The batched, stateless Llama-family forward pass on the CPU.
//!
//! One call processes a batch of sequences, each contributing some new tokens (a
//! prefill chunk or a single decode token) at its own positions. All new tokens of the
//! batch go through every weight matrix together, so each weight block is read once per
//! step whatever the batch size. Sequence state lives in the caller's KV cache and block
//! tables; the model itself is immutable.

use std::time::{Duration, Instant};

use crate::backend::cpu::{attn_kernels, matmul, MatmulMode, MatmulScratch, Softmax, ThreadPool};

use super::config::{ModelConfig, MAX_GQA_GROUP};
use super::kv::{BlockTable, KvCache, BLOCK_TOKENS};
use super::ops;
use super::Model;

/// One sequence's part of a forward step.
#[derive(Debug, Clone, Copy)]
pub struct SeqInput<'a> {
    pub table: &'a BlockTable,
    /// New tokens, at positions `start_pos..start_pos + tokens.len()`.
    pub tokens: &'a [u32],
    pub start_pos: usize,
    /// Whether the caller wants logits for this sequence's last new token.
    pub want_logits: bool,
    /// With `want_logits`, `Some(bias)`: the caller only needs the argmax of the logits
    /// plus `bias` (greedy decoding; `(token, value)` pairs added in order, ids inside
    /// the vocabulary), so a backend that computes it where the logits are
    /// ([`Backend::greedy_pick`]) may leave the row out of [`Backend::logits_mut`] and
    /// save its copy to the host. `None`: the caller needs the logits themselves.
    ///
    /// [`Backend::greedy_pick`]: crate::backend::Backend::greedy_pick
    /// [`Backend::logits_mut`]: crate::backend::Backend::logits_mut
    pub greedy: Option<&'a [(u32, f32)]>,
}

#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum ForwardError {
    #[error("token id {token} is outside the vocabulary of {vocab}")]
    TokenOutOfRange { token: u32, vocab: usize },
    #[error("position {pos} is past the context length {ctx}")]
    PastContext { pos: usize, ctx: usize },
    #[error("position {pos} has no KV block reserved (table holds {capacity})")]
    NoKvBlock { pos: usize, capacity: usize },
    #[error("a sequence in the batch has no tokens")]
    EmptySequence,
}

/// Refuses a batch the forward cannot run: empty sequences, tokens outside the
/// vocabulary, positions past the context or the sequence's reserved KV blocks. Every
/// backend checks with this before touching its buffers.
pub fn check_batch(cfg: &ModelConfig, batch: &[SeqInput<'_>]) -> Result<(), ForwardError> {
    for s in batch {
        if s.tokens.is_empty() {
            return Err(ForwardError::EmptySequence);
        }
        if let Some(&token) = s.tokens.iter().find(|&&t| t as usize >= cfg.vocab_size) {
            return Err(ForwardError::TokenOutOfRange {
                token,
                vocab: cfg.vocab_size,
            });
        }
        let end = s.start_pos + s.tokens.len();
        if end > cfg.context_length {
            return Err(ForwardError::PastContext {
                pos: end - 1,
                ctx: cfg.context_length,
            });
        }
        if end > s.table.capacity() {
            return Err(ForwardError::NoKvBlock {
                pos: end - 1,
                capacity: s.table.capacity(),
            });
        }
    }
    Ok(())
}

/// Reusable buffers for forward steps, plus the thread pool. One per engine; nothing in
/// it outlives a step except capacity.
pub struct Workspace {
    pool: ThreadPool,
    scratch: MatmulScratch,
    x: Vec<f32>,
    xn: Vec<f32>,
    q: Vec<f32>,
    k: Vec<f32>,
    v: Vec<f32>,
    attn: Vec<f32>,
    proj: Vec<f32>,
    gate: Vec<f32>,
    up: Vec<f32>,
    last: Vec<f32>,
    logits: Vec<f32>,
    /// For each new token of the step: (batch item, position).
    token_pos: Vec<(usize, usize)>,
    /// Per new token, `(sin, cos)` of each rotary angle: the same in every layer.
    rope_sin_cos: Vec<(f32, f32)>,
    logit_rows: usize,
}

impl Workspace {
    pub fn new(threads: usize) -> Self {
        Self::with_matmul_mode(threads, MatmulMode::Serving)
    }

    /// A workspace whose steps multiply in `mode` (the reference for parity checks).
    pub fn with_matmul_mode(threads: usize, mode: MatmulMode) -> Self {
        Workspace {
            pool: ThreadPool::new(threads.max(1)),
            scratch: MatmulScratch::new(mode),
            x: Vec::new(),
            xn: Vec::new(),
            q: Vec::new(),
            k: Vec::new(),
            v: Vec::new(),
            attn: Vec::new(),
            proj: Vec::new(),
            gate: Vec::new(),
            up: Vec::new(),
            last: Vec::new(),
            logits: Vec::new(),
            token_pos: Vec::new(),
            rope_sin_cos: Vec::new(),
            logit_rows: 0,
        }
    }

    pub fn threads(&self) -> usize {
        self.pool.n_threads()
    }

    /// Logits of the `i`-th batch item that asked for them (in batch order).
    pub fn logits(&self, i: usize, vocab: usize) -> &[f32] {
        &self.logits[i * vocab..(i + 1) * vocab]
    }

    pub fn logits_mut(&mut self, i: usize, vocab: usize) -> &mut [f32] {
        &mut self.logits[i * vocab..(i + 1) * vocab]
    }

    /// The first `rows` logit rows, back to back (fewer if the step made fewer), and
    /// the pool.
    pub fn logit_rows_mut(&mut self, rows: usize, vocab: usize) -> (&mut [f32], &ThreadPool) {
        let n = (rows * vocab).min(self.logits.len());
        (&mut self.logits[..n], &self.pool)
    }

    pub fn logit_rows(&self) -> usize {
        self.logit_rows
    }

    fn resize(&mut self, cfg: &ModelConfig, n: usize, n_logits: usize) {
        let fit = |v: &mut Vec<f32>, len: usize| {
            v.clear();
            v.resize(len, 0.0);
        };
        fit(&mut self.x, n * cfg.d_model);
        fit(&mut self.xn, n * cfg.d_model);
        fit(&mut self.q, n * cfg.q_dim());
        fit(&mut self.k, n * cfg.kv_dim());
        fit(&mut self.v, n * cfg.kv_dim());
        fit(&mut self.attn, n * cfg.q_dim());
        fit(&mut self.proj, n * cfg.d_model);
        fit(&mut self.gate, n * cfg.ffn_dim);
        fit(&mut self.up, n * cfg.ffn_dim);
        fit(&mut self.last, n_logits * cfg.d_model);
        fit(&mut self.logits, n_logits * cfg.vocab_size);
    }
}

/// A raw pointer that worker threads write through, each to ranges no other thread
/// touches in the same parallel section (see each use).
#[derive(Clone, Copy)]
struct SharedOut(*mut f32);
// SAFETY: only used inside `ThreadPool::run` sections whose tasks write disjoint ranges
// of a buffer that outlives the section.
unsafe impl Send for SharedOut {}
unsafe impl Sync for SharedOut {}

impl SharedOut {
    /// # Safety
    /// `offset..offset + len` lies inside the buffer, and no other thread touches that
    /// range while the returned slice lives.
    #[allow(clippy::mut_from_ref)]
    unsafe fn range(&self, offset: usize, len: usize) -> &mut [f32] {
        std::slice::from_raw_parts_mut(self.0.add(offset), len)
    }
}

/// From this many elements on, `silu_mul` runs on the pool (one `exp` each: with a
/// batch of tokens it is worth a dispatch; a single token's is not).
const PARALLEL_SILU_ELEMS: usize = 8 * 1024;

/// `ops::silu_mul`, split over the pool for large batches (elementwise: the same bits).
fn silu_mul(pool: &ThreadPool, gate: &mut [f32], up: &[f32]) {
    if gate.len() < PARALLEL_SILU_ELEMS || pool.n_threads() == 1 {
        return ops::silu_mul(gate, up);
    }
    let per = gate.len().div_ceil(pool.n_threads()).next_multiple_of(16);
    let out = SharedOut(gate.as_mut_ptr());
    let len = gate.len();
    pool.run(&|t, _| {
        let start = (t * per).min(len);
        let end = ((t + 1) * per).min(len);
        // SAFETY: thread t alone touches gate[start..end] (disjoint ranges by t), which
        // lies inside `gate`; the borrow of `gate` outlives the run.
        let g = unsafe { out.range(start, end - start) };
        ops::silu_mul(g, &up[start..end]);
    });
}

impl Model {
    /// Runs one step over `batch`, writing its K/V into `kv` and the requested logits
    /// into `ws`. Returns the step's duration so the engine can book it on every
    /// sequence in the step.
    pub fn forward(
        &self,
        batch: &[SeqInput<'_>],
        kv: &mut KvCache,
        ws: &mut Workspace,
    ) -> Result<Duration, ForwardError> {
        let started = Instant::now();
        let cfg = &self.config;
        check_batch(cfg, batch)?;
        let n: usize = batch.iter().map(|s| s.tokens.len()).sum();
        let n_logits = batch.iter().filter(|s| s.want_logits).count();
        ws.resize(cfg, n, n_logits);
        ws.logit_rows = n_logits;
        ws.token_pos.clear();
        for (i, s) in batch.iter().enumerate() {
            ws.token_pos
                .extend((0..s.tokens.len()).map(|j| (i, s.start_pos + j)));
        }

        let file = &self.file;
        let w = &self.weights;
        let d = cfg.d_model;
        let embd = w.tok_embd.view(file);
        for (t, &tok) in batch.iter().flat_map(|s| s.tokens).enumerate() {
            crate::backend::cpu::dequantize_row(embd, tok as usize, &mut ws.x[t * d..(t + 1) * d]);
        }

        let (q_dim, kv_dim, hd) = (cfg.q_dim(), cfg.kv_dim(), cfg.head_dim);
        let style = cfg.arch.rope_style();
        let pairs = w.rope_inv_freq.len();
        let magnitude = cfg.rope_scaling.magnitude();
        ws.rope_sin_cos.clear();
        for &(_, p) in &ws.token_pos {
            let pos = p as f32 / cfg.rope_scaling.position_divisor();
            ops::rope_angles(pos, &w.rope_inv_freq, magnitude, &mut ws.rope_sin_cos);
        }
        for (li, layer) in w.layers.iter().enumerate() {
            for t in 0..n {
                let r = t * d..(t + 1) * d;
                ops::rms_norm(
                    &ws.x[r.clone()],
                    &layer.attn_norm,
                    cfg.rms_eps,
                    &mut ws.xn[r],
                );
            }
            matmul(
                &ws.pool,
                layer.wq.view(file),
                &ws.xn,
                n,
                &mut ws.q,
                &mut ws.scratch,
            );
            matmul(
                &ws.pool,
                layer.wk.view(file),
                &ws.xn,
                n,
                &mut ws.k,
                &mut ws.scratch,
            );
            matmul(
                &ws.pool,
                layer.wv.view(file),
                &ws.xn,
                n,
                &mut ws.v,
                &mut ws.scratch,
            );
            for t in 0..n {
                if let Some(b) = &layer.bq {
                    ops::add_assign(&mut ws.q[t * q_dim..(t + 1) * q_dim], b);
                }
                if let Some(b) = &layer.bk {
                    ops::add_assign(&mut ws.k[t * kv_dim..(t + 1) * kv_dim], b);
                }
                if let Some(b) = &layer.bv {
                    ops::add_assign(&mut ws.v[t * kv_dim..(t + 1) * kv_dim], b);
                }
                let sin_cos = &ws.rope_sin_cos[t * pairs..(t + 1) * pairs];
                let (item, p) = ws.token_pos[t];
                let q_factor = cfg.attn_temperature.map(|a| a.factor(p));
                for h in ws.q[t * q_dim..(t + 1) * q_dim].chunks_exact_mut(hd) {
                    if let Some(g) = &layer.q_norm {
                        ops::rms_norm_in_place(h, g, cfg.rms_eps);
                    }
                    ops::rope_with(h, sin_cos, style);
                    if let Some(f) = q_factor.filter(|&f| f != 1.0) {
                        h.iter_mut().for_each(|x| *x *= f);
                    }
                }
                for h in ws.k[t * kv_dim..(t + 1) * kv_dim].chunks_exact_mut(hd) {
                    if let Some(g) = &layer.k_norm {
                        ops::rms_norm_in_place(h, g, cfg.rms_eps);
                    }
                    ops::rope_with(h, sin_cos, style);
                }
                let kv_range = t * kv_dim..(t + 1) * kv_dim;
                kv.write(
                    li,
                    batch[item].table,
                    p,
                    &ws.k[kv_range.clone()],
                    &ws.v[kv_range],
                );
            }
            self.attention(li, batch, kv, ws);
            matmul(
                &ws.pool,
                layer.wo.view(file),
                &ws.attn,
                n,
                &mut ws.proj,
                &mut ws.scratch,
            );
            ops::add_assign(&mut ws.x, &ws.proj);

            for t in 0..n {
                let r = t * d..(t + 1) * d;
                ops::rms_norm(
                    &ws.x[r.clone()],
                    &layer.ffn_norm,
                    cfg.rms_eps,
                    &mut ws.xn[r],
                );
            }
            matmul(
                &ws.pool,
                layer.w_gate.view(file),
                &ws.xn,
                n,
                &mut ws.gate,
                &mut ws.scratch,
            );
            matmul(
                &ws.pool,
                layer.w_up.view(file),
                &ws.xn,
                n,
                &mut ws.up,
                &mut ws.scratch,
            );
            silu_mul(&ws.pool, &mut ws.gate, &ws.up);
            matmul(
                &ws.pool,
                layer.w_down.view(file),
                &ws.gate,
                n,
                &mut ws.proj,
                &mut ws.scratch,
            );
            ops::add_assign(&mut ws.x, &ws.proj);
        }

        // Only the last new token of a sequence that asked for logits goes through the
        // final norm and the (large) output head.
        let mut row = 0;
        let mut t_end = 0;
        for s in batch {
            t_end += s.tokens.len();
            if s.want_logits {
                let r = (t_end - 1) * d..t_end * d;
                ops::rms_norm(
                    &ws.x[r],
                    &w.output_norm,
                    cfg.rms_eps,
                    &mut ws.last[row * d..(row + 1) * d],
                );
                row += 1;
            }
        }
        if n_logits > 0 {
            matmul(
                &ws.pool,
                w.output.view(file),
                &ws.last,
                n_logits,
                &mut ws.logits,
                &mut ws.scratch,
            );
        }
        Ok(started.elapsed())
    }

    /// Causal grouped-query attention of every new token over its sequence's cached
    /// positions. Tasks are (token, kv head) pairs spread over the pool; the query heads
    /// sharing a kv head are done together so each cached key is read once for them.
    fn attention(&self, layer: usize, batch: &[SeqInput<'_>], kv: &KvCache, ws: &mut Workspace) {
        let cfg = &self.config;
        let (hd, q_dim, kv_dim) = (cfg.head_dim, cfg.q_dim(), cfg.kv_dim());
        let group = cfg.n_heads / cfg.n_kv_heads;
        let n_tasks = ws.token_pos.len() * cfg.n_kv_heads;
        let scale = 1.0 / (hd as f32).sqrt();
        let out = SharedOut(ws.attn.as_mut_ptr());
        let q = &ws.q;
        let token_pos = &ws.token_pos;
        let ak = attn_kernels();
        let task = |task: usize, acc: &mut Vec<f32>| {
            let (t, g) = (task / cfg.n_kv_heads, task % cfg.n_kv_heads);
            let (item, pos) = token_pos[t];
            let table = batch[item].table;
            let q_heads = &q[t * q_dim + g * group * hd..t * q_dim + (g + 1) * group * hd];
            acc.clear();
            acc.resize(group * hd, 0.0);
            // Online softmax (running max and denominator per query head, so no
            // per-position buffer grows with the context), a KV block at a time: the
            // block's scores first, then the per-position updates.
            let mut state = [Softmax::default(); MAX_GQA_GROUP];
            let mut scores = [0.0f32; BLOCK_TOKENS];
            let n_pos = pos + 1;
            for (bi, &block) in table.blocks().iter().enumerate() {
                let first = bi * BLOCK_TOKENS;
                if first >= n_pos {
                    break;
                }
                let slots = (n_pos - first).min(BLOCK_TOKENS);
                let keys = &kv.key_block(layer, block as usize)[g * hd..];
                let values = &kv.value_block(layer, block as usize)[g * hd..];
                let scores = &mut scores[..slots];
                // Heads are independent: head by head gives the same bits as position
                // by position.
                for h in 0..group {
                    (ak.scores)(&q_heads[h * hd..(h + 1) * hd], keys, kv_dim, scale, scores);
                    let a = &mut acc[h * hd..(h + 1) * hd];
                    (ak.online)(scores, values, kv_dim, &mut state[h], a);
                }
            }
            for h in 0..group {
                let inv = 1.0 / state[h].denom;
                let o = t * q_dim + (g * group + h) * hd;
                // SAFETY: task (t, g) writes only attn[t][g*group*hd .. (g+1)*group*hd],
                // which no other task writes; `attn` is sized n * q_dim by `resize`.
                let dst = unsafe { out.range(o, hd) };
                for (d, &a) in dst.iter_mut().zip(&acc[h * hd..(h + 1) * hd]) {
                    *d = a * inv;
                }
            }
        };
        if n_tasks <= cfg.n_kv_heads {
            // A single decode token: not worth waking the pool.
            let mut acc = Vec::new();
            (0..n_tasks).for_each(|i| task(i, &mut acc));
        } else {
            ws.pool.run(&|tid, nth| {
                let mut acc = Vec::new();
                let mut i = tid;
                while i < n_tasks {
                    task(i, &mut acc);
                    i += nth;
                }
            });
        }
    }
}
