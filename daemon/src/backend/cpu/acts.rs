//! Activation quantization for the matmul: reusable buffers and the parallel driver.

use std::sync::Mutex;

use super::dot::{Kernels, Q8Acts, Q8KActs};
use super::pool::ThreadPool;
use crate::quant::{QK, QK_K};

/// Below this many elements one thread quantizes the activations: a parallel dispatch
/// costs more than it saves.
const PARALLEL_MIN_ELEMS: usize = 32 * 1024;

/// Buffers for the quantized activations of one matmul call, reused across calls: in
/// steady state a matmul allocates nothing.
#[derive(Debug, Default)]
pub struct MatmulScratch {
    q8_qs: Vec<i8>,
    q8_d: Vec<f32>,
    q8_s: Vec<f32>,
    q8k_qs: Vec<i8>,
    q8k_d: Vec<f32>,
    q8k_bsums: Vec<i16>,
}

/// Grows `v` to at least `len` and returns its first `len` elements.
fn sized<T: Copy + Default>(v: &mut Vec<T>, len: usize) -> &mut [T] {
    if v.len() < len {
        v.resize(len, T::default());
    }
    &mut v[..len]
}

impl MatmulScratch {
    /// Quantizes `x` (rows of `cols`, a multiple of 32) to 32-blocks.
    pub(crate) fn quantize_q8(
        &mut self,
        pool: &ThreadPool,
        k: &Kernels,
        x: &[f32],
        cols: usize,
    ) -> Q8Acts<'_> {
        let nb = x.len() / QK;
        let qs = sized(&mut self.q8_qs, x.len());
        let d = sized(&mut self.q8_d, nb);
        let s = sized(&mut self.q8_s, nb);
        if x.len() < PARALLEL_MIN_ELEMS || pool.n_threads() == 1 {
            (k.quantize_q8)(x, qs, d, s);
        } else {
            let per = nb.div_ceil(pool.n_threads() * 2);
            let parts = x
                .chunks(per * QK)
                .zip(qs.chunks_mut(per * QK))
                .zip(d.chunks_mut(per).zip(s.chunks_mut(per)));
            let parts = Mutex::new(parts);
            pool.run(&|_, _| loop {
                let next = parts.lock().ok().and_then(|mut it| it.next());
                let Some(((x, qs), (d, s))) = next else { break };
                (k.quantize_q8)(x, qs, d, s);
            });
        }
        Q8Acts {
            qs: &self.q8_qs[..x.len()],
            d: &self.q8_d[..nb],
            s: &self.q8_s[..nb],
            cols,
        }
    }

    /// Quantizes `x` (rows of `cols`, a multiple of 256) to 256-blocks.
    pub(crate) fn quantize_q8k(
        &mut self,
        pool: &ThreadPool,
        k: &Kernels,
        x: &[f32],
        cols: usize,
    ) -> Q8KActs<'_> {
        let nb = x.len() / QK_K;
        let qs = sized(&mut self.q8k_qs, x.len());
        let d = sized(&mut self.q8k_d, nb);
        let bsums = sized(&mut self.q8k_bsums, nb * 16);
        if x.len() < PARALLEL_MIN_ELEMS || pool.n_threads() == 1 {
            (k.quantize_q8k)(x, qs, d, bsums);
        } else {
            let per = nb.div_ceil(pool.n_threads() * 2);
            let parts = x
                .chunks(per * QK_K)
                .zip(qs.chunks_mut(per * QK_K))
                .zip(d.chunks_mut(per).zip(bsums.chunks_mut(per * 16)));
            let parts = Mutex::new(parts);
            pool.run(&|_, _| loop {
                let next = parts.lock().ok().and_then(|mut it| it.next());
                let Some(((x, qs), (d, bsums))) = next else {
                    break;
                };
                (k.quantize_q8k)(x, qs, d, bsums);
            });
        }
        Q8KActs {
            qs: &self.q8k_qs[..x.len()],
            d: &self.q8k_d[..nb],
            bsums: &self.q8k_bsums[..nb * 16],
            cols,
        }
    }
}
