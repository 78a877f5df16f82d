//! The CUDA forward step, written once against [`Gpu`]: the same sequence of
//! operations as the CPU forward (`model/forward.rs`), as kernel launches.
//!
//! embedding → per layer: RMSNorm → q, k, v ([`Matmul`]: the mat-vec, the tensor-core
//! mat-mul or dequantize + GEMM, by the step's rows; Qwen2's biases fused in) → Qwen3's
//! per-head q/k RMSNorm → RoPE and the KV write into the paged cache (one launch) →
//! attention (split-K decode when every sequence brings one token, else the causal
//! prefill kernel, on tensor cores with the f16 cache) → output projection with the
//! residual add fused → RMSNorm → gate, up → SwiGLU (one fused mat-vec launch for
//! decode batches of up to 4) → down with the residual fused → final RMSNorm of the
//! rows that want logits → output head → logits downloaded.
//!
//! The host uploads one small table per step (token ids, positions, cache slots, block
//! tables, per-sequence lengths), so each step costs one host-to-device copy and one
//! device-to-host copy of the logits. Every launch reads what changes from step to step
//! from that table, never from its arguments, which is what lets a decode step be
//! captured once per shape as a CUDA graph and replayed (`graphs.rs`): a decode batch
//! is padded to its graph's shape with sequences of length 0, whose rows write no KV
//! (slot -1), attend to nothing and whose logits are not downloaded.

use std::time::Duration;

use sparkd_kernels::consts::ATTN_PARTITION;

use super::backend::{ensure, token_bytes, CudaBackend};
use super::gpu::{i32_bytes, Buf, DevPtr, Gpu, GpuError};
use super::graphs::{GraphKey, MAX_GRAPH_SEQS};
use super::ops::{self, AttnInputs, AttnShape, NewTokens, Norm, Rope};
use super::weights::DevMatrix;
use crate::model::config::RopeStyle;
use crate::model::{SeqInput, BLOCK_TOKENS};

/// The input of a step's products, in the form their path reads.
#[derive(Debug, Clone, Copy)]
enum Input {
    /// f32 rows for the mat-vec, with the RMSNorm in front of the products folded in.
    F32(DevPtr, Option<Norm>),
    /// The rows' f16 copy, already made (in the step's `a16` or `h16`), for the
    /// tensor-core paths.
    F16(Buf),
}

/// Which kernels multiply activations by a weight matrix, chosen by the number of rows.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
enum Matmul {
    /// The CUDA-core mat-vec in f32: a few rows, where reading the weights is the cost.
    MatVec,
    /// Weights dequantized in registers into tensor-core tiles (`ops::mmq`): decode
    /// batches, where the mat-vec's per-row multiplies would be the cost.
    TensorCore,
    /// The whole matrix dequantized to f16, then the tiled GEMM (`ops::gemm`): prefill
    /// chunks, where the dequantization is shared by many rows.
    Gemm,
}

impl Matmul {
    fn for_rows(rows: usize, opts: &super::CudaOptions) -> Matmul {
        if rows >= opts.gemm_min_tokens.max(1) {
            Matmul::Gemm
        } else if rows >= opts.mmq_min_tokens.max(1) {
            Matmul::TensorCore
        } else {
            Matmul::MatVec
        }
    }
}

/// What a step computes, decided from the batch before anything is launched. In a
/// graph step the counts are padded to the graph's shape.
#[derive(Debug, Clone)]
struct StepShape {
    /// Token rows computed (real ones first).
    rows: usize,
    /// Sequences, each with a block-table row and a length.
    seqs: usize,
    n_splits: usize,
    max_blocks: usize,
    /// Every sequence brings one token: split-K decode attention.
    decode: bool,
    /// How the layer matrices are multiplied (`rows` decides).
    matmul: Matmul,
    /// Most tokens one sequence brings (the prefill attention's grid).
    max_q: usize,
    logit_rows: LogitRows,
    graph: Option<GraphKey>,
}

/// Which token rows go through the final norm and the output head.
#[derive(Debug, Clone)]
enum LogitRows {
    /// Every row, in order, with one launch (decode where every sequence samples).
    All,
    /// The last row of each sequence that wants logits.
    Picked(Vec<usize>),
}

