//! `y = x * W^T` over a thread pool: weight rows are split into chunks that threads take
//! in turn, and each chunk is run against every activation row while it is in cache.

use std::marker::PhantomData;
use std::sync::atomic::{AtomicUsize, Ordering};

use super::acts::{MatmulMode, MatmulScratch};
use super::dot::{
    self, F32Acts, Out, PackedDot, PackedOut, Q8Acts, WTile, MR, NR, PACK_ACTS, PACK_ROWS,
};
use super::packed::PackedMatrix;
use super::pool::ThreadPool;
use super::KernelError;
use crate::quant::{self, GgmlType};

/// Weight rows per chunk are a multiple of this: 16 `f32` outputs fill a cache line, so
/// threads writing neighbouring chunks of one output row rarely share a line.
const CHUNK_ALIGN: usize = 16;
/// Bytes of weights a chunk may hold when it is re-read for several activation tiles:
/// about an L1 data cache, leaving room for the activation tile.
const CHUNK_CACHE_BYTES: usize = 32 * 1024;
/// Chunks per thread to aim for, so a thread slowed by something else is not the
/// critical path.
const CHUNKS_PER_THREAD: usize = 4;

/// A row-major weight matrix in its GGUF block layout: row `r` is
/// `data[r * row_bytes .. (r + 1) * row_bytes]`.
#[derive(Debug, Clone, Copy)]
pub struct WeightMatrix<'a> {
    pub ty: GgmlType,
    pub rows: usize,
    pub cols: usize,
    pub data: &'a [u8],
}

impl<'a> WeightMatrix<'a> {
    /// Checks that `ty` is supported and that `data` holds exactly `rows` rows of `cols`.
    pub fn new(
        ty: GgmlType,
        rows: usize,
        cols: usize,
        data: &'a [u8],
    ) -> Result<Self, KernelError> {
        let w = Self {
            ty,
            rows,
            cols,
            data,
        };
        w.check()?;
        Ok(w)
    }

    fn check(&self) -> Result<(), KernelError> {
        let ty = self.ty;
        if !ty.is_weight_type() {
            return Err(KernelError::UnsupportedType(ty));
        }
        let row_bytes = ty
            .bytes_for(self.cols as u64)
            .ok_or(KernelError::RaggedRow {
                ty,
                cols: self.cols,
            })?;
        let mismatch = KernelError::SizeMismatch {
            ty,
            rows: self.rows,
            cols: self.cols,
            expected: row_bytes.saturating_mul(self.rows as u64),
            got: self.data.len(),
        };
        match row_bytes.checked_mul(self.rows as u64) {
            Some(total) if total == self.data.len() as u64 => Ok(()),
            _ => Err(mismatch),
        }
    }

    /// Bytes per row.
    pub fn row_bytes(&self) -> usize {
        self.cols / self.ty.block_elems() * self.ty.block_bytes()
    }
}

/// A weight matrix in either layout: the type keeps packed weights away from the
/// GGUF-layout kernels and the other way round.
#[derive(Debug, Clone, Copy)]
pub enum Weight<'a> {
    Gguf(WeightMatrix<'a>),
    Packed(&'a PackedMatrix),
}

impl<'a> From<WeightMatrix<'a>> for Weight<'a> {
    fn from(w: WeightMatrix<'a>) -> Self {
        Weight::Gguf(w)
    }
}

impl<'a> From<&WeightMatrix<'a>> for Weight<'a> {
    fn from(w: &WeightMatrix<'a>) -> Self {
        Weight::Gguf(*w)
    }
}

impl<'a> From<&'a PackedMatrix> for Weight<'a> {
    fn from(w: &'a PackedMatrix) -> Self {
        Weight::Packed(w)
    }
}

/// Decodes row `row` of `w` into `out` (an embedding lookup).
///
/// # Panics
/// If `row` is out of range or `out` is not one row long (the caller validates token
/// ids).
pub fn dequantize_row<'w>(w: impl Into<Weight<'w>>, row: usize, out: &mut [f32]) {
    let w = match w.into() {
        Weight::Packed(p) => return p.dequantize_row(row, out),
        Weight::Gguf(w) => w,
    };
    assert!(row < w.rows, "row {row} out of {} rows", w.rows);
    assert_eq!(out.len(), w.cols, "output length");
    let rb = w.row_bytes();
    let bytes = &w.data[row * rb..(row + 1) * rb];
    // Sizes were checked above and by `WeightMatrix::new`.
    if let Err(e) = quant::dequantize(w.ty, bytes, out) {
        panic!("dequantize_row: {e}");
    }
}

