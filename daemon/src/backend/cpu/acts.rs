//! Activation quantization for the matmul: reusable buffers and the parallel driver.

use std::sync::Mutex;

use super::dot::{Kernels, Q8Acts, Q8KActs};
use super::pool::ThreadPool;
use crate::quant::{QK, QK_K};

/// Below this many elements one thread quantizes the activations: a parallel dispatch
/// costs more than it saves.
const PARALLEL_MIN_ELEMS: usize = 32 * 1024;

/// How `matmul` multiplies quantized weights.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum MatmulMode {
    /// The serving path: activations quantized once per call to the 8-bit format that
    /// pairs with the weights, integer dot products (as ggml does). Moves logits by up
    /// to about 1e-2 of their range on random-weight models.
    #[default]
    Serving,
    /// The reference other backends are checked against: each weight row decoded to
    /// `f32` and multiplied with the `f32` activations, sums in `f64`. Exact up to the
    /// rounding of the result; several times slower than serving.
    Reference,
}

/// Buffers for one matmul call (the quantized activations), reused across calls: in
/// steady state a matmul allocates nothing. Also says which [`MatmulMode`] the calls
/// that use it run in.
#[derive(Default)]
pub struct MatmulScratch {
    pub(crate) mode: MatmulMode,
    pub(crate) q8: Q8Buffers,
    pub(crate) q8k: Q8KBuffers,
}

impl std::fmt::Debug for MatmulScratch {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("MatmulScratch")
            .field("mode", &self.mode)
            .field("q8_elems", &self.q8.qs.capacity())
            .field("q8k_elems", &self.q8k.qs.capacity())
            .finish()
    }
}

impl MatmulScratch {
    pub fn new(mode: MatmulMode) -> Self {
        Self {
            mode,
            ..Self::default()
        }
    }

    /// Allocated capacity of every buffer (the tests check that reuse does not grow it).
    #[cfg(test)]
    pub(crate) fn capacities(&self) -> Vec<usize> {
        vec![
            self.q8.qs.capacity(),
            self.q8.d.capacity(),
            self.q8.s.capacity(),
            self.q8k.qs.capacity(),
            self.q8k.d.capacity(),
            self.q8k.bsums.capacity(),
        ]
    }
}

/// Activations quantized to 32-blocks.
#[derive(Debug, Default)]
pub(crate) struct Q8Buffers {
    qs: Vec<i8>,
    d: Vec<f32>,
    s: Vec<f32>,
}

/// Activations quantized to 256-blocks.
#[derive(Debug, Default)]
pub(crate) struct Q8KBuffers {
    qs: Vec<i8>,
    d: Vec<f32>,
    bsums: Vec<i16>,
}

/// Grows `v` to at least `len` and returns its first `len` elements.
fn sized<T: Copy + Default>(v: &mut Vec<T>, len: usize) -> &mut [T] {
    if v.len() < len {
        v.resize(len, T::default());
    }
    &mut v[..len]
}

impl Q8Buffers {
    /// Quantizes `x` (rows of `cols`, a multiple of 32) to 32-blocks.
    pub(crate) fn quantize(
        &mut self,
        pool: &ThreadPool,
        k: &Kernels,
        x: &[f32],
        cols: usize,
    ) -> Q8Acts<'_> {
        let nb = x.len() / QK;
        let qs = sized(&mut self.qs, x.len());
        let d = sized(&mut self.d, nb);
        let s = sized(&mut self.s, nb);
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
            qs: &self.qs[..x.len()],
            d: &self.d[..nb],
            s: &self.s[..nb],
            cols,
        }
    }
}

impl Q8KBuffers {
    /// Quantizes `x` (rows of `cols`, a multiple of 256) to 256-blocks.
    pub(crate) fn quantize(
        &mut self,
        pool: &ThreadPool,
        k: &Kernels,
        x: &[f32],
        cols: usize,
    ) -> Q8KActs<'_> {
        let nb = x.len() / QK_K;
        let qs = sized(&mut self.qs, x.len());
        let d = sized(&mut self.d, nb);
        let bsums = sized(&mut self.bsums, nb * 16);
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
            qs: &self.qs[..x.len()],
            d: &self.d[..nb],
            bsums: &self.bsums[..nb * 16],
            cols,
        }
    }
}