impl StepShape {
    fn plan(batch: &[SeqInput<'_>], opts: &super::CudaOptions, graphs: bool) -> StepShape {
        let rows: usize = batch.iter().map(|s| s.tokens.len()).sum();
        let decode = batch.iter().all(|s| s.tokens.len() == 1);
        let max_len = batch
            .iter()
            .map(|s| s.start_pos + s.tokens.len())
            .max()
            .unwrap_or(1);
        let max_blocks = batch
            .iter()
            .map(|s| s.table.blocks().len())
            .max()
            .unwrap_or(0)
            .max(1);
        let n_splits = max_len.div_ceil(ATTN_PARTITION).max(1);
        let download_rows = batch.iter().filter(|s| s.want_logits).count();
        if graphs && decode && download_rows == batch.len() && batch.len() <= MAX_GRAPH_SEQS {
            let key = GraphKey {
                seqs: batch.len().next_power_of_two(),
                n_splits: n_splits.next_power_of_two(),
                max_blocks: max_blocks.next_power_of_two(),
            };
            return StepShape {
                rows: key.seqs,
                seqs: key.seqs,
                n_splits: key.n_splits,
                max_blocks: key.max_blocks,
                decode,
                matmul: Matmul::for_rows(key.seqs, opts),
                max_q: 1,
                logit_rows: LogitRows::All,
                graph: Some(key),
            };
        }
        let logit_rows = if decode && download_rows == batch.len() {
            LogitRows::All
        } else {
            let mut end = 0;
            LogitRows::Picked(
                batch
                    .iter()
                    .filter_map(|s| {
                        end += s.tokens.len();
                        s.want_logits.then_some(end - 1)
                    })
                    .collect(),
            )
        };
        StepShape {
            rows,
            seqs: batch.len(),
            n_splits,
            max_blocks,
            decode,
            matmul: Matmul::for_rows(rows, opts),
            max_q: batch.iter().map(|s| s.tokens.len()).max().unwrap_or(1),
            logit_rows,
            graph: None,
        }
    }

    fn head_rows(&self) -> usize {
        match &self.logit_rows {
            LogitRows::All => self.rows,
            LogitRows::Picked(rows) => rows.len(),
        }
    }
}

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
    words: usize,
}

impl Meta {
    /// The layout, which depends on the shape alone (a graph's tables stay put).
    fn layout(shape: &StepShape) -> Meta {
        let (n, s) = (shape.rows, shape.seqs);
        let tables = 3 * n;
        let seq_lens = tables + s * shape.max_blocks;
        let q_start = seq_lens + s;
        let q_len = q_start + s;
        let start_pos = q_len + s;
        Meta {
            tokens: 0,
            pos: n,
            slots: 2 * n,
            tables,
            seq_lens,
            q_start,
            q_len,
            start_pos,
            words: start_pos + s,
        }
    }

