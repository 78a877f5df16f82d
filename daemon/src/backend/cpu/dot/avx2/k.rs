//! AVX2 kernels for the K-quant super-blocks (Q2_K .. Q6_K, IQ4_XS) against Q8K
//! activations.
//!
//! One weight row at a time: each 64-element chunk is unpacked once and multiplied with
//! every activation row of the tile. Integer sums are exact and the per-super-block
//! float arithmetic is the scalar twin's, so the results equal the scalar kernels'.

use std::arch::x86_64::*;

use super::super::{scalar, Out, Q8KActs, WTile, NR};
use super::{hsum_epi32, iq4nl_table};
use crate::quant::{iq4_xs_scale, q3_k_scale, K_SCALE_SIZE, QK_K};

/// Raw pointers to activation row `j0` of a tile (rows are `cols`, `nsb` and `16 * nsb`
/// apart in the three buffers).
struct KArgs {
    qs: *const i8,
    d: *const f32,
    bsums: *const i16,
    cols: usize,
    /// Super-blocks per row.
    nsb: usize,
}

const Q4K: u8 = 0;
const Q5K: u8 = 1;
const Q6K: u8 = 2;
const Q2K: u8 = 3;
const Q3K: u8 = 4;
const IQ4XS: u8 = 5;

const fn bb(t: u8) -> usize {
    match t {
        Q2K => 84,
        Q3K => 110,
        IQ4XS => 136,
        Q4K => 144,
        Q5K => 176,
        _ => 210,
    }
}

pub(super) fn q2_k(w: &WTile, a: &Q8KActs, j0: usize, nr: usize, out: &mut Out) {
    tile::<Q2K>(w, a, j0, nr, out)
}

pub(super) fn q3_k(w: &WTile, a: &Q8KActs, j0: usize, nr: usize, out: &mut Out) {
    tile::<Q3K>(w, a, j0, nr, out)
}

pub(super) fn iq4_xs(w: &WTile, a: &Q8KActs, j0: usize, nr: usize, out: &mut Out) {
    tile::<IQ4XS>(w, a, j0, nr, out)
}

pub(super) fn q4_k(w: &WTile, a: &Q8KActs, j0: usize, nr: usize, out: &mut Out) {
    tile::<Q4K>(w, a, j0, nr, out)
}

pub(super) fn q5_k(w: &WTile, a: &Q8KActs, j0: usize, nr: usize, out: &mut Out) {
    tile::<Q5K>(w, a, j0, nr, out)
}

pub(super) fn q6_k(w: &WTile, a: &Q8KActs, j0: usize, nr: usize, out: &mut Out) {
    tile::<Q6K>(w, a, j0, nr, out)
}

fn tile<const T: u8>(w: &WTile, a: &Q8KActs, j0: usize, nr: usize, out: &mut Out) {
    w.check(QK_K, bb(T));
    a.check(w, j0, nr);
    let nsb = w.cols / QK_K;
    let args = KArgs {
        qs: a.qs[j0 * a.cols..].as_ptr(),
        d: a.d[j0 * nsb..].as_ptr(),
        bsums: a.bsums[j0 * nsb * 16..].as_ptr(),
        cols: a.cols,
        nsb,
    };
    for (r, out_r) in out.iter_mut().enumerate().take(w.rows) {
        let row = w.row(r);
        // SAFETY: only reachable through the AVX2 table, built after feature detection;
        // `check` asserted that the row and activation rows `j0..j0 + nr` are in bounds.
        unsafe {
            match nr {
                1 => row_kernel::<T, 1>(row, &args, out_r),
                2 => row_kernel::<T, 2>(row, &args, out_r),
                3 => row_kernel::<T, 3>(row, &args, out_r),
                _ => row_kernel::<T, 4>(row, &args, out_r),
            }
        }
    }
}

#[inline]
fn f16_at(b: &[u8], off: usize) -> f32 {
    half::f16::from_bits(u16::from_le_bytes([b[off], b[off + 1]])).to_f32()
}

