//! Reference quantizers for the K-quant super-blocks (Q2_K .. Q6_K, Q8_K), ported
//! from ggml's `quantize_row_*_ref` with the same floating-point operation order, so the
//! bytes match ggml built without FMA contraction.

use super::dequant::{f16_at, q3_k_scale, scale_min_k4};
use super::quantize::{f16_round, put_f16};
use super::types::{K_SCALE_SIZE, QK_K};

/// Below this magnitude a group counts as all zeros (ggml's `GROUP_MAX_EPS`).
const GROUP_MAX_EPS: f32 = 1e-15;

/// ggml's `nearest_int`: round half to even via the 1.5 * 2^23 trick (valid for
/// |v| < 2^22, which every caller guarantees).
#[inline]
pub(crate) fn nearest_int(v: f32) -> i32 {
    let bits = (v + 12_582_912.0f32).to_bits() as i32;
    (bits & 0x007f_ffff) - 0x0040_0000
}

/// ggml's `make_qkx2_quants`: the scale and (negated) min of an asymmetric `nmax`-level
/// quantization of `x` that minimises the `weights`-weighted squared error, found by a
/// small grid search around the min/max fit. Writes the levels into `l`. `use_mad`
/// weighs absolute instead of squared errors (Q2_K).
#[allow(clippy::too_many_arguments)]
fn make_qkx2_quants(
    nmax: i32,
    x: &[f32],
    weights: &[f32],
    l: &mut [u8],
    rmin: f32,
    rdelta: f32,
    nstep: i32,
    use_mad: bool,
) -> (f32, f32) {
    let error = |diff: f32| if use_mad { diff.abs() } else { diff * diff };
    let n = x.len();
    let mut min = x[0];
    let mut max = x[0];
    let mut sum_w = weights[0];
    let mut sum_x = sum_w * x[0];
    for i in 1..n {
        if x[i] < min {
            min = x[i];
        }
        if x[i] > max {
            max = x[i];
        }
        let w = weights[i];
        sum_w += w;
        sum_x += w * x[i];
    }
    if min > 0.0 {
        min = 0.0;
    }
    if max == min {
        l.fill(0);
        return (0.0, -min);
    }
    let mut iscale = nmax as f32 / (max - min);
    let mut scale = 1.0 / iscale;
    let mut best_error = 0.0f32;
    for i in 0..n {
        let q = nearest_int(iscale * (x[i] - min)).clamp(0, nmax);
        l[i] = q as u8;
        let diff = scale * q as f32 + min - x[i];
        best_error += weights[i] * error(diff);
    }
    let mut laux = [0u8; 32];
    for is in 0..=nstep {
        iscale = (rmin + rdelta * is as f32 + nmax as f32) / (max - min);
        let (mut sum_l, mut sum_l2, mut sum_xl) = (0.0f32, 0.0f32, 0.0f32);
        for i in 0..n {
            let q = nearest_int(iscale * (x[i] - min)).clamp(0, nmax);
            laux[i] = q as u8;
            let (w, qf) = (weights[i], q as f32);
            sum_l += w * qf;
            sum_l2 += w * qf * qf;
            sum_xl += w * qf * x[i];
        }
        let d = sum_w * sum_l2 - sum_l * sum_l;
        if d > 0.0 {
            let mut this_scale = (sum_w * sum_xl - sum_x * sum_l) / d;
            let mut this_min = (sum_l2 * sum_x - sum_l * sum_xl) / d;
            if this_min > 0.0 {
                this_min = 0.0;
                this_scale = sum_xl / sum_l2;
            }
            let mut cur_error = 0.0f32;
            for i in 0..n {
                let diff = this_scale * laux[i] as f32 + this_min - x[i];
                cur_error += weights[i] * error(diff);
            }
            if cur_error < best_error {
                l[..n].copy_from_slice(&laux[..n]);
                best_error = cur_error;
                scale = this_scale;
                min = this_min;
            }
        }
    }
    (scale, -min)
}

