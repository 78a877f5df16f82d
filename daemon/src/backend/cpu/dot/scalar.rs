//! Portable scalar kernels: the fallback on CPUs without a SIMD path, and the twins the
//! SIMD kernels are tested against. Integer block dot products are exact; only the final
//! scaling is in floating point.

use half::f16;

use super::{F32Acts, Kernels, Out, Q8Acts, Q8KActs, WTile};
use crate::quant::{
    iq4_xs_scale, k_2bit_level, q3_k_scale, GgmlType, IQ4NL_VALUES, K_SCALE_SIZE, QK, QK_K,
};

pub(crate) const KERNELS: Kernels = Kernels {
    name: "scalar",
    quantize_q8,
    quantize_q8k,
    q4_0: |w, a, j0, nr, out| legacy_tile(GgmlType::Q4_0, decode_q4_0, w, a, j0, nr, out),
    q4_1: |w, a, j0, nr, out| legacy_tile(GgmlType::Q4_1, decode_q4_1, w, a, j0, nr, out),
    q5_0: |w, a, j0, nr, out| legacy_tile(GgmlType::Q5_0, decode_q5_0, w, a, j0, nr, out),
    q5_1: |w, a, j0, nr, out| legacy_tile(GgmlType::Q5_1, decode_q5_1, w, a, j0, nr, out),
    q8_0: |w, a, j0, nr, out| legacy_tile(GgmlType::Q8_0, decode_q8_0, w, a, j0, nr, out),
    iq4_nl: |w, a, j0, nr, out| legacy_tile(GgmlType::IQ4_NL, decode_iq4_nl, w, a, j0, nr, out),
    q2_k: |w, a, j0, nr, out| k_tile(GgmlType::Q2_K, dot_q2_k, w, a, j0, nr, out),
    q3_k: |w, a, j0, nr, out| k_tile(GgmlType::Q3_K, dot_q3_k, w, a, j0, nr, out),
    q4_k: |w, a, j0, nr, out| k_tile(GgmlType::Q4_K, dot_q4_k, w, a, j0, nr, out),
    q5_k: |w, a, j0, nr, out| k_tile(GgmlType::Q5_K, dot_q5_k, w, a, j0, nr, out),
    q6_k: |w, a, j0, nr, out| k_tile(GgmlType::Q6_K, dot_q6_k, w, a, j0, nr, out),
    iq4_xs: |w, a, j0, nr, out| k_tile(GgmlType::IQ4_XS, dot_iq4_xs, w, a, j0, nr, out),
    f32: |w, a, j0, nr, out| float_tile(|b, i| f32_at(b, 4 * i), w, a, j0, nr, out),
    f16: |w, a, j0, nr, out| float_tile(|b, i| f16_at(b, 2 * i), w, a, j0, nr, out),
    bf16: |w, a, j0, nr, out| float_tile(|b, i| bf16_at(b, 2 * i), w, a, j0, nr, out),
    packed_q4_0: super::packed::dot_q4_0,
    packed_q4_1: super::packed::dot_q4_1,
    packed_q8_0: super::packed::dot_q8_0,
    pack_weights: false,
};

#[inline]
fn f16_at(b: &[u8], off: usize) -> f32 {
    f16::from_bits(u16::from_le_bytes([b[off], b[off + 1]])).to_f32()
}

#[inline]
fn bf16_at(b: &[u8], off: usize) -> f32 {
    f32::from_bits((u16::from_le_bytes([b[off], b[off + 1]]) as u32) << 16)
}

#[inline]
fn f32_at(b: &[u8], off: usize) -> f32 {
    f32::from_le_bytes([b[off], b[off + 1], b[off + 2], b[off + 3]])
}

/// The scale (`amax / 127`) and its inverse for symmetric 8-bit quantization. Every
/// activation quantizer (scalar or SIMD) uses exactly these operations, so they agree
/// bit for bit.
#[inline]
pub(crate) fn q8_scale(amax: f32) -> (f32, f32) {
    let d = amax / 127.0;
    (d, if d != 0.0 { 1.0 / d } else { 0.0 })
}

/// Rounds half to even, as `cvtps2dq` and `fcvtns` do.
#[inline]
fn q8_round(v: f32) -> i8 {
    v.round_ties_even() as i8
}

