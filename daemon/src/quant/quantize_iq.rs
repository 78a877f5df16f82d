//! Quantizers for the non-linear 4-bit types (IQ4_NL, IQ4_XS), ported from ggml's
//! `quantize_row_iq4_nl_impl` as `quantize_iq4_nl` / `quantize_iq4_xs` call it without an
//! importance matrix (what llama-quantize writes without `--imatrix`), with the same
//! floating-point operation order, so the bytes match ggml built without FMA contraction.

use super::quantize::put_f16;
use super::quantize_k::nearest_int;
use super::types::{IQ4NL_VALUES, QK, QK_K};

/// Below this magnitude a group counts as all zeros (ggml's `GROUP_MAX_EPS`).
const GROUP_MAX_EPS: f32 = 1e-15;
/// Scale candidates tried on each side of the min/max fit.
const NTRY: i32 = 7;

/// ggml's `best_index_int8`: the index of the level nearest `x` (ties to the upper one).
fn best_index(x: f32) -> u8 {
    let v = |i: usize| IQ4NL_VALUES[i] as f32;
    if x <= v(0) {
        return 0;
    }
    if x >= v(15) {
        return 15;
    }
    let (mut ml, mut mu) = (0usize, 15usize);
    while mu - ml > 1 {
        let mav = (ml + mu) / 2;
        if x < v(mav) {
            mu = mav;
        } else {
            ml = mav;
        }
    }
    if x - v(mu - 1) < v(mu) - x {
        (mu - 1) as u8
    } else {
        mu as u8
    }
}

/// The `x^2`-weighted least-squares scale of one 32-block, searched around the fit of
/// its largest magnitude to the outermost level; 0 for an all-zero block.
fn block_scale(xb: &[f32]) -> f32 {
    let (mut amax, mut max) = (0.0f32, 0.0f32);
    for &v in xb {
        if v.abs() > amax {
            amax = v.abs();
            max = v;
        }
    }
    if amax < GROUP_MAX_EPS {
        return 0.0;
    }
    let v0 = IQ4NL_VALUES[0] as f32;
    let sums = |id: f32| {
        let (mut sumqx, mut sumq2) = (0.0f32, 0.0f32);
        for &x in xb {
            let q = IQ4NL_VALUES[best_index(id * x) as usize] as f32;
            let w = x * x;
            sumqx += w * q * x;
            sumq2 += w * q * q;
        }
        (sumqx, sumq2)
    };
    let d = -max / v0;
    let (sumqx, sumq2) = sums(1.0 / d);
    let mut d = if sumq2 > 0.0 { sumqx / sumq2 } else { 0.0 };
    let mut best = d * sumqx;
    for itry in -NTRY..=NTRY {
        let (sumqx, sumq2) = sums((itry + IQ4NL_VALUES[0] as i32) as f32 / max);
        if sumq2 > 0.0 && sumqx * sumqx > best * sumq2 {
            d = sumqx / sumq2;
            best = d * sumqx;
        }
    }
    d
}

/// Packs 32-blocks of levels as Q4_0 does: low nibbles elements 0..16, high 16..32.
fn pack_levels(l: &[u8], q4: &mut [u8]) {
    for (lb, qb) in l.chunks_exact(QK).zip(q4.chunks_exact_mut(QK / 2)) {
        for j in 0..QK / 2 {
            qb[j] = lb[j] | (lb[j + QK / 2] << 4);
        }
    }
}

/// One IQ4_NL block (`x.len() == 32`, `b.len() == 18`).
pub(crate) fn quantize_iq4_nl(x: &[f32], b: &mut [u8]) {
    let d = block_scale(x);
    put_f16(b, 0, d);
    // ggml picks the levels with the unrounded scale.
    let id = if d != 0.0 { 1.0 / d } else { 0.0 };
    let l: [u8; QK] = std::array::from_fn(|j| best_index(id * x[j]));
    pack_levels(&l, &mut b[2..2 + QK / 2]);
}

/// One IQ4_XS super-block (`x.len() == 256`, `b.len() == 136`).
pub(crate) fn quantize_iq4_xs(x: &[f32], b: &mut [u8]) {
    let mut scales = [0.0f32; QK_K / QK];
    let (mut max_scale, mut amax_scale) = (0.0f32, 0.0f32);
    for (s, xb) in scales.iter_mut().zip(x.chunks_exact(QK)) {
        *s = block_scale(xb);
        if s.abs() > amax_scale {
            amax_scale = s.abs();
            max_scale = *s;
        }
    }
    let d = -max_scale / 32.0;
    put_f16(b, 0, d);
    let id = if d != 0.0 { 1.0 / d } else { 0.0 };
    let mut l = [0u8; QK_K];
    let mut scales_h = 0u16;
    let scales_l = &mut b[4..4 + QK_K / 64];
    scales_l.fill(0);
    for (ib, &s) in scales.iter().enumerate() {
        let ls = nearest_int(id * s).clamp(-32, 31);
        let dl = d * ls as f32;
        let idl = if dl != 0.0 { 1.0 / dl } else { 0.0 };
        for j in 0..QK {
            l[QK * ib + j] = best_index(idl * x[QK * ib + j]);
        }
        let ls = (ls + 32) as u8;
        scales_l[ib / 2] |= (ls & 0xF) << (4 * (ib % 2));
        scales_h |= ((ls >> 4) as u16) << (2 * ib);
    }
    b[2..4].copy_from_slice(&scales_h.to_le_bytes());
    pack_levels(&l, &mut b[8..8 + QK_K / 2]);
}