/// ggml's `make_qx_quants` with `rmse_type == 1` and no importance weights: a symmetric
/// scale for `2 * nmax` levels, refined by a small search weighted by `x^2`. Writes
/// levels offset by `nmax` into `l`.
fn make_qx_quants_rmse1(nmax: i32, x: &[f32], l: &mut [i8]) -> f32 {
    let mut max = 0.0f32;
    let mut amax = 0.0f32;
    for &v in x {
        if v.abs() > amax {
            amax = v.abs();
            max = v;
        }
    }
    if amax < GROUP_MAX_EPS {
        l.fill(0);
        return 0.0;
    }
    let level = |iscale: f32, v: f32| nearest_int(iscale * v).clamp(-nmax, nmax - 1);
    let mut iscale = -(nmax as f32) / max;
    let (mut sumlx, mut suml2) = (0.0f32, 0.0f32);
    for (li, &v) in l.iter_mut().zip(x) {
        let q = level(iscale, v);
        *li = (q + nmax) as i8;
        let w = v * v;
        sumlx += w * v * q as f32;
        suml2 += w * q as f32 * q as f32;
    }
    let mut scale = if suml2 != 0.0 { sumlx / suml2 } else { 0.0 };
    let mut best = scale * sumlx;
    for is in -9..=9 {
        if is == 0 {
            continue;
        }
        iscale = -(nmax as f32 + 0.1 * is as f32) / max;
        sumlx = 0.0;
        suml2 = 0.0;
        for &v in x {
            let q = level(iscale, v);
            let w = v * v;
            sumlx += w * v * q as f32;
            suml2 += w * q as f32 * q as f32;
        }
        if suml2 > 0.0 && sumlx * sumlx > best * suml2 {
            for (li, &v) in l.iter_mut().zip(x) {
                *li = (level(iscale, v) + nmax) as i8;
            }
            scale = sumlx / suml2;
            best = scale * sumlx;
        }
    }
    scale
}

/// ggml's `make_q3_quants` with `do_rmse`: a symmetric scale for levels `-nmax..nmax`,
/// refined by moving one level at a time while the `x^2`-weighted fit improves. Writes
/// levels offset by `nmax` into `l`.
fn make_q3_quants(nmax: i32, x: &[f32], l: &mut [i8]) -> f32 {
    let (mut max, mut amax) = (0.0f32, 0.0f32);
    for &v in x {
        if v.abs() > amax {
            amax = v.abs();
            max = v;
        }
    }
    if amax < GROUP_MAX_EPS {
        l.fill(0);
        return 0.0;
    }
    let iscale = -(nmax as f32) / max;
    let (mut sumlx, mut suml2) = (0.0f32, 0.0f32);
    for (li, &v) in l.iter_mut().zip(x) {
        let q = nearest_int(iscale * v).clamp(-nmax, nmax - 1);
        *li = q as i8;
        let w = v * v;
        sumlx += w * v * q as f32;
        suml2 += w * q as f32 * q as f32;
    }
    for _ in 0..5 {
        let mut changed = false;
        for (li, &v) in l.iter_mut().zip(x) {
            let w = v * v;
            let old = *li as f32;
            let mut slx = sumlx - w * v * old;
            if slx > 0.0 {
                let mut sl2 = suml2 - w * old * old;
                let new_l = nearest_int(v * sl2 / slx).clamp(-nmax, nmax - 1);
                if new_l != *li as i32 {
                    slx += w * v * new_l as f32;
                    sl2 += w * new_l as f32 * new_l as f32;
                    if sl2 > 0.0 && slx * slx * suml2 > sumlx * sumlx * sl2 {
                        *li = new_l as i8;
                        sumlx = slx;
                        suml2 = sl2;
                        changed = true;
                    }
                }
            }
        }
        if !changed {
            break;
        }
    }
    for li in l.iter_mut() {
        *li += nmax as i8;
    }
    if suml2 > 0.0 {
        sumlx / suml2
    } else {
        0.0
    }
}

/// Packs 2-bit levels (`l[i] < 4`) as Q2_K and Q3_K store them: in each half of 128,
/// byte `k` holds elements `k`, `k + 32`, `k + 64` and `k + 96` from the low bits up.
fn pack_2bit(l: &[u8; QK_K], qs: &mut [u8]) {
    for (half, q) in qs.chunks_exact_mut(32).enumerate() {
        let l = &l[128 * half..];
        for (k, byte) in q.iter_mut().enumerate() {
            *byte = l[k] | (l[k + 32] << 2) | (l[k + 64] << 4) | (l[k + 96] << 6);
        }
    }
}

