//! NEON kernels for the K-quant super-blocks (Q4_K, Q5_K, Q6_K) against Q8K activations,
//! with the integer products on baseline NEON or on `sdot` (`IntDot`).
//!
//! One weight row at a time, each 32-byte chunk unpacked once for every activation row
//! of the tile. The integer sums are exact and the per-super-block float arithmetic is
//! the scalar twin's, so the results equal the scalar kernels' (with either `IntDot`).

use std::arch::aarch64::*;

use super::super::{scalar, Out, Q8KActs, WTile, NR};
use super::{IntDot, Sdot, Widening};
use crate::quant::{K_SCALE_SIZE, QK_K};

pub(super) const Q4K: u8 = 0;
pub(super) const Q5K: u8 = 1;
pub(super) const Q6K: u8 = 2;

const fn bb(t: u8) -> usize {
    match t {
        Q4K => 144,
        Q5K => 176,
        _ => 210,
    }
}

kquant_entry_points!();

/// The body of both tile kernels. Slices only: every read is bounds-checked.
#[target_feature(enable = "neon")]
#[inline]
fn tile_with<D: IntDot, const T: u8>(w: &WTile, a: &Q8KActs, j0: usize, nr: usize, out: &mut Out) {
    a.check(w, j0, nr);
    for (r, out_r) in out.iter_mut().enumerate().take(w.rows) {
        let row = w.row(r);
        for (j, o) in out_r.iter_mut().enumerate().take(nr) {
            let (qs, d, bsums) = (a.qs(j0 + j), a.d(j0 + j), a.bsums(j0 + j));
            let mut acc = 0.0f32;
            for (i, blk) in row.chunks_exact(bb(T)).enumerate() {
                let x = &qs[i * QK_K..(i + 1) * QK_K];
                acc += block_dot::<D, T>(blk, x, d[i], &bsums[i * 16..(i + 1) * 16]);
            }
            *o = acc;
        }
    }
    debug_assert!(nr <= NR);
}

#[inline]
pub(super) fn f16_at(b: &[u8], off: usize) -> f32 {
    half::f16::from_bits(u16::from_le_bytes([b[off], b[off + 1]])).to_f32()
}

/// Exact dot product of 16 levels (|level| <= 64) with 16 activations, in 4 lanes.
#[target_feature(enable = "neon")]
#[inline]
pub(super) fn dot16<D: IntDot>(w: int8x16_t, x: int8x16_t) -> int32x4_t {
    D::dot_acc(vdupq_n_s32(0), w, x)
}

/// 16 bytes at `off` of `b`.
#[target_feature(enable = "neon")]
#[inline]
pub(super) fn load16(b: &[u8], off: usize) -> uint8x16_t {
    let s = &b[off..off + 16];
    // SAFETY: 16 bytes, bounds-checked by the slice above.
    unsafe { vld1q_u8(s.as_ptr()) }
}

#[target_feature(enable = "neon")]
#[inline]
pub(super) fn load16_s(x: &[i8], off: usize) -> int8x16_t {
    let s = &x[off..off + 16];
    // SAFETY: 16 bytes, bounds-checked by the slice above.
    unsafe { vld1q_s8(s.as_ptr()) }
}

/// One super-block's contribution, with the scalar twin's float operations.
#[target_feature(enable = "neon")]
#[inline]
fn block_dot<D: IntDot, const T: u8>(blk: &[u8], x: &[i8], dx: f32, bsums: &[i16]) -> f32 {
    if T == Q6K {
        let isum = q6k_isum::<D>(blk, x);
        return dx * f16_at(blk, QK_K / 2 + QK_K / 4 + QK_K / 16) * isum as f32;
    }
    let (sc, mn) = scalar::k4_scales(&blk[4..4 + K_SCALE_SIZE]);
    let qs_off = if T == Q5K { 16 + QK_K / 8 } else { 16 };
    let m4 = vdupq_n_u8(0x0F);
    let mut sumi = vdupq_n_s32(0);
    for c in 0..4 {
        for half in 0..2 {
            // Elements 64c + 16 * half .. +16 (low nibbles) and 64c + 32 + 16 * half
            // (high nibbles) share these 16 bytes.
            let bits = load16(blk, qs_off + 32 * c + 16 * half);
            let mut lo = vandq_u8(bits, m4);
            let mut hi = vshrq_n_u8::<4>(bits);
            if T == Q5K {
                let qh = load16(blk, 16 + 16 * half);
                let sixteen = vdupq_n_u8(16);
                lo = vorrq_u8(
                    lo,
                    vandq_u8(vtstq_u8(qh, vdupq_n_u8(1 << (2 * c))), sixteen),
                );
                hi = vorrq_u8(
                    hi,
                    vandq_u8(vtstq_u8(qh, vdupq_n_u8(2 << (2 * c))), sixteen),
                );
            }
            let xl = load16_s(x, 64 * c + 16 * half);
            let xh = load16_s(x, 64 * c + 32 + 16 * half);
            sumi = vmlaq_n_s32(sumi, dot16::<D>(vreinterpretq_s8_u8(lo), xl), sc[2 * c]);
            sumi = vmlaq_n_s32(sumi, dot16::<D>(vreinterpretq_s8_u8(hi), xh), sc[2 * c + 1]);
        }
    }
    let isum = vaddvq_s32(sumi);
    let msum: i32 = (0..8)
        .map(|s| mn[s] * (bsums[2 * s] as i32 + bsums[2 * s + 1] as i32))
        .sum();
    dx * f16_at(blk, 0) * isum as f32 - dx * f16_at(blk, 2) * msum as f32
}

/// `sum_s scale_s * dot(level - 32, x)` of one Q6_K super-block.
#[target_feature(enable = "neon")]
#[inline]
fn q6k_isum<D: IntDot>(blk: &[u8], x: &[i8]) -> i32 {
    let sc = &blk[QK_K / 2 + QK_K / 4..QK_K / 2 + QK_K / 4 + QK_K / 16];
    let (m15, m3, off) = (vdupq_n_u8(0x0F), vdupq_n_u8(3), vdupq_n_s8(32));
    let mut sumi = vdupq_n_s32(0);
    for h in 0..2 {
        for part in 0..2 {
            // Elements 128h + 16 * part + 32k (k = 0..4) of this 16-byte slice.
            let ql0 = load16(blk, 64 * h + 16 * part);
            let ql1 = load16(blk, 64 * h + 32 + 16 * part);
            let qh = load16(blk, QK_K / 2 + 32 * h + 16 * part);
            let levels = [
                vorrq_u8(vandq_u8(ql0, m15), vshlq_n_u8::<4>(vandq_u8(qh, m3))),
                vorrq_u8(
                    vandq_u8(ql1, m15),
                    vshlq_n_u8::<4>(vandq_u8(vshrq_n_u8::<2>(qh), m3)),
                ),
                vorrq_u8(
                    vshrq_n_u8::<4>(ql0),
                    vshlq_n_u8::<4>(vandq_u8(vshrq_n_u8::<4>(qh), m3)),
                ),
                vorrq_u8(vshrq_n_u8::<4>(ql1), vshlq_n_u8::<4>(vshrq_n_u8::<6>(qh))),
            ];
            for (k, lv) in levels.into_iter().enumerate() {
                let e = 128 * h + 32 * k + 16 * part;
                let q = vsubq_s8(vreinterpretq_s8_u8(lv), off);
                let scale = sc[e / 16] as i8 as i32;
                sumi = vmlaq_n_s32(sumi, dot16::<D>(q, load16_s(x, e)), scale);
            }
        }
    }
    vaddvq_s32(sumi)
}