pub(crate) fn quantize_q8(x: &[f32], qs: &mut [i8], d: &mut [f32], s: &mut [f32]) {
    let blocks = x.chunks_exact(QK).zip(qs.chunks_exact_mut(QK));
    for ((xb, qb), (db, sb)) in blocks.zip(d.iter_mut().zip(s.iter_mut())) {
        let amax = xb.iter().fold(0.0f32, |m, v| m.max(v.abs()));
        let (scale, inv) = q8_scale(amax);
        let mut sum = 0i32;
        for (q, &v) in qb.iter_mut().zip(xb) {
            *q = q8_round(v * inv);
            sum += *q as i32;
        }
        *db = scale;
        *sb = scale * sum as f32;
    }
}

pub(crate) fn quantize_q8k(x: &[f32], qs: &mut [i8], d: &mut [f32], bsums: &mut [i16]) {
    let blocks = x.chunks_exact(QK_K).zip(qs.chunks_exact_mut(QK_K));
    for ((xb, qb), (db, sums)) in blocks.zip(d.iter_mut().zip(bsums.chunks_exact_mut(16))) {
        let amax = xb.iter().fold(0.0f32, |m, v| m.max(v.abs()));
        let (scale, inv) = q8_scale(amax);
        for (q, &v) in qb.iter_mut().zip(xb) {
            *q = q8_round(v * inv);
        }
        for (sum, q16) in sums.iter_mut().zip(qb.chunks_exact(16)) {
            *sum = q16.iter().map(|&q| q as i16).sum();
        }
        *db = scale;
    }
}

/// One decoded legacy block: `x = d * q + m` with signed integer levels `q`.
struct Decoded {
    d: f32,
    m: f32,
    q: [i32; QK],
}

/// Low nibbles are elements 0..16, high nibbles 16..32; `off` is subtracted from each.
fn nibbles(qs: &[u8], off: i32) -> [i32; QK] {
    std::array::from_fn(|i| {
        let b = qs[i % 16];
        (if i < 16 { b & 0x0F } else { b >> 4 }) as i32 - off
    })
}

/// Adds the fifth bits of `qh` to 4-bit levels (before any offset).
fn with_high_bits(qh: &[u8], qs: &[u8], off: i32) -> [i32; QK] {
    let qh = u32::from_le_bytes([qh[0], qh[1], qh[2], qh[3]]);
    let mut q = nibbles(qs, 0);
    for (i, v) in q.iter_mut().enumerate() {
        *v = (*v | (((qh >> i) & 1) << 4) as i32) - off;
    }
    q
}

fn decode_q4_0(b: &[u8]) -> Decoded {
    Decoded {
        d: f16_at(b, 0),
        m: 0.0,
        q: nibbles(&b[2..18], 8),
    }
}

fn decode_q4_1(b: &[u8]) -> Decoded {
    Decoded {
        d: f16_at(b, 0),
        m: f16_at(b, 2),
        q: nibbles(&b[4..20], 0),
    }
}

fn decode_q5_0(b: &[u8]) -> Decoded {
    Decoded {
        d: f16_at(b, 0),
        m: 0.0,
        q: with_high_bits(&b[2..6], &b[6..22], 16),
    }
}

fn decode_q5_1(b: &[u8]) -> Decoded {
    Decoded {
        d: f16_at(b, 0),
        m: f16_at(b, 2),
        q: with_high_bits(&b[4..8], &b[8..24], 0),
    }
}

fn decode_q8_0(b: &[u8]) -> Decoded {
    Decoded {
        d: f16_at(b, 0),
        m: 0.0,
        q: std::array::from_fn(|i| b[2 + i] as i8 as i32),
    }
}

/// IQ4_NL: the nibbles index the non-linear levels.
fn decode_iq4_nl(b: &[u8]) -> Decoded {
    Decoded {
        d: f16_at(b, 0),
        m: 0.0,
        q: nibbles(&b[2..18], 0).map(|l| IQ4NL_VALUES[l as usize] as i32),
    }
}

/// Per block: `d_w * d_x * sum(q_w * q_x) + m_w * s_x`.
fn legacy_tile(
    ty: GgmlType,
    decode: fn(&[u8]) -> Decoded,
    w: &WTile,
    a: &Q8Acts,
    j0: usize,
    nr: usize,
    out: &mut Out,
) {
    let bb = ty.block_bytes();
    for (r, out_r) in out.iter_mut().enumerate().take(w.rows) {
        let mut acc = [0.0f32; super::NR];
        for (b, blk) in w.row(r).chunks_exact(bb).enumerate() {
            let dec = decode(blk);
            for (j, acc_j) in acc.iter_mut().enumerate().take(nr) {
                let qs = &a.qs(j0 + j)[b * QK..(b + 1) * QK];
                let isum: i32 = dec.q.iter().zip(qs).map(|(&p, &q)| p * q as i32).sum();
                *acc_j += dec.d * a.d(j0 + j)[b] * isum as f32 + dec.m * a.s(j0 + j)[b];
            }
        }
        out_r[..nr].copy_from_slice(&acc[..nr]);
    }
}

