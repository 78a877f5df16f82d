//! The inner loops of attention: scores of a query against a block of keys, then the
//! online softmax update over them (running maximum, denominator and weighted values).
//!
//! They are plain safe loops, compiled twice: as portable code (used on every CPU
//! without AVX-512, and the twin the tests compare against) and inside
//! `#[target_feature(enable = "avx512f")]` wrappers, where the same source becomes
//! 512-bit code. Rust never fuses or reorders float operations on its own and the
//! exponential (`exp_neg`) is plain arithmetic, so both versions compute the same bits.
//! The AVX-512 scores are written with intrinsics (eight keys at a time), in the
//! portable loop's order of operations, and tested bit for bit against it.

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

/// Folds a block of scores into the running softmax: when the block holds a new
/// maximum, what was accumulated is rescaled once; then, in position order,
/// `p = exp(score - max)` is added to the denominator and `p * value` to `acc`.
///
/// The exponentials are `exp_neg` over the whole block (a loop that vectorizes) rather
/// than a libm call per position.
#[inline(always)]
fn online(scores: &[f32], values: &[f32], stride: usize, st: &mut Softmax, acc: &mut [f32]) {
    let hd = acc.len();
    let block_max = scores.iter().fold(f32::NEG_INFINITY, |m, &s| m.max(s));
    if block_max > st.max {
        // exp(-inf) is 0: the first block clears the (empty) accumulator.
        let rescale = exp_neg(st.max - block_max);
        st.denom *= rescale;
        acc.iter_mut().for_each(|x| *x *= rescale);
        st.max = block_max;
    }
    const CHUNK: usize = 16;
    let mut p = [0.0f32; CHUNK];
    for (c, chunk) in scores.chunks(CHUNK).enumerate() {
        let p = &mut p[..chunk.len()];
        for (p, &score) in p.iter_mut().zip(chunk) {
            *p = exp_neg(score - st.max);
        }
        for &p in p.iter() {
            st.denom += p;
        }
        let values = &values[c * CHUNK * stride..];
        // A slice of `acc` at a time, held in registers over the chunk's positions
        // (a whole-row update per position loads and stores `acc` each time). Each
        // element still adds the positions in order.
        let mut d0 = 0;
        while d0 < hd {
            let width = (hd - d0).min(LANES);
            if let Ok(slice) = <&mut [f32; LANES]>::try_from(&mut acc[d0..d0 + width]) {
                // Whole vectors in and out: filling a register from narrower stores
                // would stall on store forwarding.
                let mut a = *slice;
                for (i, &p) in p.iter().enumerate() {
                    let v = &values[i * stride + d0..i * stride + d0 + LANES];
                    for l in 0..LANES {
                        a[l] += p * v[l];
                    }
                }
                *slice = a;
            } else {
                let slice = &mut acc[d0..d0 + width];
                for (i, &p) in p.iter().enumerate() {
                    let v = &values[i * stride + d0..i * stride + d0 + width];
                    for (a, &x) in slice.iter_mut().zip(v) {
                        *a += p * x;
                    }
                }
            }
            d0 += width;
        }
    }
}

/// Elements of `acc` updated together: four 512-bit registers (four independent
/// chains of adds), or sixteen 128-bit ones.
const LANES: usize = 64;