/// One Q2_K super-block (`x.len() == 256`, `b.len() == 84`).
pub(crate) fn quantize_q2_k(x: &[f32], b: &mut [u8]) {
    const Q4SCALE: f32 = 15.0;
    let mut l = [0u8; QK_K];
    let mut scales = [0.0f32; QK_K / 16];
    let mut mins = [0.0f32; QK_K / 16];
    let (mut max_scale, mut max_min) = (0.0f32, 0.0f32);
    for j in 0..QK_K / 16 {
        let xs = &x[16 * j..16 * j + 16];
        let w: [f32; 16] = std::array::from_fn(|i| xs[i].abs());
        let (s, m) = make_qkx2_quants(3, xs, &w, &mut l[16 * j..16 * j + 16], -0.5, 0.1, 15, true);
        scales[j] = s;
        mins[j] = m;
        if s > max_scale {
            max_scale = s;
        }
        if m > max_min {
            max_min = m;
        }
    }
    let (sc_bytes, rest) = b.split_at_mut(QK_K / 16);
    let (qs, dd) = rest.split_at_mut(QK_K / 4);
    sc_bytes.fill(0);
    if max_scale > 0.0 {
        let iscale = Q4SCALE / max_scale;
        for (byte, &s) in sc_bytes.iter_mut().zip(&scales) {
            // C stores the int into a uint8_t: keep the truncation.
            *byte = nearest_int(iscale * s) as u8;
        }
        put_f16(dd, 0, max_scale / Q4SCALE);
    } else {
        put_f16(dd, 0, 0.0);
    }
    if max_min > 0.0 {
        let iscale = Q4SCALE / max_min;
        for (byte, &m) in sc_bytes.iter_mut().zip(&mins) {
            *byte |= (nearest_int(iscale * m) << 4) as u8;
        }
        put_f16(dd, 2, max_min / Q4SCALE);
    } else {
        put_f16(dd, 2, 0.0);
    }
    let (d_all, dmin_all) = (f16_at(dd, 0), f16_at(dd, 2));
    for j in 0..QK_K / 16 {
        let d = d_all * (sc_bytes[j] & 0xF) as f32;
        if d == 0.0 {
            continue;
        }
        let dm = dmin_all * (sc_bytes[j] >> 4) as f32;
        for ii in 0..16 {
            l[16 * j + ii] = nearest_int((x[16 * j + ii] + dm) / d).clamp(0, 3) as u8;
        }
    }
    pack_2bit(&l, qs);
}

/// One Q3_K super-block (`x.len() == 256`, `b.len() == 110`).
pub(crate) fn quantize_q3_k(x: &[f32], b: &mut [u8]) {
    let mut l = [0i8; QK_K];
    let mut scales = [0.0f32; QK_K / 16];
    let (mut max_scale, mut amax) = (0.0f32, 0.0f32);
    for j in 0..QK_K / 16 {
        let s = make_q3_quants(4, &x[16 * j..16 * j + 16], &mut l[16 * j..16 * j + 16]);
        scales[j] = s;
        if s.abs() > amax {
            amax = s.abs();
            max_scale = s;
        }
    }
    let (hmask, rest) = b.split_at_mut(QK_K / 8);
    let (qs, rest) = rest.split_at_mut(QK_K / 4);
    let (packed, d_bytes) = rest.split_at_mut(K_SCALE_SIZE);
    packed.fill(0);
    if max_scale != 0.0 {
        let iscale = -32.0 / max_scale;
        for (j, &s) in scales.iter().enumerate() {
            // C assigns the int to an int8_t before clamping: keep the wrapping.
            let l = ((nearest_int(iscale * s) as i8).clamp(-32, 31) + 32) as u8;
            if j < 8 {
                packed[j] = l & 0xF;
            } else {
                packed[j - 8] |= (l & 0xF) << 4;
            }
            packed[8 + j % 4] |= (l >> 4) << (2 * (j / 4));
        }
        put_f16(d_bytes, 0, 1.0 / iscale);
    } else {
        put_f16(d_bytes, 0, 0.0);
    }
    let d_all = f16_at(d_bytes, 0);
    for j in 0..QK_K / 16 {
        let d = d_all * q3_k_scale(packed, j) as f32;
        if d == 0.0 {
            continue;
        }
        for ii in 0..16 {
            l[16 * j + ii] = (nearest_int(x[16 * j + ii] / d).clamp(-4, 3) + 4) as i8;
        }
    }
    hmask.fill(0);
    let mut low = [0u8; QK_K];
    for (i, (&q, lo)) in l.iter().zip(low.iter_mut()).enumerate() {
        // The third bit of element i is bit i / 32 of hmask[i % 32].
        let q = q as u8;
        if q > 3 {
            hmask[i % 32] |= 1 << (i / 32);
        }
        *lo = q & 3;
    }
    pack_2bit(&low, qs);
}