    /// The tables' contents for `batch`. Padding rows and sequences keep zeros, except
    /// that their cache slot is -1 (no KV write). Token ids are uploaded separately as
    /// u32 bytes over the first words.
    fn fill(&self, batch: &[SeqInput<'_>], shape: &StepShape) -> Vec<i32> {
        let mut words = vec![0i32; self.words];
        words[self.slots..self.slots + shape.rows].fill(-1);
        let mut t = 0;
        for (i, seq) in batch.iter().enumerate() {
            for j in 0..seq.tokens.len() {
                let p = seq.start_pos + j;
                let (block, slot) = seq.table.locate(p);
                words[self.pos + t] = p as i32;
                words[self.slots + t] = (block * BLOCK_TOKENS + slot) as i32;
                t += 1;
            }
            for (b, &block) in seq.table.blocks().iter().enumerate() {
                words[self.tables + i * shape.max_blocks + b] = block as i32;
            }
            words[self.seq_lens + i] = (seq.start_pos + seq.tokens.len()) as i32;
            words[self.q_start + i] = (t - seq.tokens.len()) as i32;
            words[self.q_len + i] = seq.tokens.len() as i32;
            words[self.start_pos + i] = seq.start_pos as i32;
        }
        words
    }
}

/// The device buffers one step uses.
#[derive(Clone, Copy)]
struct StepBufs {
    x: Buf,
    q: Buf,
    k: Buf,
    v: Buf,
    attn: Buf,
    gate: Buf,
    up: Buf,
    last: Buf,
    logits: Buf,
    part_o: Buf,
    part_ml: Buf,
    meta: Buf,
    /// f16 activations of the tensor-core paths, when the step takes one.
    a16: Option<Buf>,
    /// The FFN's f16 hidden rows (the fused gate/up mat-mul's output, which cannot
    /// overwrite its input in a16), on the tensor-core mat-mul path.
    h16: Option<Buf>,
    /// f16 weights of the GEMM path, when the step takes it.
    w16: Option<Buf>,
}

impl StepBufs {
    fn all(&self) -> Vec<Buf> {
        let mut v = vec![
            self.x,
            self.q,
            self.k,
            self.v,
            self.attn,
            self.gate,
            self.up,
            self.last,
            self.logits,
            self.part_o,
            self.part_ml,
            self.meta,
        ];
        v.extend(self.a16);
        v.extend(self.h16);
        v.extend(self.w16);
        v
    }
}

impl<G: Gpu> CudaBackend<G> {
    /// One forward step over a batch `check_batch` has accepted.
    pub(super) fn step(&mut self, batch: &[SeqInput<'_>]) -> Result<Duration, GpuError> {
        if batch.iter().all(|s| s.tokens.is_empty()) {
            self.fetch_outputs(&[])?;
            return Ok(Duration::ZERO);
        }
        // Per logit row (the batch items that want logits, in order): whether the host
        // needs only its argmax after a bias, both computed here inside the timed step.
        let greedy: Vec<Option<&[(u32, f32)]>> = batch
            .iter()
            .filter(|s| s.want_logits)
            .map(|s| s.greedy)
            .collect();
        // A kernel profile times launches one by one, which a graph replay is not.
        let graphs = self.opts.graphs && !self.graphs.broken && self.profile.is_none();
        let shape = StepShape::plan(batch, &self.opts, graphs);
        let meta = Meta::layout(&shape);
        let bufs = self.step_buffers(&shape, &meta)?;

        self.gpu.step_begin()?;
        self.gpu
            .upload(bufs.meta.ptr(), &i32_bytes(&meta.fill(batch, &shape)))?;
        self.gpu
            .upload(bufs.meta.at(meta.tokens * 4), &token_bytes(batch))?;
        match shape.graph {
            Some(key) => self.run_graph(key, &shape, &meta, &bufs)?,
            None => self.encode(&shape, &meta, &bufs)?,
        }
        if greedy.iter().any(Option::is_some) {
            self.launch_logit_bias(&greedy)?;
            self.launch_argmax(greedy.len())?;
        }
        let elapsed = self.gpu.step_end()?;
        if let Some(profile) = self.profile.as_mut() {
            profile.add_step(shape.decode, self.gpu.take_kernel_times()?);
        }
        if shape.matmul == Matmul::Gemm {
            self.gemm_steps += 1;
        }
        let picked: Vec<bool> = greedy.iter().map(Option::is_some).collect();
        self.fetch_outputs(&picked)?;
        Ok(elapsed)
    }

    /// The step's scratch, grown where this shape needs more.
    fn step_buffers(&mut self, shape: &StepShape, meta: &Meta) -> Result<StepBufs, GpuError> {
        let cfg = &self.cfg;
        let (n, d, ffn, hd) = (shape.rows, cfg.d_model, cfg.ffn_dim, cfg.head_dim);
        let (q_dim, kv_dim) = (cfg.q_dim(), cfg.kv_dim());
        let heads_splits = shape.seqs * cfg.n_heads * shape.n_splits;
        let head_rows = shape.head_rows().max(1);
        let g = &mut self.gpu;
        let sc = &mut self.scratch;
        let f = 4; // bytes per f32

        // Every matrix's input (the head's d_model included) fits `max_cols` a row.
        let max_cols = d.max(q_dim).max(ffn);
        let a16 = match shape.matmul {
            Matmul::MatVec => None,
            _ => Some(ensure(g, &mut sc.a16, n * max_cols * 2, "f16 activations")?),
        };
        let h16 = match shape.matmul {
            Matmul::TensorCore => Some(ensure(g, &mut sc.h16, n * ffn * 2, "f16 FFN hidden")?),
            _ => None,
        };
        let w16 = if shape.matmul == Matmul::Gemm {
            let max_elems = self
                .w
                .layers
                .iter()
                .flat_map(|l| [l.wq, l.wk, l.wv, l.wo, l.w_gate, l.w_up, l.w_down])
                .map(|m| m.rows * m.cols)
                .max()
                .unwrap_or(0);
            let w_bytes = (max_elems * 2).min(self.opts.gemm_scratch_max_bytes);
            Some(ensure(g, &mut sc.w16, w_bytes, "GEMM weights")?)
        } else {
            None
        };
        Ok(StepBufs {
            x: ensure(g, &mut sc.x, n * d * f, "activations")?,
            q: ensure(g, &mut sc.q, n * q_dim * f, "queries")?,
            k: ensure(g, &mut sc.k, n * kv_dim * f, "keys")?,
            v: ensure(g, &mut sc.v, n * kv_dim * f, "values")?,
            attn: ensure(g, &mut sc.attn, n * q_dim * f, "attention output")?,
            gate: ensure(g, &mut sc.gate, n * ffn * f, "ffn gate")?,
            up: ensure(g, &mut sc.up, n * ffn * f, "ffn up")?,
            last: ensure(g, &mut sc.last, head_rows * d * f, "final norm rows")?,
            logits: ensure(g, &mut sc.logits, head_rows * cfg.vocab_size * f, "logits")?,
            part_o: ensure(g, &mut sc.part_o, heads_splits * hd * f, "attention splits")?,
            part_ml: ensure(
                g,
                &mut sc.part_ml,
                heads_splits * 2 * f,
                "attention split maxima",
            )?,
            meta: ensure(g, &mut sc.meta, meta.words * 4, "step tables")?,
            a16,
            h16,
            w16,
        })
    }

    /// Replays the graph of `key`, capturing it first if this shape is new. A capture
    /// the driver refuses turns graphs off for good, with a warning, and the step runs
    /// launch by launch; a launch that fails while recording is the step's error.
    fn run_graph(
        &mut self,
        key: GraphKey,
        shape: &StepShape,
        meta: &Meta,
        bufs: &StepBufs,
    ) -> Result<(), GpuError> {
        let scratch = bufs.all();
        let graph = match self.graphs.get(&mut self.gpu, key, &scratch) {
            Some(g) => g,
            None => {
                self.gpu.capture_begin()?;
                let recorded = self.encode(shape, meta, bufs);
                match (recorded, self.gpu.capture_end()) {
                    (Ok(()), Ok(g)) => {
                        self.graphs.insert(&mut self.gpu, key, g, &scratch);
                        tracing::debug!(?key, graphs = self.graphs.len(), "decode step captured");
                        g
                    }
                    (Err(e), captured) => {
                        if let Ok(g) = captured {
                            self.gpu.graph_free(g);
                        }
                        return Err(e);
                    }
                    (Ok(()), Err(e)) => {
                        tracing::warn!(error = %e, "CUDA graph capture failed; decode steps run launch by launch from now on");
                        self.graphs.broken = true;
                        self.graphs.clear(&mut self.gpu);
                        return self.encode(shape, meta, bufs);
                    }
                }
            }
        };
        self.graphs.replayed += 1;
        self.gpu.graph_launch(graph)
    }

    /// Queues every launch of the step; all per-step values come from the tables.
    fn encode(&mut self, shape: &StepShape, meta: &Meta, b: &StepBufs) -> Result<(), GpuError> {
        let cfg = &self.cfg;
        let (n, d, ffn) = (shape.rows, cfg.d_model, cfg.ffn_dim);
        let (kv_dim, hd) = (cfg.kv_dim(), cfg.head_dim);
        let f = 4; // bytes per f32
        let opts = &self.opts;
        let g = &mut self.gpu;
        let at = |off: usize| b.meta.at(off * 4);

        // y = x W^T (+ bias) (+ y), by `Matmul::for_rows`; a matrix whose f16 copy does
        // not fit the GEMM scratch (a large vocabulary's head) takes the tensor-core
        // mat-mul instead. The input must be the one that path reads.
        let matmul = |g: &mut G,
                      w: &DevMatrix,
                      input: Input,
                      y: DevPtr,
                      rows: usize,
                      bias: Option<Buf>,
                      acc: bool|
         -> Result<(), GpuError> {
            match (Matmul::for_rows(rows, opts), input, b.w16) {
                (Matmul::MatVec, Input::F32(x, norm), _) => {
                    ops::matvec(g, w, x, y, rows, bias, acc, norm)
                }
                (Matmul::Gemm, Input::F16(x16), Some(w16)) if w.rows * w.cols * 2 <= w16.bytes => {
                    ops::gemm(g, w, (x16, w16), y, rows, bias, acc)
                }
                (Matmul::Gemm | Matmul::TensorCore, Input::F16(x16), _) => {
                    ops::mmq(g, w, x16, y, rows, bias, acc)
                }
                (path, input, ..) => Err(GpuError::Unsupported(format!(
                    "a {rows}-row product on {path:?} given {input:?}"
                ))),
            }
        };

        let (x, q, k, v) = (b.x, b.q, b.k, b.v);
        let (attn, gate, up) = (b.attn, b.gate, b.up);
        ops::embed(g, &self.w.tok_embd, at(meta.tokens), x.ptr(), n)?;
        let rope = Rope {
            inv_freq: self.w.rope_inv_freq,
            n_pairs: cfg.rope_dim / 2,
            linear_scale: cfg.rope_scaling.position_divisor(),
            neox: cfg.arch.rope_style() == RopeStyle::Neox,
            magnitude: cfg.rope_scaling.magnitude(),
            q_temperature: cfg
                .attn_temperature
                .map_or((0.0, 1), |t| (t.scale, t.floor)),
        };
        let kv_type = self.opts.kv_type;
        let layer_kv_bytes = self.pool.total_blocks() * BLOCK_TOKENS * kv_dim * kv_type.bytes();
        let attn_shape = AttnShape {
            n_heads: cfg.n_heads,
            n_kv_heads: cfg.n_kv_heads,
            head_dim: hd,
            n_seqs: shape.seqs,
            max_blocks: shape.max_blocks,
            kv: kv_type,
        };
        // The products' input, made once for all that read it: on the mat-vec, the f32
        // rows with the RMSNorm in front folded into the products; on the tensor-core
        // paths, the rows' f16 copy in a16, written by the norm itself.
        let tensor_cores = Matmul::for_rows(n, opts) != Matmul::MatVec;
        let eps = cfg.rms_eps;
        let a16 = || {
            b.a16
                .ok_or_else(|| GpuError::Unsupported("no f16 operand scratch".into()))
        };
        type Made = Result<Input, GpuError>;
        let normed = |g: &mut G, gain: Buf| -> Made {
            if !tensor_cores {
                return Ok(Input::F32(x.ptr(), Some(Norm { gain, eps })));
            }
            let a16 = a16()?;
            ops::rmsnorm_f16(g, x.ptr(), gain, a16, n, d, eps)?;
            Ok(Input::F16(a16))
        };
        // An f32 buffer of `rows` rows of `cols` as the input of products of `rows` rows.
        let plain = |g: &mut G, src: DevPtr, rows: usize, cols: usize| -> Made {
            if Matmul::for_rows(rows, opts) == Matmul::MatVec {
                return Ok(Input::F32(src, None));
            }
            let a16 = a16()?;
            ops::to_f16(g, src, a16, rows * cols)?;
            Ok(Input::F16(a16))
        };
        for (li, l) in self.w.layers.iter().enumerate() {
            let qkv = [
                (&l.wq, q.ptr(), l.bq),
                (&l.wk, k.ptr(), l.bk),
                (&l.wv, v.ptr(), l.bv),
            ];
            match normed(g, l.attn_norm)? {
                // Small decode batches: q, k and v share launches where they can.
                Input::F32(src, norm) => ops::matvec_many(g, &qkv, src, n, norm)?,
                input => {
                    for (w, y, bias) in qkv {
                        matmul(g, w, input, y, n, bias, false)?;
                    }
                }
            }
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
            let kc = self.k_cache.at(li * layer_kv_bytes);
            let vc = self.v_cache.at(li * layer_kv_bytes);
            let new_tokens = NewTokens {
                n,
                q: q.ptr(),
                k: k.ptr(),
                v: v.ptr(),
                pos: at(meta.pos),
                slots: at(meta.slots),
            };
            let heads = (cfg.n_heads, cfg.n_kv_heads, hd);
            ops::rope_kv_write(g, new_tokens, rope, heads, (kc, vc, kv_type))?;
            let io = AttnInputs {
                q: q.ptr(),
                k_cache: kc,
                v_cache: vc,
                block_tables: at(meta.tables),
                out: attn.ptr(),
            };
            if shape.decode {
                ops::attn_decode(
                    g,
                    attn_shape,
                    io,
                    at(meta.seq_lens),
                    shape.n_splits,
                    b.part_o,
                    b.part_ml,
                )?;
            } else {
                ops::attn_prefill(
                    g,
                    attn_shape,
                    io,
                    at(meta.q_start),
                    at(meta.q_len),
                    at(meta.start_pos),
                    shape.max_q,
                )?;
            }
            // The residual add is fused: x += attn Wo^T.
            let input = plain(g, attn.ptr(), n, cfg.q_dim())?;
            matmul(g, &l.wo, input, x.ptr(), n, None, true)?;
            let input = normed(g, l.ffn_norm)?;
            let glu = (&l.w_gate, &l.w_up);
            let down_input = match (input, b.h16) {
                (Input::F32(src, norm), _) if ops::matvec_glu_fits(glu.0, glu.1, n) => {
                    // Small decode batches: both products and SwiGLU in one launch.
                    ops::matvec_glu(g, glu, src, gate.ptr(), n, norm)?;
                    Input::F32(gate.ptr(), None)
                }
                (Input::F16(x16), Some(h16)) if ops::gate_up_fusable(glu.0, glu.1) => {
                    // Decode batches on the tensor-core mat-mul: the same, to the f16
                    // operand of down.
                    ops::mmq_glu(g, glu, x16, h16, n)?;
                    Input::F16(h16)
                }
                _ => {
                    matmul(g, &l.w_gate, input, gate.ptr(), n, None, false)?;
                    matmul(g, &l.w_up, input, up.ptr(), n, None, false)?;
                    match input {
                        Input::F32(..) => {
                            ops::swiglu(g, gate.ptr(), up.ptr(), n * ffn)?;
                            Input::F32(gate.ptr(), None)
                        }
                        Input::F16(x16) => {
                            ops::swiglu_f16(g, gate.ptr(), up.ptr(), x16, n * ffn)?;
                            Input::F16(x16)
                        }
                    }
                }
            };
            matmul(g, &l.w_down, down_input, x.ptr(), n, None, true)?;
        }

        // Only the rows that want logits go through the final norm and the output head,
        // as on the CPU.
        let head_rows = shape.head_rows();
        let head_input = match &shape.logit_rows {
            LogitRows::All => normed(g, self.w.output_norm)?,
            LogitRows::Picked(rows) => {
                for (i, &r) in rows.iter().enumerate() {
                    let (src, dst) = (x.at(r * d * f), b.last.at(i * d * f));
                    ops::rmsnorm(g, src, self.w.output_norm, dst, 1, d, eps)?;
                }
                plain(g, b.last.ptr(), head_rows, d)?
            }
        };
        if head_rows > 0 {
            // The head is the largest matrix: a decode batch reads it once through the
            // tensor-core mat-mul rather than once per 16 rows through the mat-vec.
            let logits = b.logits.ptr();
            matmul(
                g,
                &self.w.output,
                head_input,
                logits,
                head_rows,
                None,
                false,
            )?;
        }
        Ok(())
    }
}
