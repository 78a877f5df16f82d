//! The inner loops of attention: scores of a query against a block of keys, then the
//! online softmax update over them (running maximum, denominator and weighted values).
//!
//! They are plain safe loops, compiled twice: as portable code (used on every CPU
//! without AVX-512, and the twin the tests compare against) and inside
//! `#[target_feature(enable = "avx512f")]` wrappers, where the same source becomes
//! 512-bit code. Rust never fuses or reorders float operations on its own and `exp` is
//! the same libm call in both, so both versions compute the same bits; and those are
//! the bits of the per-position loop they replace (same dot product, same update order),
//! so this changes the speed of the forward pass, not its results.

/// One instruction set's attention loops.
#[derive(Clone, Copy)]
pub struct AttnKernels {
    pub name: &'static str,
    /// `out[i] = dot(q, keys[i * stride..][..q.len()]) * scale` for `i < out.len()`.
    pub scores: fn(q: &[f32], keys: &[f32], stride: usize, scale: f32, out: &mut [f32]),
    /// The online softmax over a block's scores, in position order (see `online`).
    pub online:
        fn(scores: &[f32], values: &[f32], stride: usize, state: &mut Softmax, acc: &mut [f32]),
}

/// One query head's running softmax: the largest score so far and the denominator
/// relative to it.
#[derive(Debug, Clone, Copy)]
pub struct Softmax {
    pub max: f32,
    pub denom: f32,
}

impl Default for Softmax {
    fn default() -> Self {
        Softmax {
            max: f32::NEG_INFINITY,
            denom: 0.0,
        }
    }
}

const PORTABLE: AttnKernels = AttnKernels {
    name: "portable",
    scores,
    online,
};

/// The attention loops matching the matmul kernel table (`SPARKD_KERNELS` included).
pub fn attn_kernels() -> &'static AttnKernels {
    #[cfg(target_arch = "x86_64")]
    if super::dot::best().name == "avx512-vnni" {
        return &avx512::KERNELS;
    }
    &PORTABLE
}

/// `model::ops::dot`: 8 partial sums, then summed in order.
#[inline(always)]
fn dot8(a: &[f32], b: &[f32]) -> f32 {
    let mut acc = [0.0f32; 8];
    let (ca, cb) = (a.chunks_exact(8), b.chunks_exact(8));
    let (ra, rb) = (ca.remainder(), cb.remainder());
    for (x, y) in ca.zip(cb) {
        for l in 0..8 {
            acc[l] += x[l] * y[l];
        }
    }
    let mut s: f32 = acc.iter().sum();
    for (x, y) in ra.iter().zip(rb) {
        s += x * y;
    }
    s
}

#[inline(always)]
fn scores(q: &[f32], keys: &[f32], stride: usize, scale: f32, out: &mut [f32]) {
    let hd = q.len();
    for (i, o) in out.iter_mut().enumerate() {
        *o = dot8(q, &keys[i * stride..i * stride + hd]) * scale;
    }
}

/// For each position `i` in order: when its score is a new maximum, rescale what was
/// accumulated; then add `p = exp(score - max)` to the denominator and `p * value` to
/// `acc`.
#[inline(always)]
fn online(scores: &[f32], values: &[f32], stride: usize, st: &mut Softmax, acc: &mut [f32]) {
    let hd = acc.len();
    for (i, &score) in scores.iter().enumerate() {
        if score > st.max {
            let rescale = (st.max - score).exp();
            st.denom *= rescale;
            acc.iter_mut().for_each(|x| *x *= rescale);
            st.max = score;
        }
        let p = (score - st.max).exp();
        st.denom += p;
        let v = &values[i * stride..i * stride + hd];
        for (a, &x) in acc.iter_mut().zip(v) {
            *a += p * x;
        }
    }
}

// `avx512f` in `target_feature` needs Rust 1.89, as in `dot::avx512`.
#[cfg(target_arch = "x86_64")]
#[clippy::msrv = "1.89"]
mod avx512 {
    //! The same loops compiled for AVX-512 (`attn_kernels` hands them out only after
    //! the matmul table's feature detection found AVX-512).

    use super::{AttnKernels, Softmax};