/// The per-sub-block weights ggml's reference Q4_K / Q5_K quantizers use.
fn qkx_weights(x: &[f32]) -> [f32; 32] {
    let mut sum_x2 = 0.0f32;
    for &v in x {
        sum_x2 += v * v;
    }
    let av_x = (sum_x2 / 32.0).sqrt();
    std::array::from_fn(|l| av_x + x[l].abs())
}

/// Shared front half of Q4_K and Q5_K: fits the 8 sub-blocks, writes `d`, `dmin` and the
/// packed 6-bit scales into `b[..4 + K_SCALE_SIZE]`, and returns the final levels.
fn quantize_k4_scales(x: &[f32], b: &mut [u8], nmax: i32, rmin: f32, nstep: i32) -> [u8; QK_K] {
    let mut l = [0u8; QK_K];
    let mut scales = [0.0f32; QK_K / 32];
    let mut mins = [0.0f32; QK_K / 32];
    let (mut max_scale, mut max_min) = (0.0f32, 0.0f32);
    for j in 0..QK_K / 32 {
        let xs = &x[32 * j..32 * j + 32];
        let w = qkx_weights(xs);
        let (s, m) = make_qkx2_quants(
            nmax,
            xs,
            &w,
            &mut l[32 * j..32 * j + 32],
            rmin,
            0.1,
            nstep,
            false,
        );
        scales[j] = s;
        mins[j] = m;
        if s > max_scale {
            max_scale = s;
        }
        if m > max_min {
            max_min = m;
        }
    }
    let inv_scale = if max_scale > 0.0 {
        63.0 / max_scale
    } else {
        0.0
    };
    let inv_min = if max_min > 0.0 { 63.0 / max_min } else { 0.0 };
    let packed = &mut b[4..4 + K_SCALE_SIZE];
    packed.fill(0);
    for j in 0..QK_K / 32 {
        // C stores `nearest_int` into a uint8_t before clamping: keep the truncation.
        let ls = (nearest_int(inv_scale * scales[j]) as u8).min(63);
        let lm = (nearest_int(inv_min * mins[j]) as u8).min(63);
        if j < 4 {
            packed[j] = ls;
            packed[j + 4] = lm;
        } else {
            packed[j + 4] = (ls & 0xF) | ((lm & 0xF) << 4);
            packed[j - 4] |= (ls >> 4) << 6;
            packed[j] |= (lm >> 4) << 6;
        }
    }
    put_f16(b, 0, max_scale / 63.0);
    put_f16(b, 2, max_min / 63.0);
    let (d_all, dmin_all) = (f16_round(max_scale / 63.0), f16_round(max_min / 63.0));
    for j in 0..QK_K / 32 {
        let (sc, m) = scale_min_k4(j, &b[4..4 + K_SCALE_SIZE]);
        let d = d_all * sc as f32;
        if d == 0.0 {
            continue;
        }
        let dm = dmin_all * m as f32;
        for ii in 0..32 {
            l[32 * j + ii] = nearest_int((x[32 * j + ii] + dm) / d).clamp(0, nmax) as u8;
        }
    }
    l
}

/// One Q4_K super-block (`x.len() == 256`, `b.len() == 144`).
pub(crate) fn quantize_q4_k(x: &[f32], b: &mut [u8]) {
    let l = quantize_k4_scales(x, b, 15, -1.0, 20);
    let qs = &mut b[4 + K_SCALE_SIZE..];
    for (c, q) in qs.chunks_exact_mut(32).enumerate() {
        let base = 64 * c;
        for i in 0..32 {
            q[i] = l[base + i] | (l[base + i + 32] << 4);
        }
    }
}