/// One weight row against `N` activation rows.
///
/// # Safety
/// AVX2 must be available and `a` must describe `N` readable activation rows as wide as
/// `row` (`a.nsb` super-blocks).
#[target_feature(enable = "avx2,fma")]
unsafe fn row_kernel<const T: u8, const N: usize>(row: &[u8], a: &KArgs, out: &mut [f32; NR]) {
    let mut acc = [0.0f32; N];
    for (i, blk) in row.chunks_exact(bb(T)).enumerate().take(a.nsb) {
        let mut sumi = [_mm256_setzero_si256(); N];
        let x = |j: usize, off: usize| a.qs.wrapping_add(j * a.cols + i * QK_K + off);
        // Q3_K's sub-block scales, signed: its sums need them again below.
        let q3_scales: [i32; 16] = if T == Q3K {
            let sc = &blk[QK_K / 8 + QK_K / 4..QK_K / 8 + QK_K / 4 + K_SCALE_SIZE];
            std::array::from_fn(|s| q3_k_scale(sc, s))
        } else {
            [0; 16]
        };
        match T {
            Q6K => q6k_block(blk, &mut sumi, x),
            Q2K | Q3K => k2_block::<T, N>(blk, &q3_scales, &mut sumi, x),
            IQ4XS => iq4xs_block::<N>(blk, &mut sumi, x),
            _ => k4_block::<T, N>(blk, &mut sumi, x),
        }
        for j in 0..N {
            // SAFETY: scale and sums of super-block i of activation row j.
            let (dx, bsums) = unsafe {
                let bs = a.bsums.add((j * a.nsb + i) * 16);
                (*a.d.add(j * a.nsb + i), std::slice::from_raw_parts(bs, 16))
            };
            let isum = hsum_epi32(sumi[j]);
            acc[j] += match T {
                IQ4XS => dx * f16_at(blk, 0) * isum as f32,
                Q2K => {
                    let msum: i32 = blk[..16]
                        .iter()
                        .zip(bsums)
                        .map(|(&sc, &b)| (sc >> 4) as i32 * b as i32)
                        .sum();
                    dx * f16_at(blk, 80) * isum as f32 - dx * f16_at(blk, 82) * msum as f32
                }
                Q3K => {
                    // The levels were summed without their -4 offset.
                    let offs: i32 = q3_scales
                        .iter()
                        .zip(bsums)
                        .map(|(&s, &b)| s * b as i32)
                        .sum();
                    dx * f16_at(blk, 108) * (isum - 4 * offs) as f32
                }
                Q6K => {
                    let sc = &blk[QK_K / 2 + QK_K / 4..QK_K / 2 + QK_K / 4 + 16];
                    let offs: i32 = sc
                        .iter()
                        .zip(bsums)
                        .map(|(&s, &b)| s as i8 as i32 * b as i32)
                        .sum();
                    dx * f16_at(blk, 208) * (isum - 32 * offs) as f32
                }
                _ => {
                    let (_, mn) = scalar::k4_scales(&blk[4..4 + K_SCALE_SIZE]);
                    let msum: i32 = (0..8)
                        .map(|s| mn[s] * (bsums[2 * s] as i32 + bsums[2 * s + 1] as i32))
                        .sum();
                    dx * f16_at(blk, 0) * isum as f32 - dx * f16_at(blk, 2) * msum as f32
                }
            };
        }
    }
    out[..N].copy_from_slice(&acc);
}

