//! One launch per operation of the forward, with the grid, block and argument order
//! each kernel's header comment documents (kernels/*.cu). Nothing here decides what
//! runs; `forward.rs` does.

use sparkd_kernels::consts::{
    ATTN_DECODE_THREADS, ATTN_PREFILL_QUERIES, ATTN_PREFILL_TC_QUERIES, ATTN_PREFILL_TC_THREADS,
    ATTN_PREFILL_THREADS, GEMM_THREADS, GEMM_TILE, MMQ_MAX_TOKENS, MMQ_ROWS, MMQ_THREADS,
    MMV_GLU_ROWS_PER_BLOCK, MMV_MAX_BATCH, MMV_ROWS_PER_BLOCK, MMV_THREADS,
};
use sparkd_kernels::names::{self, Half, KvType};

use super::gpu::{to_u32, Buf, DevPtr, Gpu, GpuError, KArg, Launch};
use super::weights::DevMatrix;

/// Threads of the element-wise and grid-stride kernels.
const EW_THREADS: u32 = 256;
/// Most blocks a grid-stride launch gets: enough to fill any GPU, and it keeps the
/// emulator (which runs blocks one after another) from spawning needless threads.
const MAX_STRIDE_BLOCKS: usize = 4096;

fn i32_arg(v: usize) -> KArg {
    KArg::I32(i32::try_from(v).unwrap_or(i32::MAX))
}

fn stride_blocks(count: usize) -> usize {
    count
        .div_ceil(EW_THREADS as usize)
        .clamp(1, MAX_STRIDE_BLOCKS)
}

/// Block size for a row-wise reduction over `n` elements: a warp multiple up to 256.
fn row_threads(n: usize) -> u32 {
    (n.div_ceil(32) * 32).clamp(32, 256) as u32
}

pub fn embed(
    gpu: &mut dyn Gpu,
    table: &DevMatrix,
    tokens: DevPtr,
    out: DevPtr,
    n: usize,
) -> Result<(), GpuError> {
    gpu.launch(
        &names::embed(table.ty),
        Launch::linear(n, 256),
        &[
            KArg::Ptr(table.buf.ptr()),
            KArg::Ptr(tokens),
            KArg::Ptr(out),
            i32_arg(n),
            i32_arg(table.cols),
            i32_arg(table.rows),
        ],
    )
}

/// `out[r] = rmsnorm(x[r]) * w` for `rows` rows of `n`; `out` may be `x`.
pub fn rmsnorm(
    gpu: &mut dyn Gpu,
    x: DevPtr,
    w: Buf,
    out: DevPtr,
    rows: usize,
    n: usize,
    eps: f32,
) -> Result<(), GpuError> {
    gpu.launch(
        names::RMSNORM,
        Launch::linear(rows, row_threads(n)),
        &[
            KArg::Ptr(x),
            KArg::Ptr(w.ptr()),
            KArg::Ptr(out),
            i32_arg(n),
            KArg::F32(eps),
        ],
    )
}

/// An RMSNorm fused into the mat-vec that reads its output (see matvec.cu).
#[derive(Debug, Clone, Copy)]
pub struct Norm {
    pub gain: Buf,
    pub eps: f32,
}

fn norm_args(norm: Option<Norm>) -> [KArg; 2] {
    match norm {
        Some(n) => [KArg::Ptr(n.gain.ptr()), KArg::F32(n.eps)],
        None => [KArg::Null, KArg::F32(0.0)],
    }
}

/// RMSNorm of `rows` rows of `n` straight to their f16 copy in `a16`, the operand of
/// the tensor-core products.
pub fn rmsnorm_f16(
    gpu: &mut dyn Gpu,
    x: DevPtr,
    w: Buf,
    a16: Buf,
    rows: usize,
    n: usize,
    eps: f32,
) -> Result<(), GpuError> {
    gpu.launch(
        names::RMSNORM_F16,
        Launch::linear(rows, row_threads(n)),
        &[
            KArg::Ptr(x),
            KArg::Ptr(w.ptr()),
            KArg::Ptr(a16.ptr()),
            i32_arg(n),
            KArg::F32(eps),
        ],
    )
}