/// `exp(x)` for `x <= 0` (what a softmax takes), within 2 ulp of the exact value; 0
/// below -87.3 (where `exp` leaves the normal range), NaN for NaN. Plain arithmetic and
/// bit casts only, so a loop over it vectorizes and every build computes the same bits
/// (Rust neither fuses nor reorders float operations).
#[inline(always)]
fn exp_neg(x: f32) -> f32 {
    // exp(x) = 2^n * exp(r), n = round(x / ln 2), |r| <= ln 2 / 2 (Cephes' expf).
    const LOG2E: f32 = std::f32::consts::LOG2_E;
    // 1.5 * 2^23: adding it rounds to an integer (ties to even) in the low mantissa bits.
    const ROUND: f32 = 12_582_912.0;
    const LN2_HI: f32 = 0.693_359_4;
    const LN2_LO: f32 = -2.121_944_4e-4;
    const LOWEST: f32 = -87.33654;
    let t = x * LOG2E + ROUND;
    let n = t - ROUND;
    let r = x - n * LN2_HI - n * LN2_LO;
    let poly = ((((1.987_569_1e-4 * r + 1.398_199_9e-3) * r + 8.333_452e-3) * r + 4.166_579_6e-2)
        * r
        + 1.666_666_5e-1)
        * r
        + 0.5;
    let e_r = poly * r * r + r + 1.0;
    // 2^n from its exponent bits: n is in [-126, 0] here.
    let n_bits = (t.to_bits() as i32).wrapping_sub(ROUND.to_bits() as i32);
    let two_n = f32::from_bits((n_bits.wrapping_add(127) as u32) << 23);
    if x < LOWEST {
        0.0
    } else {
        e_r * two_n
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

    /// Eight keys at a time: each key's eight lane sums as in `dot8` (eight independent
    /// chains instead of one), then an 8 x 8 transpose so that the in-order sum of
    /// each key's lanes is seven vector adds for all eight keys. The same operations
    /// in the same order per key as the portable loop, so the same bits; the rest of
    /// the keys (and head sizes that are not a multiple of 8) take the portable loop.
    ///
    /// # Safety
    /// AVX-512 F must be available (likewise below).
    #[target_feature(enable = "avx512f")]
    unsafe fn scores_impl(q: &[f32], keys: &[f32], stride: usize, scale: f32, out: &mut [f32]) {
        use std::arch::x86_64::*;
        let hd = q.len();
        let n = out.len();
        let mut done = 0;
        if hd.is_multiple_of(8) && n >= 8 {
            assert!(stride >= hd && keys.len() >= (n - 1) * stride + hd);
            while done + 8 <= n {
                let mut acc = [_mm256_setzero_ps(); 8];
                for c in (0..hd).step_by(8) {
                    // SAFETY: q has hd elements; key `done + k` has hd elements from
                    // (done + k) * stride, within `keys` (asserted above).
                    unsafe {
                        let x = _mm256_loadu_ps(q.as_ptr().add(c));
                        for (k, acc) in acc.iter_mut().enumerate() {
                            let key = keys.as_ptr().add((done + k) * stride + c);
                            *acc = _mm256_add_ps(*acc, _mm256_mul_ps(x, _mm256_loadu_ps(key)));
                        }
                    }
                }
                let lanes = transpose8(acc);
                // `Iterator::sum` over f32 starts from -0.0.
                let mut sum = _mm256_set1_ps(-0.0);
                for lane in lanes {
                    sum = _mm256_add_ps(sum, lane);
                }
                let scaled = _mm256_mul_ps(sum, _mm256_set1_ps(scale));
                // SAFETY: out[done..done + 8] exists (done + 8 <= n).
                unsafe { _mm256_storeu_ps(out.as_mut_ptr().add(done), scaled) };
                done += 8;
            }
        }
        if done < n {
            super::scores(q, &keys[done * stride..], stride, scale, &mut out[done..]);
        }
    }

    /// Row `l` of the result is lane `l` of every input vector.
    #[target_feature(enable = "avx512f")]
    fn transpose8(r: [std::arch::x86_64::__m256; 8]) -> [std::arch::x86_64::__m256; 8] {
        use std::arch::x86_64::*;
        let t0 = _mm256_unpacklo_ps(r[0], r[1]);
        let t1 = _mm256_unpackhi_ps(r[0], r[1]);
        let t2 = _mm256_unpacklo_ps(r[2], r[3]);
        let t3 = _mm256_unpackhi_ps(r[2], r[3]);
        let t4 = _mm256_unpacklo_ps(r[4], r[5]);
        let t5 = _mm256_unpackhi_ps(r[4], r[5]);
        let t6 = _mm256_unpacklo_ps(r[6], r[7]);
        let t7 = _mm256_unpackhi_ps(r[6], r[7]);
        let u0 = _mm256_shuffle_ps::<0x44>(t0, t2);
        let u1 = _mm256_shuffle_ps::<0xEE>(t0, t2);
        let u2 = _mm256_shuffle_ps::<0x44>(t1, t3);
        let u3 = _mm256_shuffle_ps::<0xEE>(t1, t3);
        let u4 = _mm256_shuffle_ps::<0x44>(t4, t6);
        let u5 = _mm256_shuffle_ps::<0xEE>(t4, t6);
        let u6 = _mm256_shuffle_ps::<0x44>(t5, t7);
        let u7 = _mm256_shuffle_ps::<0xEE>(t5, t7);
        [
            _mm256_permute2f128_ps::<0x20>(u0, u4),
            _mm256_permute2f128_ps::<0x20>(u1, u5),
            _mm256_permute2f128_ps::<0x20>(u2, u6),
            _mm256_permute2f128_ps::<0x20>(u3, u7),
            _mm256_permute2f128_ps::<0x31>(u0, u4),
            _mm256_permute2f128_ps::<0x31>(u1, u5),
            _mm256_permute2f128_ps::<0x31>(u2, u6),
            _mm256_permute2f128_ps::<0x31>(u3, u7),
        ]
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

    /// Each table's loops against the portable ones and the update spelled out (same
    /// dot product, same update order), bit for bit.
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
            for n in [1, 7, 16, 29] {
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
                // The block update spelled out: one rescale to the block's maximum,
                // then the positions in order.
                let mut st = Softmax::default();
                let mut acc = vec![0.0; hd];
                for (lo, hi) in [(0, n / 2), (n / 2, n)] {
                    let block = &want[lo..hi];
                    let m = block.iter().fold(f32::NEG_INFINITY, |m, &s| m.max(s));
                    if m > st.max {
                        let rescale = exp_neg(st.max - m);
                        st.denom *= rescale;
                        acc.iter_mut().for_each(|x| *x *= rescale);
                        st.max = m;
                    }
                    for (i, &score) in block.iter().enumerate() {
                        let p = exp_neg(score - st.max);
                        st.denom += p;
                        let v = &kv[(lo + i) * stride..(lo + i) * stride + hd];
                        crate::model::ops::axpy(p, v, &mut acc);
                    }
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

    #[test]
    fn exp_neg_is_within_two_ulp_of_exp() {
        let mut worst = 0u32;
        // Every 997th f32 from -87.3 up to -0.0, then the ends.
        let mut bits = (-87.33f32).to_bits();
        while bits > 0x8000_0000 {
            let x = f32::from_bits(bits);
            let want = (x as f64).exp() as f32;
            let got = exp_neg(x);
            let ulps = got.to_bits().abs_diff(want.to_bits());
            assert!(ulps <= 2, "exp_neg({x}) = {got}, exp = {want}");
            worst = worst.max(ulps);
            bits -= 997;
        }
        assert_eq!(exp_neg(0.0), 1.0);
        assert_eq!(exp_neg(-0.0), 1.0);
        assert_eq!(exp_neg(-100.0), 0.0);
        assert_eq!(exp_neg(f32::NEG_INFINITY), 0.0);
        assert!(exp_neg(f32::NAN).is_nan());
        eprintln!("exp_neg: worst {worst} ulp");
    }

    /// The running softmax over several blocks against a softmax-weighted sum in f64.
    #[test]
    fn online_softmax_matches_the_exact_weighted_sum() {
        let mut rng = Rng::new(31);
        let (hd, n) = (64, 50);
        let scores: Vec<f32> = (0..n).map(|_| rng.f32() * 20.0).collect();
        let values: Vec<f32> = (0..n * hd).map(|_| rng.f32()).collect();
        let (mut st, mut acc) = (Softmax::default(), vec![0.0; hd]);
        for (b, block) in scores.chunks(16).enumerate() {
            online(block, &values[b * 16 * hd..], hd, &mut st, &mut acc);
        }
        let max = scores
            .iter()
            .fold(f64::NEG_INFINITY, |m, &s| m.max(s as f64));
        let w: Vec<f64> = scores.iter().map(|&s| (s as f64 - max).exp()).collect();
        let denom: f64 = w.iter().sum();
        for d in 0..hd {
            let exact: f64 = (0..n)
                .map(|i| w[i] * values[i * hd + d] as f64)
                .sum::<f64>()
                / denom;
            let got = (acc[d] / st.denom) as f64;
            assert!(
                (got - exact).abs() <= 1e-5 * (1.0 + exact.abs()),
                "[{d}] {got} vs {exact}"
            );
        }
    }

    fn bits(v: &[f32]) -> Vec<u32> {
        v.iter().map(|f| f.to_bits()).collect()
    }
}