/// One Q5_K super-block (`x.len() == 256`, `b.len() == 176`).
pub(crate) fn quantize_q5_k(x: &[f32], b: &mut [u8]) {
    let l = quantize_k4_scales(x, b, 31, -0.5, 15);
    let (qh, ql) = b[4 + K_SCALE_SIZE..].split_at_mut(QK_K / 8);
    qh.fill(0);
    for (c, q) in ql.chunks_exact_mut(32).enumerate() {
        let base = 64 * c;
        let (m1, m2) = (1u8 << (2 * c), 2u8 << (2 * c));
        for j in 0..32 {
            let mut l1 = l[base + j];
            if l1 > 15 {
                l1 -= 16;
                qh[j] |= m1;
            }
            let mut l2 = l[base + j + 32];
            if l2 > 15 {
                l2 -= 16;
                qh[j] |= m2;
            }
            q[j] = l1 | (l2 << 4);
        }
    }
}

/// One Q6_K super-block (`x.len() == 256`, `b.len() == 210`).
pub(crate) fn quantize_q6_k(x: &[f32], b: &mut [u8]) {
    let mut l = [0i8; QK_K];
    let mut scales = [0.0f32; QK_K / 16];
    let (mut max_scale, mut max_abs_scale) = (0.0f32, 0.0f32);
    for ib in 0..QK_K / 16 {
        let s = make_qx_quants_rmse1(32, &x[16 * ib..16 * ib + 16], &mut l[16 * ib..16 * ib + 16]);
        scales[ib] = s;
        if s.abs() > max_abs_scale {
            max_abs_scale = s.abs();
            max_scale = s;
        }
    }
    let sc_off = QK_K / 2 + QK_K / 4;
    if max_abs_scale < GROUP_MAX_EPS {
        b.fill(0);
        return;
    }
    let iscale = -128.0 / max_scale;
    put_f16(b, sc_off + QK_K / 16, 1.0 / iscale);
    let d_all = f16_round(1.0 / iscale);
    for ib in 0..QK_K / 16 {
        // C assigns an int to an int8_t: keep the wrapping conversion.
        b[sc_off + ib] = nearest_int(iscale * scales[ib]).min(127) as i8 as u8;
    }
    for j in 0..QK_K / 16 {
        let d = d_all * b[sc_off + j] as i8 as f32;
        if d == 0.0 {
            continue;
        }
        for ii in 0..16 {
            let q = nearest_int(x[16 * j + ii] / d).clamp(-32, 31);
            l[16 * j + ii] = (q + 32) as i8;
        }
    }
    let (ql, rest) = b.split_at_mut(QK_K / 2);
    let qh = &mut rest[..QK_K / 4];
    for half in 0..2 {
        let (ql, qh, l) = (&mut ql[64 * half..], &mut qh[32 * half..], &l[128 * half..]);
        for i in 0..32 {
            let q = |k: usize| l[i + 32 * k] as u8;
            ql[i] = (q(0) & 0xF) | ((q(2) & 0xF) << 4);
            ql[i + 32] = (q(1) & 0xF) | ((q(3) & 0xF) << 4);
            qh[i] = (q(0) >> 4) | ((q(1) >> 4) << 2) | ((q(2) >> 4) << 4) | ((q(3) >> 4) << 6);
        }
    }
}

/// One Q8_K super-block (`x.len() == 256`, `b.len() == 292`).
pub(crate) fn quantize_q8_k(x: &[f32], b: &mut [u8]) {
    let (mut max, mut amax) = (0.0f32, 0.0f32);
    for &v in x {
        if v.abs() > amax {
            amax = v.abs();
            max = v;
        }
    }
    if amax == 0.0 {
        b.fill(0);
        return;
    }
    let iscale = -127.0 / max;
    let qs = &mut b[4..4 + QK_K];
    for (q, &v) in qs.iter_mut().zip(x) {
        *q = nearest_int(iscale * v).min(127) as i8 as u8;
    }
    let mut bsums = [0i16; QK_K / 16];
    for (s, q) in bsums.iter_mut().zip(qs.chunks_exact(16)) {
        *s = q.iter().map(|&v| v as i8 as i16).sum();
    }
    for (j, s) in bsums.iter().enumerate() {
        let off = 4 + QK_K + 2 * j;
        b[off..off + 2].copy_from_slice(&s.to_le_bytes());
    }
    b[..4].copy_from_slice(&(1.0 / iscale).to_le_bytes());
}