/// `y = x' W^T (+ bias) (+ y)` with the decode mat-vec, `MMV_MAX_BATCH` rows a launch;
/// x' is `x`, or with `norm` its RMSNorm, computed on the way.
#[allow(clippy::too_many_arguments)]
pub fn matvec(
    gpu: &mut dyn Gpu,
    w: &DevMatrix,
    x: DevPtr,
    y: DevPtr,
    n: usize,
    bias: Option<Buf>,
    accumulate: bool,
    norm: Option<Norm>,
) -> Result<(), GpuError> {
    let [gain, eps] = norm_args(norm);
    let mut row = 0;
    while row < n {
        let nb = (n - row).min(MMV_MAX_BATCH);
        let variant = names::mmv_variant(nb).unwrap_or(MMV_MAX_BATCH);
        gpu.launch(
            &names::mmv(w.ty, variant),
            Launch::linear(w.rows.div_ceil(MMV_ROWS_PER_BLOCK), MMV_THREADS),
            &[
                KArg::Ptr(w.buf.ptr()),
                KArg::Ptr(x.offset_by(row * w.cols * 4)),
                KArg::Ptr(y.offset_by(row * w.rows * 4)),
                bias.map_or(KArg::Null, |b| KArg::Ptr(b.ptr())),
                i32_arg(w.rows),
                i32_arg(w.cols),
                i32_arg(nb),
                KArg::I32(accumulate as i32),
                gain,
                eps,
            ],
        )?;
        row += nb;
    }
    Ok(())
}

/// One product of [`matvec_many`]: the matrix, its output and bias.
pub type Product<'a> = (&'a DevMatrix, DevPtr, Option<Buf>);