/// `y[i][r] = dot(W row r, x row i)`: `x` is `n x w.cols`, `y` is `n x w.rows`, both
/// row-major.
///
/// # Panics
/// If `w` is inconsistent (see `WeightMatrix::new`) or `x` / `y` have the wrong length.
pub fn matmul<'w>(
    pool: &ThreadPool,
    w: impl Into<Weight<'w>>,
    x: &[f32],
    n: usize,
    y: &mut [f32],
    scratch: &mut MatmulScratch,
) {
    let w = w.into();
    if scratch.mode == MatmulMode::Reference {
        return matmul_reference(pool, w, x, n, y);
    }
    let w = match w {
        Weight::Packed(p) => return matmul_packed(pool, p, x, n, y, scratch),
        Weight::Gguf(w) => w,
    };
    let w = &w;
    if let Err(e) = w.check() {
        panic!("matmul: {e}");
    }
    assert_eq!(x.len(), n * w.cols, "matmul: x must be n x cols");
    assert_eq!(y.len(), n * w.rows, "matmul: y must be n x rows");
    if n == 0 || w.rows == 0 {
        return;
    }
    if w.cols == 0 {
        y.fill(0.0);
        return;
    }
    let k = dot::best();
    use GgmlType::*;
    match w.ty {
        Q4_0 | Q4_1 | Q5_0 | Q5_1 | Q8_0 | IQ4_NL => {
            let tile = match w.ty {
                IQ4_NL => k.iq4_nl,
                Q4_0 => k.q4_0,
                Q4_1 => k.q4_1,
                Q5_0 => k.q5_0,
                Q5_1 => k.q5_1,
                _ => k.q8_0,
            };
            let acts = scratch.q8.quantize(pool, k, x, w.cols);
            run_tiles(pool, w, n, y, |t, j0, nr, out| tile(t, &acts, j0, nr, out));
        }
        Q2_K | Q3_K | Q4_K | Q5_K | Q6_K | IQ4_XS => {
            let tile = match w.ty {
                IQ4_XS => k.iq4_xs,
                Q2_K => k.q2_k,
                Q3_K => k.q3_k,
                Q4_K => k.q4_k,
                Q5_K => k.q5_k,
                _ => k.q6_k,
            };
            let acts = scratch.q8k.quantize(pool, k, x, w.cols);
            run_tiles(pool, w, n, y, |t, j0, nr, out| tile(t, &acts, j0, nr, out));
        }
        F32 | F16 | BF16 => {
            let tile = match w.ty {
                F32 => k.f32,
                F16 => k.f16,
                _ => k.bf16,
            };
            let acts = F32Acts { x, cols: w.cols };
            run_tiles(pool, w, n, y, |t, j0, nr, out| tile(t, &acts, j0, nr, out));
        }
        Q8_1 | Q8_K => unreachable!("rejected by WeightMatrix::check"),
    }
}

/// `matmul` in [`MatmulMode::Reference`]: threads take chunks of weight rows, decode
/// each row to `f32` once and dot it with every activation row in `f64`.
fn matmul_reference(pool: &ThreadPool, w: Weight, x: &[f32], n: usize, y: &mut [f32]) {
    let (rows, cols) = match w {
        Weight::Gguf(g) => {
            if let Err(e) = g.check() {
                panic!("matmul: {e}");
            }
            (g.rows, g.cols)
        }
        Weight::Packed(p) => (p.rows(), p.cols()),
    };
    assert_eq!(x.len(), n * cols, "matmul: x must be n x cols");
    assert_eq!(y.len(), n * rows, "matmul: y must be n x rows");
    if n == 0 || rows == 0 {
        return;
    }
    if cols == 0 {
        y.fill(0.0);
        return;
    }
    let chunk = rows.div_ceil(pool.n_threads() * CHUNKS_PER_THREAD);
    let n_chunks = rows.div_ceil(chunk);
    let next = AtomicUsize::new(0);
    let out = SharedOut::new(y);
    pool.run(&|_, _| {
        let mut decoded = vec![0.0f32; cols];
        loop {
            let c = next.fetch_add(1, Ordering::Relaxed);
            if c >= n_chunks {
                break;
            }
            for r in c * chunk..((c + 1) * chunk).min(rows) {
                dequantize_row(w, r, &mut decoded);
                for (j, xj) in x.chunks_exact(cols).enumerate() {
                    // SAFETY: row `r` is in chunk `c`, which only this thread takes, so
                    // element (j, r) is written only here.
                    unsafe { out.write(j * rows + r, dot_f64(&decoded, xj)) };
                }
            }
        }
    });
}