    pub(super) const KERNELS: AttnKernels = AttnKernels {
        name: "avx512",
        scores,
        online,
    };

    /// # Safety
    /// AVX-512 F must be available (likewise below).
    #[target_feature(enable = "avx512f")]
    unsafe fn scores_impl(q: &[f32], keys: &[f32], stride: usize, scale: f32, out: &mut [f32]) {
        super::scores(q, keys, stride, scale, out)
    }

    #[target_feature(enable = "avx512f")]
    unsafe fn online_impl(
        s: &[f32],
        values: &[f32],
        stride: usize,
        st: &mut Softmax,
        acc: &mut [f32],
    ) {
        super::online(s, values, stride, st, acc)
    }

    fn scores(q: &[f32], keys: &[f32], stride: usize, scale: f32, out: &mut [f32]) {
        // SAFETY: only reachable through `KERNELS`, which `attn_kernels` returns only
        // when the AVX-512 matmul table (whose detection requires AVX-512 F) is active.
        unsafe { scores_impl(q, keys, stride, scale, out) }
    }

    fn online(s: &[f32], values: &[f32], stride: usize, st: &mut Softmax, acc: &mut [f32]) {
        // SAFETY: as in `scores`.
        unsafe { online_impl(s, values, stride, st, acc) }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::backend::cpu::testutil::Rng;

    /// Each table's loops against the per-position loop of the forward pass they
    /// replace (same dot product, same update order), bit for bit.
    #[test]
    fn kernels_match_the_portable_loops() {
        let mut rng = Rng::new(30);
        #[cfg_attr(not(target_arch = "x86_64"), allow(unused_mut))]
        let mut tables = vec![PORTABLE];
        #[cfg(target_arch = "x86_64")]
        if crate::backend::cpu::dot::available()
            .iter()
            .any(|k| k.name == "avx512-vnni")
        {
            tables.push(avx512::KERNELS);
        }
        for hd in [1, 15, 16, 64, 80, 128] {
            for n in [1, 7, 16] {
                let stride = hd + 3;
                let q: Vec<f32> = (0..hd).map(|_| rng.f32()).collect();
                let kv: Vec<f32> = (0..n * stride).map(|_| rng.f32() * 3.0).collect();
                let mut want = vec![0.0; n];
                scores(&q, &kv, stride, 0.125, &mut want);
                for (i, w) in want.iter().enumerate() {
                    let k = &kv[i * stride..i * stride + hd];
                    let plain = crate::model::ops::dot(&q, k) * 0.125;
                    assert_eq!(w.to_bits(), plain.to_bits());
                }
                // The per-position loop this replaces, as the forward pass had it.
                let mut st = Softmax::default();
                let mut acc = vec![0.0; hd];
                for (i, &score) in want.iter().enumerate() {
                    if score > st.max {
                        let rescale = (st.max - score).exp();
                        st.denom *= rescale;
                        acc.iter_mut().for_each(|x| *x *= rescale);
                        st.max = score;
                    }
                    let p = (score - st.max).exp();
                    st.denom += p;
                    crate::model::ops::axpy(p, &kv[i * stride..i * stride + hd], &mut acc);
                }
                for k in &tables {
                    let mut got = vec![0.0; n];
                    (k.scores)(&q, &kv, stride, 0.125, &mut got);
                    assert_eq!(bits(&got), bits(&want), "{} scores", k.name);
                    // Two calls, as over two KV blocks.
                    let (mut gst, mut gacc) = (Softmax::default(), vec![0.0; hd]);
                    let half = n / 2;
                    (k.online)(&got[..half], &kv, stride, &mut gst, &mut gacc);
                    (k.online)(
                        &got[half..],
                        &kv[half * stride..],
                        stride,
                        &mut gst,
                        &mut gacc,
                    );
                    assert_eq!(gst.max.to_bits(), st.max.to_bits(), "{} max", k.name);
                    assert_eq!(gst.denom.to_bits(), st.denom.to_bits(), "{} denom", k.name);
                    assert_eq!(bits(&gacc), bits(&acc), "{} values", k.name);
                }
            }
        }
    }

    fn bits(v: &[f32]) -> Vec<u32> {
        v.iter().map(|f| f.to_bits()).collect()
    }
}
