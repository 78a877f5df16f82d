//! NEON kernels for the 2- and 3-bit K-quant super-blocks (Q2_K, Q3_K) and IQ4_XS
//! against Q8K activations, with the integer products on baseline NEON or on `sdot`
//! (`IntDot`).
//!
//! One weight row at a time; each super-block is unpacked once into the signed levels of
//! its sub-blocks and used for every activation row of the tile (its unpacking costs
//! about as much as one row's products). The integer sums are exact and the
//! per-super-block float arithmetic is the scalar twin's, accumulated per output in the
//! same block order, so the results equal the scalar kernels' (with either `IntDot`).

use std::arch::aarch64::*;

use super::super::{Out, Q8KActs, WTile, NR};
use super::k::{dot16, f16_at, load16, load16_s};
use super::{iq4nl_table, IntDot, Sdot, Widening};
use crate::quant::{iq4_xs_scale, q3_k_scale, K_SCALE_SIZE, QK, QK_K};

pub(super) const Q2K: u8 = 0;
pub(super) const Q3K: u8 = 1;
pub(super) const IQ4XS: u8 = 2;

const fn bb(t: u8) -> usize {
    match t {
        Q2K => 84,
        Q3K => 110,
        _ => 136,
    }
}

kquant_entry_points!();

/// The body of both tile kernels. Slices only: every read is bounds-checked.
#[target_feature(enable = "neon")]
#[inline]
fn tile_with<D: IntDot, const T: u8>(w: &WTile, a: &Q8KActs, j0: usize, nr: usize, out: &mut Out) {
    a.check(w, j0, nr);
    debug_assert!(nr <= NR);
    for (r, out_r) in out.iter_mut().enumerate().take(w.rows) {
        // The scalar twin's `acc` of each output, summed over the blocks in the same order.
        let mut acc = [0.0f32; NR];
        for (i, blk) in w.row(r).chunks_exact(bb(T)).enumerate() {
            match T {
                Q2K => q2k_block::<D>(blk, a, j0, i, &mut acc[..nr]),
                Q3K => q3k_block::<D>(blk, a, j0, i, &mut acc[..nr]),
                _ => iq4xs_block::<D>(blk, a, j0, i, &mut acc[..nr]),
            }
        }
        out_r[..nr].copy_from_slice(&acc[..nr]);
    }
}

/// Activation row `j`'s quants, scale and 16-element sums of super-block `i`.
#[inline]
fn acts<'a>(a: &Q8KActs<'a>, j: usize, i: usize) -> (&'a [i8], f32, &'a [i16]) {
    let x = &a.qs(j)[i * QK_K..(i + 1) * QK_K];
    (x, a.d(j)[i], &a.bsums(j)[i * 16..(i + 1) * 16])
}

/// The four 2-bit fields of each byte of `bits`, field `k` first at `k`: ggml's Q2_K /
/// Q3_K `qs` packing keeps elements 32 apart in one byte, so field `k` of 16 consecutive
/// bytes is one sub-block's low bits.
#[target_feature(enable = "neon")]
#[inline]
fn crumbs(bits: uint8x16_t) -> [uint8x16_t; 4] {
    let m3 = vdupq_n_u8(3);
    [
        vandq_u8(bits, m3),
        vandq_u8(vshrq_n_u8::<2>(bits), m3),
        vandq_u8(vshrq_n_u8::<4>(bits), m3),
        vshrq_n_u8::<6>(bits),
    ]
}

/// Adds one Q2_K super-block's products with super-block `i` of activation rows
/// `j0..j0 + acc.len()` to `acc`, with the scalar twin's float operations.
#[target_feature(enable = "neon")]
#[inline]
fn q2k_block<D: IntDot>(blk: &[u8], a: &Q8KActs, j0: usize, i: usize, acc: &mut [f32]) {
    let (scales, qs_off, d_off) = (&blk[..QK_K / 16], QK_K / 16, QK_K / 16 + QK_K / 4);
    // Each sub-block's levels (0..=3) times its 4-bit scale: at most 45, so one product
    // with an activation and the pair `IntDot` adds stay within an i16, and one
    // accumulator then covers the whole super-block instead of a multiply per sub-block.
    let mut q = [vdupq_n_s8(0); 16];
    for h in 0..2 {
        for p in 0..2 {
            // Sub-block 8h + 2k + p holds elements 128h + 32k + 16p .. +16.
            let bits = load16(blk, qs_off + 32 * h + 16 * p);
            for (k, lv) in crumbs(bits).into_iter().enumerate() {
                let s = 8 * h + 2 * k + p;
                q[s] = vreinterpretq_s8_u8(vmulq_u8(lv, vdupq_n_u8(scales[s] & 0xF)));
            }
        }
    }
    let mins = vshrq_n_u8::<4>(load16(blk, 0));
    let mins = [
        vreinterpretq_s16_u16(vmovl_u8(vget_low_u8(mins))),
        vreinterpretq_s16_u16(vmovl_high_u8(mins)),
    ];
    let (dw, dmin) = (f16_at(blk, d_off), f16_at(blk, d_off + 2));
    for (j, acc_j) in acc.iter_mut().enumerate() {
        let (x, dx, bsums) = acts(a, j0 + j, i);
        // Two chains, so consecutive products do not wait on each other.
        let mut sumi = [vdupq_n_s32(0); 2];
        for (s, &qs) in q.iter().enumerate() {
            sumi[s % 2] = D::dot_acc(sumi[s % 2], qs, load16_s(x, 16 * s));
        }
        let isum = vaddvq_s32(vaddq_s32(sumi[0], sumi[1]));
        let (b0, b1) = (load8_i16(bsums, 0), load8_i16(bsums, 8));
        let m = vmull_s16(vget_low_s16(mins[0]), vget_low_s16(b0));
        let m = vmlal_high_s16(m, mins[0], b0);
        let m = vmlal_s16(m, vget_low_s16(mins[1]), vget_low_s16(b1));
        let msum = vaddvq_s32(vmlal_high_s16(m, mins[1], b1));
        *acc_j += dx * dw * isum as f32 - dx * dmin * msum as f32;
    }
}