/// `sum(a[i] * b[i])` summed in `f64` (each product of two `f32`s is exact there), so
/// the result carries little more than its own final rounding.
fn dot_f64(a: &[f32], b: &[f32]) -> f32 {
    // Four partial sums, so that consecutive additions do not wait on each other.
    let mut acc = [0.0f64; 4];
    let (qa, qb) = (a.chunks_exact(4), b.chunks_exact(4));
    let tail: f64 = qa
        .remainder()
        .iter()
        .zip(qb.remainder())
        .map(|(&p, &q)| p as f64 * q as f64)
        .sum();
    for (pa, pb) in qa.zip(qb) {
        for k in 0..4 {
            acc[k] += pa[k] as f64 * pb[k] as f64;
        }
    }
    ((acc[0] + acc[1]) + (acc[2] + acc[3]) + tail) as f32
}

/// Weight rows per chunk.
fn chunk_rows(rows: usize, row_bytes: usize, n: usize, n_threads: usize) -> usize {
    let balanced = rows.div_ceil(n_threads * CHUNKS_PER_THREAD);
    let mut chunk = balanced.next_multiple_of(CHUNK_ALIGN);
    if n > NR {
        // The chunk is re-read once per activation tile: keep it in L1.
        let fits = (CHUNK_CACHE_BYTES / row_bytes.max(1)) / CHUNK_ALIGN * CHUNK_ALIGN;
        chunk = chunk.min(fits.max(CHUNK_ALIGN));
    }
    chunk
}

/// Runs `tile` over every (weight tile, activation tile) pair, spread over the pool.
fn run_tiles<F>(pool: &ThreadPool, w: &WeightMatrix, n: usize, y: &mut [f32], tile: F)
where
    F: Fn(&WTile, usize, usize, &mut Out) + Sync,
{
    let (rows, rb) = (w.rows, w.row_bytes());
    let chunk = chunk_rows(rows, rb, n, pool.n_threads());
    let n_chunks = rows.div_ceil(chunk);
    let next = AtomicUsize::new(0);
    let out = SharedOut::new(y);
    pool.run(&|_, _| {
        let mut buf: Out = [[0.0; NR]; MR];
        loop {
            let c = next.fetch_add(1, Ordering::Relaxed);
            if c >= n_chunks {
                break;
            }
            let (r0, r1) = (c * chunk, ((c + 1) * chunk).min(rows));
            for j0 in (0..n).step_by(NR) {
                let nr = NR.min(n - j0);
                for t0 in (r0..r1).step_by(MR) {
                    let mr = MR.min(r1 - t0);
                    let wt = WTile {
                        data: &w.data[t0 * rb..(t0 + mr) * rb],
                        row_bytes: rb,
                        rows: mr,
                        cols: w.cols,
                    };
                    tile(&wt, j0, nr, &mut buf);
                    for (j, yrow) in (j0..j0 + nr).enumerate() {
                        for (r, buf_r) in buf.iter().enumerate().take(mr) {
                            // SAFETY: chunk `c` (rows r0..r1) is taken by exactly one
                            // thread, so element (yrow, t0 + r) is written only here,
                            // and nothing reads `y` until the run is over.
                            unsafe { out.write(yrow * rows + t0 + r, buf_r[j]) };
                        }
                    }
                }
            }
        }
    });
}