/// Several mat-vec products of one input (a layer's q, k and v): runs of up to three
/// matrices of one format share a launch (`mmv3`) where the batch has a fused variant;
/// the rest go one by one through [`matvec`].
pub fn matvec_many(
    gpu: &mut dyn Gpu,
    products: &[Product<'_>],
    x: DevPtr,
    n: usize,
    norm: Option<Norm>,
) -> Result<(), GpuError> {
    let [gain, eps] = norm_args(norm);
    let mut rest = products;
    while let Some(&(first, ..)) = rest.first() {
        let run = rest
            .iter()
            .take(3)
            .take_while(|(w, ..)| w.ty == first.ty && w.cols == first.cols)
            .count();
        let (group, tail) = rest.split_at(run);
        rest = tail;
        let Some(variant) = names::mmv_fused_variant(n).filter(|_| run > 1) else {
            for &(w, y, bias) in group {
                matvec(gpu, w, x, y, n, bias, false, norm)?;
            }
            continue;
        };
        let member = |i: usize| group.get(i).copied();
        let mut args = Vec::with_capacity(17);
        for i in 0..3 {
            args.push(member(i).map_or(KArg::Null, |(w, ..)| KArg::Ptr(w.buf.ptr())));
        }
        for i in 0..3 {
            args.push(member(i).map_or(KArg::Null, |(_, y, _)| KArg::Ptr(y)));
        }
        for i in 0..3 {
            let bias = member(i).and_then(|(_, _, b)| b);
            args.push(bias.map_or(KArg::Null, |b| KArg::Ptr(b.ptr())));
        }
        for i in 0..3 {
            args.push(i32_arg(member(i).map_or(0, |(w, ..)| w.rows)));
        }
        args.extend([KArg::Ptr(x), i32_arg(first.cols), i32_arg(n), gain, eps]);
        let blocks: usize = group
            .iter()
            .map(|(w, ..)| w.rows.div_ceil(MMV_ROWS_PER_BLOCK))
            .sum();
        gpu.launch(
            &names::mmv3(first.ty, variant),
            Launch::linear(blocks, MMV_THREADS),
            &args,
        )?;
    }
    Ok(())
}

/// Whether the FFN's `gate` and `up` can share a fused launch (`matvec_glu`,
/// `mmq_glu`): one format and one shape.
pub fn gate_up_fusable(gate: &DevMatrix, up: &DevMatrix) -> bool {
    gate.ty == up.ty && (gate.rows, gate.cols) == (up.rows, up.cols)
}

/// Whether the fused mat-vec (`matvec_glu`) takes `gate` and `up` for `n` activation
/// rows: fusable, and a batch it is compiled for.
pub fn matvec_glu_fits(gate: &DevMatrix, up: &DevMatrix, n: usize) -> bool {
    gate_up_fusable(gate, up) && names::mmv_fused_variant(n).is_some()
}

/// `y = silu(x' Wg^T) * (x' Wu^T)` in one launch, for `n` rows within
/// [`matvec_glu_fits`]; x' as in [`matvec`].
pub fn matvec_glu(
    gpu: &mut dyn Gpu,
    (gate, up): (&DevMatrix, &DevMatrix),
    x: DevPtr,
    y: DevPtr,
    n: usize,
    norm: Option<Norm>,
) -> Result<(), GpuError> {
    let [gain, eps] = norm_args(norm);
    let variant = names::mmv_fused_variant(n)
        .filter(|_| matvec_glu_fits(gate, up, n))
        .ok_or_else(|| GpuError::Unsupported(format!("a fused gate/up mat-vec of {n} rows")))?;
    gpu.launch(
        &names::mmv_glu(gate.ty, variant),
        Launch::linear(gate.rows.div_ceil(MMV_GLU_ROWS_PER_BLOCK), MMV_THREADS),
        &[
            KArg::Ptr(gate.buf.ptr()),
            KArg::Ptr(up.buf.ptr()),
            KArg::Ptr(x),
            KArg::Ptr(y),
            i32_arg(gate.rows),
            i32_arg(gate.cols),
            i32_arg(n),
            gain,
            eps,
        ],
    )
}

/// The first `count` f32s at `x` rounded to f16 into `a16`: the activation operand of
/// the tensor-core paths, made once for all the products that read it.
pub fn to_f16(gpu: &mut dyn Gpu, x: DevPtr, a16: Buf, count: usize) -> Result<(), GpuError> {
    gpu.launch(
        &names::convert_from_f32(Half::F16),
        Launch::linear(stride_blocks(count), EW_THREADS),
        &[KArg::Ptr(x), KArg::Ptr(a16.ptr()), KArg::I64(count as i64)],
    )
}

/// The launches of a tensor-core mat-mul over `n` rows: (first row, rows, the kernel
/// width for them), `MMQ_MAX_TOKENS` rows at most each.
fn mmq_chunks(n: usize) -> impl Iterator<Item = (usize, usize, usize)> {
    (0..n).step_by(MMQ_MAX_TOKENS).map(move |row| {
        let nt = (n - row).min(MMQ_MAX_TOKENS);
        (row, nt, names::mmq_variant(nt).unwrap_or(MMQ_MAX_TOKENS))
    })
}

/// `y = x W^T (+ bias) (+ y)` on the tensor cores with the weights dequantized in
/// registers, where `a16` holds x's `n` rows in f16 ([`to_f16`], [`rmsnorm_f16`],
/// [`swiglu_f16`]): one launch per `MMQ_MAX_TOKENS` rows, each reading every weight
/// once.
pub fn mmq(
    gpu: &mut dyn Gpu,
    w: &DevMatrix,
    a16: Buf,
    y: DevPtr,
    n: usize,
    bias: Option<Buf>,
    accumulate: bool,
) -> Result<(), GpuError> {
    for (row, nt, width) in mmq_chunks(n) {
        gpu.launch(
            &names::mmq(w.ty, width),
            Launch::linear(w.rows.div_ceil(MMQ_ROWS), MMQ_THREADS),
            &[
                KArg::Ptr(w.buf.ptr()),
                KArg::Ptr(a16.at(row * w.cols * 2)),
                KArg::Ptr(y.offset_by(row * w.rows * 4)),
                bias.map_or(KArg::Null, |b| KArg::Ptr(b.ptr())),
                i32_arg(w.rows),
                i32_arg(w.cols),
                i32_arg(nt),
                KArg::I32(accumulate as i32),
            ],
        )?;
    }
    Ok(())
}

/// `out16 = f16(silu(x Wg^T) * (x Wu^T))` on the tensor cores, where `a16` holds x's
/// `n` rows in f16 (as [`mmq`]); one launch per `MMQ_MAX_TOKENS` rows. `out16` must not
/// be `a16`: later blocks still read the input.
pub fn mmq_glu(
    gpu: &mut dyn Gpu,
    (gate, up): (&DevMatrix, &DevMatrix),
    a16: Buf,
    out16: Buf,
    n: usize,
) -> Result<(), GpuError> {
    if !gate_up_fusable(gate, up) || a16.id == out16.id {
        return Err(GpuError::Unsupported(
            "a fused gate/up mat-mul of these matrices or buffers".into(),
        ));
    }
    for (row, nt, width) in mmq_chunks(n) {
        gpu.launch(
            &names::mmq_glu(gate.ty, width),
            Launch::linear(gate.rows.div_ceil(MMQ_ROWS / 2), MMQ_THREADS),
            &[
                KArg::Ptr(gate.buf.ptr()),
                KArg::Ptr(up.buf.ptr()),
                KArg::Ptr(a16.at(row * gate.cols * 2)),
                KArg::Ptr(out16.at(row * gate.rows * 2)),
                i32_arg(gate.rows),
                i32_arg(gate.cols),
                i32_arg(nt),
            ],
        )?;
    }
    Ok(())
}

/// The prefill path: the whole of `w` dequantized to f16 into `w16`, then the
/// tensor-core GEMM `y = x W^T (+ bias) (+ y)` on x's f16 rows in `a16` (as [`mmq`]).
/// The GEMM writes its output with leading dimension `w.rows`, so a panel of `w`'s
/// rows could not land in place: the scratch holds the whole matrix (the caller sizes
/// it for the largest layer matrix and takes the tensor-core mat-mul for anything
/// bigger).
pub fn gemm(
    gpu: &mut dyn Gpu,
    w: &DevMatrix,
    (a16, w16): (Buf, Buf),
    y: DevPtr,
    n: usize,
    bias: Option<Buf>,
    accumulate: bool,
) -> Result<(), GpuError> {
    let elems = w.rows * w.cols;
    gpu.launch(
        &names::dequant(w.ty, Half::F16),
        Launch::linear(stride_blocks(elems.div_ceil(8)), EW_THREADS),
        &[
            KArg::Ptr(w.buf.ptr()),
            KArg::Ptr(w16.ptr()),
            i32_arg(w.rows),
            i32_arg(w.cols),
        ],
    )?;
    gpu.launch(
        &names::gemm(Half::F16),
        Launch::new(
            [
                to_u32(n.div_ceil(GEMM_TILE)),
                to_u32(w.rows.div_ceil(GEMM_TILE)),
                1,
            ],
            GEMM_THREADS,
        ),
        &[
            KArg::Ptr(a16.ptr()),
            KArg::Ptr(w16.ptr()),
            KArg::Ptr(y),
            bias.map_or(KArg::Null, |b| KArg::Ptr(b.ptr())),
            i32_arg(n),
            i32_arg(w.rows),
            i32_arg(w.cols),
            KArg::I32(accumulate as i32),
        ],
    )
}

/// The model's rotary embedding.
#[derive(Debug, Clone, Copy)]
pub struct Rope {
    pub inv_freq: Buf,
    /// Rotated pairs per head (`rope_dim / 2`); dimensions past them pass through.
    pub n_pairs: usize,
    pub linear_scale: f32,
    pub neox: bool,
    /// YaRN's factor on the rotations (1 elsewhere).
    pub magnitude: f32,
    /// Llama 4 style attention temperature: (scale, floor), scale 0 for none.
    pub q_temperature: (f32, usize),
}

/// A layer's new tokens: q, k, v (`n` rows) and where their keys and values go.
#[derive(Debug, Clone, Copy)]
pub struct NewTokens {
    pub n: usize,
    pub q: DevPtr,
    pub k: DevPtr,
    pub v: DevPtr,
    /// Per token: its position, and its cache slot (`block * 16 + slot`, -1 to skip).
    pub pos: DevPtr,
    pub slots: DevPtr,
}

/// Rotates `q` in place and `k` into the layer's cache at the tokens' positions, and
/// stores the values beside the keys: one launch.
pub fn rope_kv_write(
    gpu: &mut dyn Gpu,
    t: NewTokens,
    rope: Rope,
    (n_heads, n_kv_heads, head_dim): (usize, usize, usize),
    (k_cache, v_cache, kv): (DevPtr, DevPtr, KvType),
) -> Result<(), GpuError> {
    let total = t.n * (n_heads + n_kv_heads) * (head_dim / 2);
    if total == 0 {
        return Ok(());
    }
    gpu.launch(
        &names::rope_kv_write(kv),
        Launch::linear(stride_blocks(total), EW_THREADS),
        &[
            KArg::Ptr(t.q),
            KArg::Ptr(t.k),
            KArg::Ptr(t.v),
            KArg::Ptr(k_cache),
            KArg::Ptr(v_cache),
            KArg::Ptr(t.pos),
            KArg::Ptr(t.slots),
            KArg::Ptr(rope.inv_freq.ptr()),
            i32_arg(t.n),
            i32_arg(n_heads),
            i32_arg(n_kv_heads),
            i32_arg(head_dim),
            i32_arg(rope.n_pairs),
            KArg::F32(rope.linear_scale),
            KArg::I32(rope.neox as i32),
            KArg::F32(rope.magnitude),
            KArg::F32(rope.q_temperature.0),
            i32_arg(rope.q_temperature.1),
        ],
    )
}

/// Shapes shared by both attention kernels.
#[derive(Debug, Clone, Copy)]
pub struct AttnShape {
    pub n_heads: usize,
    pub n_kv_heads: usize,
    pub head_dim: usize,
    pub n_seqs: usize,
    pub max_blocks: usize,
    /// Element type of the paged cache.
    pub kv: KvType,
}

impl AttnShape {
    fn scale(&self) -> f32 {
        1.0 / (self.head_dim as f32).sqrt()
    }
}

/// Device pointers of a layer's cache and the step's tables.
#[derive(Debug, Clone, Copy)]
pub struct AttnInputs {
    pub q: DevPtr,
    pub k_cache: DevPtr,
    pub v_cache: DevPtr,
    pub block_tables: DevPtr,
    pub out: DevPtr,
}

/// Decode attention, one query per sequence (query row s for sequence s), split-K over
/// `n_splits` partitions with the reduction when there is more than one.
#[allow(clippy::too_many_arguments)]
pub fn attn_decode(
    gpu: &mut dyn Gpu,
    s: AttnShape,
    io: AttnInputs,
    seq_lens: DevPtr,
    n_splits: usize,
    part_o: Buf,
    part_ml: Buf,
) -> Result<(), GpuError> {
    gpu.launch(
        &names::attn_decode(s.kv),
        Launch::new(
            [to_u32(s.n_kv_heads), to_u32(s.n_seqs), to_u32(n_splits)],
            ATTN_DECODE_THREADS,
        ),
        &[
            KArg::Ptr(io.q),
            KArg::Ptr(io.k_cache),
            KArg::Ptr(io.v_cache),
            KArg::Ptr(io.block_tables),
            i32_arg(s.max_blocks),
            KArg::Ptr(seq_lens),
            KArg::Null,
            KArg::Ptr(io.out),
            KArg::Ptr(part_o.ptr()),
            KArg::Ptr(part_ml.ptr()),
            i32_arg(s.n_heads),
            i32_arg(s.n_kv_heads),
            i32_arg(s.head_dim),
            KArg::F32(s.scale()),
        ],
    )?;
    if n_splits > 1 {
        gpu.launch(
            names::ATTN_DECODE_REDUCE,
            Launch::new(
                [to_u32(s.n_heads), to_u32(s.n_seqs), 1],
                ATTN_DECODE_THREADS,
            ),
            &[
                KArg::Ptr(part_o.ptr()),
                KArg::Ptr(part_ml.ptr()),
                KArg::Ptr(seq_lens),
                KArg::Null,
                KArg::Ptr(io.out),
                i32_arg(s.n_heads),
                i32_arg(s.head_dim),
                i32_arg(n_splits),
            ],
        )?;
    }
    Ok(())
}

/// Causal attention of prefill chunks (any number of queries per sequence) over the
/// cached prefix and the chunk itself: on tensor cores where the cache is f16 and the
/// head size has a variant (`names::attn_prefill_tc`), else the f32 SIMT kernel.
#[allow(clippy::too_many_arguments)]
pub fn attn_prefill(
    gpu: &mut dyn Gpu,
    s: AttnShape,
    io: AttnInputs,
    q_start: DevPtr,
    q_len: DevPtr,
    start_pos: DevPtr,
    max_q_len: usize,
) -> Result<(), GpuError> {
    // The tensor-core kernels have the head size in their name, not as a parameter.
    let (kernel, queries, threads, head_dim_arg) = match names::attn_prefill_tc(s.kv, s.head_dim) {
        Some(k) => (k, ATTN_PREFILL_TC_QUERIES, ATTN_PREFILL_TC_THREADS, None),
        None => (
            names::attn_prefill(s.kv),
            ATTN_PREFILL_QUERIES,
            ATTN_PREFILL_THREADS,
            Some(i32_arg(s.head_dim)),
        ),
    };
    let mut args = vec![
        KArg::Ptr(io.q),
        KArg::Ptr(io.k_cache),
        KArg::Ptr(io.v_cache),
        KArg::Ptr(io.block_tables),
        i32_arg(s.max_blocks),
        KArg::Ptr(q_start),
        KArg::Ptr(q_len),
        KArg::Ptr(start_pos),
        KArg::Ptr(io.out),
        i32_arg(s.n_heads),
        i32_arg(s.n_kv_heads),
    ];
    args.extend(head_dim_arg);
    args.push(KArg::F32(s.scale()));
    let grid = [
        to_u32(max_q_len.div_ceil(queries)),
        to_u32(s.n_heads),
        to_u32(s.n_seqs),
    ];
    gpu.launch(&kernel, Launch::new(grid, threads), &args)
}

/// `gate = silu(gate) * up` over `count` elements (the output overwrites `gate`).
pub fn swiglu(gpu: &mut dyn Gpu, gate: DevPtr, up: DevPtr, count: usize) -> Result<(), GpuError> {
    gpu.launch(
        names::SWIGLU,
        Launch::linear(stride_blocks(count), EW_THREADS),
        &[
            KArg::Ptr(gate),
            KArg::Ptr(up),
            KArg::Ptr(gate),
            KArg::I64(count as i64),
        ],
    )
}

/// `silu(gate) * up` over `count` elements straight to their f16 copy in `a16`.
pub fn swiglu_f16(
    gpu: &mut dyn Gpu,
    gate: DevPtr,
    up: DevPtr,
    a16: Buf,
    count: usize,
) -> Result<(), GpuError> {
    gpu.launch(
        names::SWIGLU_F16,
        Launch::linear(stride_blocks(count), EW_THREADS),
        &[
            KArg::Ptr(gate),
            KArg::Ptr(up),
            KArg::Ptr(a16.ptr()),
            KArg::I64(count as i64),
        ],
    )
}

/// Adds each of the first `rows` logit rows' bias entries (`bias_rows[r]..bias_rows[r +
/// 1]` of `tokens` and `values`), in order.
pub fn logit_bias(
    gpu: &mut dyn Gpu,
    logits: DevPtr,
    rows: usize,
    n: usize,
    bias_rows: DevPtr,
    tokens: DevPtr,
    values: DevPtr,
) -> Result<(), GpuError> {
    gpu.launch(
        names::LOGIT_BIAS,
        Launch::linear(rows, 32),
        &[
            KArg::Ptr(logits),
            i32_arg(n),
            KArg::Ptr(bias_rows),
            KArg::Ptr(tokens),
            KArg::Ptr(values),
        ],
    )
}

/// Index of each row's largest logit (the CPU sampler's greedy rule).
pub fn argmax(
    gpu: &mut dyn Gpu,
    logits: DevPtr,
    rows: usize,
    n: usize,
    out: DevPtr,
) -> Result<(), GpuError> {
    gpu.launch(
        names::ARGMAX,
        Launch::linear(rows, 256),
        &[KArg::Ptr(logits), i32_arg(n), KArg::Ptr(out)],
    )
}