/// Adds one Q3_K super-block's products with super-block `i` of activation rows
/// `j0..j0 + acc.len()` to `acc`, with the scalar twin's float operations.
#[target_feature(enable = "neon")]
#[inline]
fn q3k_block<D: IntDot>(blk: &[u8], a: &Q8KActs, j0: usize, i: usize, acc: &mut [f32]) {
    let (qs_off, sc_off) = (QK_K / 8, QK_K / 8 + QK_K / 4);
    let scales = &blk[sc_off..sc_off + K_SCALE_SIZE];
    let sc: [i32; 16] = std::array::from_fn(|s| q3_k_scale(scales, s));
    // Signed levels (-4..=3): a scale times a level can reach 128, past an i8, so the
    // scales are applied to the 32-bit sums instead.
    let (four, off) = (vdupq_n_u8(4), vdupq_n_s8(4));
    let mut q = [vdupq_n_s8(0); 16];
    for p in 0..2 {
        // Bit 4h + k of byte l is the third bit of element 128h + 32k + 16p + l.
        let hmask = load16(blk, 16 * p);
        for h in 0..2 {
            let bits = load16(blk, qs_off + 32 * h + 16 * p);
            for (k, lv) in crumbs(bits).into_iter().enumerate() {
                let high = vandq_u8(vtstq_u8(hmask, vdupq_n_u8(1 << (4 * h + k))), four);
                q[8 * h + 2 * k + p] = vsubq_s8(vreinterpretq_s8_u8(vorrq_u8(lv, high)), off);
            }
        }
    }
    let dw = f16_at(blk, sc_off + K_SCALE_SIZE);
    for (j, acc_j) in acc.iter_mut().enumerate() {
        let (x, dx, _) = acts(a, j0 + j, i);
        let mut sumi = vdupq_n_s32(0);
        for (s, &qs) in q.iter().enumerate() {
            sumi = vmlaq_n_s32(sumi, dot16::<D>(qs, load16_s(x, 16 * s)), sc[s]);
        }
        *acc_j += dx * dw * vaddvq_s32(sumi) as f32;
    }
}

/// Adds one IQ4_XS super-block's products with super-block `i` of activation rows
/// `j0..j0 + acc.len()` to `acc`, with the scalar twin's float operations.
#[target_feature(enable = "neon")]
#[inline]
fn iq4xs_block<D: IntDot>(blk: &[u8], a: &Q8KActs, j0: usize, i: usize, acc: &mut [f32]) {
    let qs_off = 8;
    let sc: [i32; 8] = std::array::from_fn(|s| iq4_xs_scale(blk, s));
    // Levels reach -127 and scales -32, so the scales are applied to the 32-bit sums
    // (a level times a scale is past an i8); |level * x| <= 127 * 127 suits `IntDot`.
    let (table, m4) = (iq4nl_table(), vdupq_n_u8(0x0F));
    let q: [(int8x16_t, int8x16_t); 8] = std::array::from_fn(|s| {
        // Sub-block s: elements 32s .. +16 in the low nibbles, 32s + 16 .. +16 in the high.
        let bits = load16(blk, qs_off + 16 * s);
        (
            vqtbl1q_s8(table, vandq_u8(bits, m4)),
            vqtbl1q_s8(table, vshrq_n_u8::<4>(bits)),
        )
    });
    let dw = f16_at(blk, 0);
    for (j, acc_j) in acc.iter_mut().enumerate() {
        let (x, dx, _) = acts(a, j0 + j, i);
        let mut sumi = vdupq_n_s32(0);
        for (s, &(lo, hi)) in q.iter().enumerate() {
            let (x0, x1) = (load16_s(x, QK * s), load16_s(x, QK * s + 16));
            let dot = D::dot_acc(D::dot_acc(vdupq_n_s32(0), lo, x0), hi, x1);
            sumi = vmlaq_n_s32(sumi, dot, sc[s]);
        }
        *acc_j += dx * dw * vaddvq_s32(sumi) as f32;
    }
}

/// 8 values at `off` of `b`.
#[target_feature(enable = "neon")]
#[inline]
fn load8_i16(b: &[i16], off: usize) -> int16x8_t {
    let s = &b[off..off + 8];
    // SAFETY: 8 values, bounds-checked by the slice above.
    unsafe { vld1q_s16(s.as_ptr()) }
}