/// `matmul` for packed weights.
fn matmul_packed(
    pool: &ThreadPool,
    w: &PackedMatrix,
    x: &[f32],
    n: usize,
    y: &mut [f32],
    scratch: &mut MatmulScratch,
) {
    assert_eq!(x.len(), n * w.cols(), "matmul: x must be n x cols");
    assert_eq!(y.len(), n * w.rows(), "matmul: y must be n x rows");
    if n == 0 || w.rows() == 0 {
        return;
    }
    if w.cols() == 0 {
        y.fill(0.0);
        return;
    }
    let k = dot::best();
    let dot = match w.ty() {
        GgmlType::Q4_0 => k.packed_q4_0,
        GgmlType::Q4_1 => k.packed_q4_1,
        _ => k.packed_q8_0,
    };
    let acts = scratch.q8.quantize(pool, k, x, w.cols());
    run_packed(pool, w, n, y, dot, &acts);
}

/// Runs `dot` over every (group, activation rows) pair: threads take chunks of groups
/// in turn and run every activation row against a group while it is in cache.
fn run_packed(
    pool: &ThreadPool,
    w: &PackedMatrix,
    n: usize,
    y: &mut [f32],
    dot: PackedDot,
    acts: &Q8Acts,
) {
    let (rows, groups) = (w.rows(), w.n_groups());
    let chunk = groups.div_ceil(pool.n_threads() * CHUNKS_PER_THREAD);
    let n_chunks = groups.div_ceil(chunk);
    let next = AtomicUsize::new(0);
    let out = SharedOut::new(y);
    pool.run(&|_, _| {
        let mut res: PackedOut = [[0.0; PACK_ROWS]; PACK_ACTS];
        loop {
            let c = next.fetch_add(1, Ordering::Relaxed);
            if c >= n_chunks {
                break;
            }
            for g in c * chunk..((c + 1) * chunk).min(groups) {
                let group = w.group(g);
                let r0 = g * PACK_ROWS;
                let gr = PACK_ROWS.min(rows - r0);
                for j0 in (0..n).step_by(PACK_ACTS) {
                    let nr = PACK_ACTS.min(n - j0);
                    dot(&group, acts, j0, nr, &mut res);
                    for (j, res_j) in res.iter().enumerate().take(nr) {
                        // SAFETY: rows r0..r0 + gr belong to group g of chunk `c`, which
                        // only this thread processes.
                        unsafe { out.write_slice((j0 + j) * rows + r0, &res_j[..gr]) };
                    }
                }
            }
        }
    });
}

/// The output matrix shared by the threads of one `run_tiles`, each writing its own
/// disjoint set of elements (whole column ranges, so they cannot be split into slices).
struct SharedOut<'a> {
    ptr: *mut f32,
    len: usize,
    _borrow: PhantomData<&'a mut [f32]>,
}

// SAFETY: the pointer comes from a `&mut [f32]` held for `'a`; threads only write through
// it, each to indices no other thread touches (the contract of `write`).
unsafe impl Sync for SharedOut<'_> {}

impl<'a> SharedOut<'a> {
    fn new(y: &'a mut [f32]) -> Self {
        Self {
            ptr: y.as_mut_ptr(),
            len: y.len(),
            _borrow: PhantomData,
        }
    }

    /// # Safety
    /// No other thread may access element `i` while this `SharedOut` exists.
    unsafe fn write(&self, i: usize, v: f32) {
        assert!(i < self.len, "output index {i} out of {}", self.len);
        // SAFETY: in bounds (checked above) and unaliased (the caller's contract).
        unsafe { self.ptr.add(i).write(v) }
    }

    /// Writes `v` at `i..i + v.len()`.
    ///
    /// # Safety
    /// No other thread may access those elements while this `SharedOut` exists.
    unsafe fn write_slice(&self, i: usize, v: &[f32]) {
        assert!(
            i.checked_add(v.len()).is_some_and(|end| end <= self.len),
            "output range {i}+{} out of {}",
            v.len(),
            self.len
        );
        // SAFETY: in bounds (checked above) and unaliased (the caller's contract); `v`
        // is a separate local buffer. A whole group's row gets a fixed-size copy, which
        // compiles to two vector moves instead of a `memcpy` call.
        unsafe {
            if v.len() == PACK_ROWS {
                std::ptr::copy_nonoverlapping(v.as_ptr(), self.ptr.add(i), PACK_ROWS)
            } else {
                std::ptr::copy_nonoverlapping(v.as_ptr(), self.ptr.add(i), v.len())
            }
        }
    }
}

#[cfg(test)]
mod tests;