/// The dot product of one K-quant super-block with one Q8K super-block of activations.
type KDot = fn(blk: &[u8], qs: &[i8], d: f32, bsums: &[i16]) -> f32;

fn k_tile(ty: GgmlType, dot: KDot, w: &WTile, a: &Q8KActs, j0: usize, nr: usize, out: &mut Out) {
    let bb = ty.block_bytes();
    for (r, out_r) in out.iter_mut().enumerate().take(w.rows) {
        for (j, o) in out_r.iter_mut().enumerate().take(nr) {
            let (qs, d, bsums) = (a.qs(j0 + j), a.d(j0 + j), a.bsums(j0 + j));
            let mut acc = 0.0f32;
            for (i, blk) in w.row(r).chunks_exact(bb).enumerate() {
                let q = &qs[i * QK_K..(i + 1) * QK_K];
                acc += dot(blk, q, d[i], &bsums[i * 16..(i + 1) * 16]);
            }
            *o = acc;
        }
    }
}

/// Q2_K: `d * sum_s sc_s * dot(level, x) - dmin * sum_s m_s * bsum_s` over the 16
/// sub-blocks, with 4-bit `sc_s` and `m_s` in the nibbles of `scales[s]`.
fn dot_q2_k(blk: &[u8], qs: &[i8], d: f32, bsums: &[i16]) -> f32 {
    let (scales, q) = blk.split_at(QK_K / 16);
    let mut isum = 0i32;
    let mut msum = 0i32;
    for (s, (&sc, q16)) in scales.iter().zip(qs.chunks_exact(16)).enumerate() {
        let dot: i32 = (0..16)
            .map(|l| k_2bit_level(q, 16 * s + l) as i32 * q16[l] as i32)
            .sum();
        isum += (sc & 0xF) as i32 * dot;
        msum += (sc >> 4) as i32 * bsums[s] as i32;
    }
    let off = QK_K / 16 + QK_K / 4;
    d * f16_at(blk, off) * isum as f32 - d * f16_at(blk, off + 2) * msum as f32
}

/// Q3_K: `d * sum_s sc_s * dot(level - 4, x)` over the 16 sub-blocks, where the third
/// bit of a level (from `hmask`) adds 4.
fn dot_q3_k(blk: &[u8], qs: &[i8], d: f32, _bsums: &[i16]) -> f32 {
    let hmask = &blk[..QK_K / 8];
    let q = &blk[QK_K / 8..QK_K / 8 + QK_K / 4];
    let scales = &blk[QK_K / 8 + QK_K / 4..QK_K / 8 + QK_K / 4 + K_SCALE_SIZE];
    let mut isum = 0i32;
    for (s, q16) in qs.chunks_exact(16).enumerate() {
        let dot: i32 = (0..16)
            .map(|l| {
                let i = 16 * s + l;
                let high = ((hmask[i % 32] >> (i / 32)) & 1) << 2;
                ((k_2bit_level(q, i) | high) as i32 - 4) * q16[l] as i32
            })
            .sum();
        isum += q3_k_scale(scales, s) * dot;
    }
    d * f16_at(blk, QK_K / 8 + QK_K / 4 + K_SCALE_SIZE) * isum as f32
}

/// Scales and mins of a Q4_K / Q5_K super-block (ggml's `get_scale_min_k4`).
pub(crate) fn k4_scales(scales: &[u8]) -> ([i32; 8], [i32; 8]) {
    let mut sc = [0i32; 8];
    let mut mn = [0i32; 8];
    for j in 0..8 {
        let (s, m) = if j < 4 {
            (scales[j] & 63, scales[j + 4] & 63)
        } else {
            (
                (scales[j + 4] & 0xF) | ((scales[j - 4] >> 6) << 4),
                (scales[j + 4] >> 4) | ((scales[j] >> 6) << 4),
            )
        };
        sc[j] = s as i32;
        mn[j] = m as i32;
    }
    (sc, mn)
}