/// Adds `sum_s scale_s * dot(level, x)` of one Q4_K / Q5_K super-block to `sumi[j]`.
#[target_feature(enable = "avx2")]
#[inline]
fn k4_block<const T: u8, const N: usize>(
    blk: &[u8],
    sumi: &mut [__m256i; N],
    x: impl Fn(usize, usize) -> *const i8,
) {
    let (sc, _) = scalar::k4_scales(&blk[4..4 + K_SCALE_SIZE]);
    let m4 = _mm256_set1_epi8(0x0F);
    let qs_off = if T == Q5K { 16 + QK_K / 8 } else { 16 };
    assert!(blk.len() >= qs_off + QK_K / 2);
    let qh = if T == Q5K {
        // SAFETY: a Q5_K block holds `qh` at bytes 16..48 (asserted via its length).
        unsafe { _mm256_loadu_si256(blk.as_ptr().add(16).cast()) }
    } else {
        _mm256_setzero_si256()
    };
    for c in 0..4 {
        // SAFETY: chunk c of the quants, within `blk` (asserted above).
        let bits = unsafe { _mm256_loadu_si256(blk.as_ptr().add(qs_off + 32 * c).cast()) };
        let mut lo = _mm256_and_si256(bits, m4);
        let mut hi = _mm256_and_si256(_mm256_srli_epi16::<4>(bits), m4);
        if T == Q5K {
            let high = |bit: usize| {
                let m = _mm256_set1_epi8((1u8 << bit) as i8);
                let set = _mm256_cmpeq_epi8(_mm256_and_si256(qh, m), m);
                _mm256_and_si256(set, _mm256_set1_epi8(16))
            };
            lo = _mm256_or_si256(lo, high(2 * c));
            hi = _mm256_or_si256(hi, high(2 * c + 1));
        }
        let s_lo = _mm256_set1_epi16(sc[2 * c] as i16);
        let s_hi = _mm256_set1_epi16(sc[2 * c + 1] as i16);
        for (j, s) in sumi.iter_mut().enumerate() {
            // SAFETY: `x(j, ..)` points at 64 in-bounds activations of row j (the
            // caller of `row_kernel` guarantees N rows of whole super-blocks).
            let (xl, xh) = unsafe {
                let p = x(j, 64 * c);
                (
                    _mm256_loadu_si256(p.cast()),
                    _mm256_loadu_si256(p.add(32).cast()),
                )
            };
            let pl = _mm256_madd_epi16(s_lo, _mm256_maddubs_epi16(lo, xl));
            let ph = _mm256_madd_epi16(s_hi, _mm256_maddubs_epi16(hi, xh));
            *s = _mm256_add_epi32(*s, _mm256_add_epi32(pl, ph));
        }
    }
}

/// Adds `sum_s scale_s * dot(level, x)` of one Q2_K super-block (levels 0..3, scales
/// from the low nibbles) or Q3_K super-block (levels 0..7 before the -4 offset, signed
/// scales `q3_scales`) to `sumi[j]`. Both store the low two bits of element
/// `128h + 32k + l` in bits `2k` of byte `32h + l`; Q3_K's third bit is bit `4h + k` of
/// `hmask[l]`.
#[target_feature(enable = "avx2")]
#[inline]
fn k2_block<const T: u8, const N: usize>(
    blk: &[u8],
    q3_scales: &[i32; 16],
    sumi: &mut [__m256i; N],
    x: impl Fn(usize, usize) -> *const i8,
) {
    let qs_off = if T == Q3K { QK_K / 8 } else { QK_K / 16 };
    assert!(blk.len() >= qs_off + QK_K / 4);
    let m3 = _mm256_set1_epi8(3);
    let hmask = if T == Q3K {
        // SAFETY: a Q3_K block starts with its 32-byte `hmask` (asserted via its length).
        unsafe { _mm256_loadu_si256(blk.as_ptr().cast()) }
    } else {
        _mm256_setzero_si256()
    };
    let scale = |s: usize| -> i16 {
        if T == Q3K {
            q3_scales[s] as i16
        } else {
            (blk[s] & 0xF) as i16
        }
    };
    for h in 0..2 {
        // SAFETY: half h of the quants lies within `blk` (asserted above).
        let bits = unsafe { _mm256_loadu_si256(blk.as_ptr().add(qs_off + 32 * h).cast()) };
        for k in 0..4 {
            let mut q =
                _mm256_and_si256(_mm256_srl_epi16(bits, _mm_cvtsi32_si128(2 * k as i32)), m3);
            if T == Q3K {
                let m = _mm256_set1_epi8((1u8 << (4 * h + k)) as i8);
                let set = _mm256_cmpeq_epi8(_mm256_and_si256(hmask, m), m);
                q = _mm256_or_si256(q, _mm256_and_si256(set, _mm256_set1_epi8(4)));
            }
            // Quarter k of half h covers sub-blocks 8h + 2k (elements 0..16) and 8h + 2k + 1.
            let s = 8 * h + 2 * k;
            let scales = _mm256_set_m128i(_mm_set1_epi16(scale(s + 1)), _mm_set1_epi16(scale(s)));
            for (j, acc) in sumi.iter_mut().enumerate() {
                // SAFETY: `x` points at 32 in-bounds activations of row j.
                let xv = unsafe { _mm256_loadu_si256(x(j, 128 * h + 32 * k).cast()) };
                let p = _mm256_madd_epi16(scales, _mm256_maddubs_epi16(q, xv));
                *acc = _mm256_add_epi32(*acc, p);
            }
        }
    }
}

/// Adds `sum_s (ls_s - 32) * dot(level, x)` of one IQ4_XS super-block to `sumi[j]`:
/// sub-block `s` is 16 bytes of nibbles (elements 0..16 low, 16..32 high) that index the
/// signed IQ4_NL levels.
#[target_feature(enable = "avx2")]
#[inline]
fn iq4xs_block<const N: usize>(
    blk: &[u8],
    sumi: &mut [__m256i; N],
    x: impl Fn(usize, usize) -> *const i8,
) {
    assert!(blk.len() >= 136);
    let table = iq4nl_table();
    let m4 = _mm256_set1_epi8(0x0F);
    for s in 0..8 {
        // SAFETY: sub-block s's 16 bytes lie within `blk` (asserted above).
        let q = unsafe { _mm_loadu_si128(blk.as_ptr().add(8 + 16 * s).cast()) };
        let codes = _mm256_and_si256(_mm256_set_m128i(_mm_srli_epi16::<4>(q), q), m4);
        let levels = _mm256_shuffle_epi8(table, codes);
        // Signed by signed: |level| <= 127, so `abs` fits the unsigned operand.
        let abs = _mm256_abs_epi8(levels);
        let scale = _mm256_set1_epi16(iq4_xs_scale(blk, s) as i16);
        for (j, acc) in sumi.iter_mut().enumerate() {
            // SAFETY: `x` points at 32 in-bounds activations of row j.
            let xv = unsafe { _mm256_loadu_si256(x(j, 32 * s).cast()) };
            let p16 = _mm256_maddubs_epi16(abs, _mm256_sign_epi8(xv, levels));
            *acc = _mm256_add_epi32(*acc, _mm256_madd_epi16(scale, p16));
        }
    }
}

/// Adds `sum_s scale_s * dot(level, x)` (levels 0..63, before the -32 offset) of one
/// Q6_K super-block to `sumi[j]`.
#[target_feature(enable = "avx2")]
#[inline]
fn q6k_block<const N: usize>(
    blk: &[u8],
    sumi: &mut [__m256i; N],
    x: impl Fn(usize, usize) -> *const i8,
) {
    assert!(blk.len() >= 210);
    let m15 = _mm256_set1_epi8(0x0F);
    let sc = &blk[192..208];
    for h in 0..2 {
        // SAFETY: `ql` (0..128) and `qh` (128..192) are within `blk` (asserted).
        let (ql0, ql1, qh) = unsafe {
            let p = blk.as_ptr();
            (
                _mm256_loadu_si256(p.add(64 * h).cast()),
                _mm256_loadu_si256(p.add(64 * h + 32).cast()),
                _mm256_loadu_si256(p.add(128 + 32 * h).cast()),
            )
        };
        let q = [
            _mm256_or_si256(
                _mm256_and_si256(ql0, m15),
                _mm256_slli_epi16::<4>(_mm256_and_si256(qh, _mm256_set1_epi8(3))),
            ),
            _mm256_or_si256(
                _mm256_and_si256(ql1, m15),
                _mm256_slli_epi16::<2>(_mm256_and_si256(qh, _mm256_set1_epi8(12))),
            ),
            _mm256_or_si256(
                _mm256_and_si256(_mm256_srli_epi16::<4>(ql0), m15),
                _mm256_and_si256(qh, _mm256_set1_epi8(48)),
            ),
            _mm256_or_si256(
                _mm256_and_si256(_mm256_srli_epi16::<4>(ql1), m15),
                _mm256_srli_epi16::<2>(_mm256_and_si256(qh, _mm256_set1_epi8(-64))),
            ),
        ];
        // Quarter k covers sub-blocks 8h + 2k (elements 0..16) and 8h + 2k + 1.
        let scales: [__m256i; 4] = std::array::from_fn(|k| {
            let s = |i: usize| _mm_set1_epi16(sc[8 * h + 2 * k + i] as i8 as i16);
            _mm256_set_m128i(s(1), s(0))
        });
        for (j, s) in sumi.iter_mut().enumerate() {
            for k in 0..4 {
                // SAFETY: `x` points at 32 in-bounds activations of row j.
                let xv = unsafe { _mm256_loadu_si256(x(j, 128 * h + 32 * k).cast()) };
                let p = _mm256_madd_epi16(scales[k], _mm256_maddubs_epi16(q[k], xv));
                *s = _mm256_add_epi32(*s, p);
            }
        }
    }
}