/// Shared by Q4_K and Q5_K: `level(i)` is the unsigned level of element `i`.
fn dot_k4(blk: &[u8], level: impl Fn(usize) -> i32, qs: &[i8], d: f32, bsums: &[i16]) -> f32 {
    let (sc, mn) = k4_scales(&blk[4..4 + K_SCALE_SIZE]);
    let mut isum = 0i32;
    let mut msum = 0i32;
    for s in 0..8 {
        let dot: i32 = (32 * s..32 * s + 32).map(|i| level(i) * qs[i] as i32).sum();
        isum += sc[s] * dot;
        msum += mn[s] * (bsums[2 * s] as i32 + bsums[2 * s + 1] as i32);
    }
    d * f16_at(blk, 0) * isum as f32 - d * f16_at(blk, 2) * msum as f32
}

fn dot_q4_k(blk: &[u8], qs: &[i8], d: f32, bsums: &[i16]) -> f32 {
    let q = &blk[4 + K_SCALE_SIZE..];
    // Element i: chunk i / 64 of 32 bytes, low nibble for the first 32, high for the rest.
    let level = |i: usize| {
        let b = q[32 * (i / 64) + i % 32];
        (if i % 64 < 32 { b & 0xF } else { b >> 4 }) as i32
    };
    dot_k4(blk, level, qs, d, bsums)
}

fn dot_q5_k(blk: &[u8], qs: &[i8], d: f32, bsums: &[i16]) -> f32 {
    let qh = &blk[4 + K_SCALE_SIZE..4 + K_SCALE_SIZE + QK_K / 8];
    let ql = &blk[4 + K_SCALE_SIZE + QK_K / 8..];
    let level = |i: usize| {
        let (c, l) = (i / 64, i % 32);
        let b = ql[32 * c + l];
        let (lo, bit) = if i % 64 < 32 {
            (b & 0xF, 2 * c)
        } else {
            (b >> 4, 2 * c + 1)
        };
        (lo | (((qh[l] >> bit) & 1) << 4)) as i32
    };
    dot_k4(blk, level, qs, d, bsums)
}

fn dot_q6_k(blk: &[u8], qs: &[i8], d: f32, _bsums: &[i16]) -> f32 {
    let ql = &blk[..QK_K / 2];
    let qh = &blk[QK_K / 2..QK_K / 2 + QK_K / 4];
    let sc = &blk[QK_K / 2 + QK_K / 4..QK_K / 2 + QK_K / 4 + QK_K / 16];
    let mut isum = 0i32;
    for (s16, q16) in qs.chunks_exact(16).enumerate() {
        let mut dot = 0i32;
        for (k, &x) in q16.iter().enumerate() {
            let i = 16 * s16 + k;
            // Element i: half i / 128, quarter (i % 128) / 32, position l = i % 32.
            let (h, quarter, l) = (i / 128, (i % 128) / 32, i % 32);
            let lo = ql[64 * h + l + 32 * (quarter & 1)];
            let lo = if quarter < 2 { lo & 0xF } else { lo >> 4 };
            let hi = (qh[32 * h + l] >> (2 * quarter)) & 3;
            dot += ((lo | (hi << 4)) as i32 - 32) * x as i32;
        }
        isum += sc[s16] as i8 as i32 * dot;
    }
    d * f16_at(blk, QK_K / 2 + QK_K / 4 + QK_K / 16) * isum as f32
}

/// IQ4_XS: `d * sum_s (ls_s - 32) * dot(level, x)` over the 8 sub-blocks of 32, whose
/// nibbles index the non-linear levels as IQ4_NL's.
fn dot_iq4_xs(blk: &[u8], qs: &[i8], d: f32, _bsums: &[i16]) -> f32 {
    let q = &blk[8..8 + QK_K / 2];
    let mut isum = 0i32;
    for (s, (q16, x)) in q.chunks_exact(16).zip(qs.chunks_exact(QK)).enumerate() {
        let levels = nibbles(q16, 0).map(|l| IQ4NL_VALUES[l as usize] as i32);
        let dot: i32 = levels.iter().zip(x).map(|(&l, &v)| l * v as i32).sum();
        isum += iq4_xs_scale(blk, s) * dot;
    }
    d * f16_at(blk, 0) * isum as f32
}

fn float_tile(
    elem: impl Fn(&[u8], usize) -> f32,
    w: &WTile,
    a: &F32Acts,
    j0: usize,
    nr: usize,
    out: &mut Out,
) {
    for (r, out_r) in out.iter_mut().enumerate().take(w.rows) {
        let row = w.row(r);
        for (j, o) in out_r.iter_mut().enumerate().take(nr) {
            let x = a.row(j0 + j);
            *o = x.iter().enumerate().map(|(i, &v)| elem(row, i) * v).sum();
        }
    }
}
