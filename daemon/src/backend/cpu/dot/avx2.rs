//! AVX2 + FMA + F16C kernels: every weight type and both activation quantizers.
//!
//! Legacy blocks become 32 codes in a 256-bit register; `vpmaddubsw` (u8 x s8) and
//! `vpmaddwd` give the block's integer dot product in eight lanes. The 4/5-bit types use
//! unsigned codes with an offset term (`m = -8d` for Q4_0, ...) taken once per 8 blocks
//! from the activation block sums; Q8_0 multiplies signed by signed with the
//! `abs`/`sign` trick (the unsigned form would saturate `vpmaddubsw`), and so does
//! IQ4_NL, whose nibbles index its 16 signed levels with `vpshufb`.

use std::arch::x86_64::*;

use super::{scalar, F32Acts, Kernels, Out, Q8Acts, WTile};
use crate::quant::{QK, QK_K};

mod k;

pub(super) fn kernels() -> Option<Kernels> {
    let ok = is_x86_feature_detected!("avx2")
        && is_x86_feature_detected!("fma")
        && is_x86_feature_detected!("f16c");
    if !ok {
        return None;
    }
    Some(Kernels {
        name: "avx2",
        quantize_q8,
        quantize_q8k,
        q4_0: legacy::<Q4_0>,
        q4_1: legacy::<Q4_1>,
        q5_0: legacy::<Q5_0>,
        q5_1: legacy::<Q5_1>,
        q8_0: legacy::<Q8_0>,
        iq4_nl: legacy::<IQ4_NL>,
        q2_k: k::q2_k,
        q3_k: k::q3_k,
        q4_k: k::q4_k,
        q5_k: k::q5_k,
        q6_k: k::q6_k,
        iq4_xs: k::iq4_xs,
        f32: float::<F32>,
        f16: float::<F16>,
        bf16: float::<BF16>,
        packed_q4_0: super::packed::dot_q4_0,
        packed_q4_1: super::packed::dot_q4_1,
        packed_q8_0: super::packed::dot_q8_0,
        pack_weights: false,
    })
}

// Legacy type tags for the const-generic kernels.
const Q4_0: u8 = 0;
const Q4_1: u8 = 1;
const Q5_0: u8 = 2;
const Q5_1: u8 = 3;
const Q8_0: u8 = 4;
const IQ4_NL: u8 = 5;

/// Whether the type's blocks have signed levels (multiplied with the `abs`/`sign`
/// trick) rather than unsigned codes with an offset term.
const fn signed_levels(t: u8) -> bool {
    t == Q8_0 || t == IQ4_NL
}

/// The IQ4_NL levels in both 128-bit lanes, for `vpshufb` on the nibbles.
#[target_feature(enable = "avx2")]
#[inline]
pub(super) fn iq4nl_table() -> __m256i {
    let t = crate::quant::IQ4NL_VALUES;
    // SAFETY: `IQ4NL_VALUES` holds 16 bytes.
    let lane = unsafe { _mm_loadu_si128(t.as_ptr().cast()) };
    _mm256_set_m128i(lane, lane)
}

/// Bytes per block.
const fn bb(t: u8) -> usize {
    match t {
        Q4_0 | IQ4_NL => 18,
        Q4_1 => 20,
        Q5_0 => 22,
        Q5_1 => 24,
        _ => 34,
    }
}

/// Offset of the packed quants within a block.
const fn qs_off(t: u8) -> usize {
    match t {
        Q4_0 | IQ4_NL => 2,
        Q4_1 => 4,
        Q5_0 => 6,
        Q5_1 => 8,
        _ => 2,
    }
}

/// Raw pointers to one tile's operands (see `avx512::LegacyArgs`).
struct LegacyArgs {
    w: *const u8,
    row_bytes: usize,
    nb: usize,
    qs: *const i8,
    d: *const f32,
    s: *const f32,
    cols: usize,
}

fn legacy<const T: u8>(w: &WTile, a: &Q8Acts, j0: usize, nr: usize, out: &mut Out) {
    w.check(QK, bb(T));
    a.check(w, j0, nr);
    let nb = w.cols / QK;
    let args = LegacyArgs {
        w: w.data.as_ptr(),
        row_bytes: w.row_bytes,
        nb,
        qs: a.qs[j0 * a.cols..].as_ptr(),
        d: a.d[j0 * nb..].as_ptr(),
        s: a.s[j0 * nb..].as_ptr(),
        cols: a.cols,
    };
    macro_rules! go {
        ($m:literal, $n:literal) => {
            // SAFETY: only reachable through the table `kernels()` builds after feature
            // detection; `check` asserted the bounds of every row the kernel reads.
            unsafe { legacy_tile::<T, $m, $n>(&args, out) }
        };
    }
    tile_shapes!(w.rows, nr, go)
}

/// 0xFF in byte `i` where bit `i` of `bits` is set (ggml's `bytes_from_bits_32`).
#[target_feature(enable = "avx2")]
#[inline]
fn bytes_from_bits(bits: u32) -> __m256i {
    let shuf = _mm256_set_epi64x(
        0x0303_0303_0303_0303,
        0x0202_0202_0202_0202,
        0x0101_0101_0101_0101,
        0,
    );
    let bytes = _mm256_shuffle_epi8(_mm256_set1_epi32(bits as i32), shuf);
    let bytes = _mm256_or_si256(bytes, _mm256_set1_epi64x(0x7fbf_dfef_f7fb_fdfe));
    _mm256_cmpeq_epi8(bytes, _mm256_set1_epi64x(-1))
}

/// The block at `p` as 32 codes in element order: unsigned for the 4/5-bit types, the
/// signed levels for Q8_0 and IQ4_NL.
///
/// # Safety
/// One whole block must be readable at `p`.
#[target_feature(enable = "avx2")]
#[inline]
unsafe fn codes<const T: u8>(p: *const u8) -> __m256i {
    // SAFETY: every load stays within the block.
    unsafe {
        if T == Q8_0 {
            return _mm256_loadu_si256(p.add(2).cast());
        }
        let q = _mm_loadu_si128(p.add(qs_off(T)).cast());
        let v = _mm256_and_si256(
            _mm256_set_m128i(_mm_srli_epi16::<4>(q), q),
            _mm256_set1_epi8(0x0F),
        );
        if T == IQ4_NL {
            return _mm256_shuffle_epi8(iq4nl_table(), v);
        }
        if T == Q5_0 || T == Q5_1 {
            let qh = (p.add(qs_off(T) - 4) as *const u32).read_unaligned();
            let high = _mm256_and_si256(bytes_from_bits(qh), _mm256_set1_epi8(0x10));
            return _mm256_or_si256(v, high);
        }
        v
    }
}

/// Integer dot product of 32 codes with 32 activations, in eight `i32` lanes.
#[target_feature(enable = "avx2")]
#[inline]
fn dot32<const T: u8>(w: __m256i, x: __m256i) -> __m256i {
    let p16 = if signed_levels(T) {
        _mm256_maddubs_epi16(_mm256_abs_epi8(w), _mm256_sign_epi8(x, w))
    } else {
        _mm256_maddubs_epi16(w, x)
    };
    _mm256_madd_epi16(p16, _mm256_set1_epi16(1))
}

/// Eight 16-bit halves (the low halves of the `i32` lanes of `v`) as `f16` -> `f32`.
#[target_feature(enable = "avx2,f16c")]
#[inline]
fn low_halves_to_f32(v: __m256i) -> __m256 {
    let lo = _mm256_and_si256(v, _mm256_set1_epi32(0xFFFF));
    let packed = _mm256_packus_epi32(lo, lo);
    let packed = _mm256_permute4x64_epi64::<0b00_00_10_00>(packed);
    _mm256_cvtph_ps(_mm256_castsi256_si128(packed))
}

/// Scales and offsets of the `n` (1..=8) blocks at `p` (lanes from `n` on are zero).
///
/// # Safety
/// The first 4 bytes of each of the `n` blocks must be readable.
#[target_feature(enable = "avx2,f16c")]
#[inline]
unsafe fn scales8<const T: u8>(p: *const u8, n: usize) -> (__m256, __m256) {
    // SAFETY: only the first 4 bytes of blocks 0..n are read.
    let word = |i: usize| unsafe { (p.add(i * bb(T)) as *const i32).read_unaligned() };
    // Eight scalar loads and inserts, not `vpgatherdd`: AMD cores microcode the gather,
    // and in decode it cost more than the quants' own arithmetic.
    let g = if n == 8 {
        _mm256_setr_epi32(
            word(0),
            word(1),
            word(2),
            word(3),
            word(4),
            word(5),
            word(6),
            word(7),
        )
    } else {
        let mut words = [0i32; 8];
        for (i, w) in words.iter_mut().enumerate().take(n) {
            *w = word(i);
        }
        // SAFETY: `words` holds eight i32s.
        unsafe { _mm256_loadu_si256(words.as_ptr().cast()) }
    };
    let d = low_halves_to_f32(g);
    let m = match T {
        Q4_1 | Q5_1 => low_halves_to_f32(_mm256_srli_epi32::<16>(g)),
        Q4_0 => _mm256_mul_ps(d, _mm256_set1_ps(-8.0)),
        Q5_0 => _mm256_mul_ps(d, _mm256_set1_ps(-16.0)),
        _ => _mm256_setzero_ps(),
    };
    (d, m)
}

/// Sum of the eight lanes, in a fixed order.
#[target_feature(enable = "avx")]
#[inline]
pub(super) fn hsum_ps(v: __m256) -> f32 {
    let s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps::<1>(v));
    let s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    _mm_cvtss_f32(_mm_add_ss(s, _mm_movehdup_ps(s)))
}

/// Sum of the eight `i32` lanes.
#[target_feature(enable = "avx2")]
#[inline]
pub(super) fn hsum_epi32(v: __m256i) -> i32 {
    let s = _mm_add_epi32(_mm256_castsi256_si128(v), _mm256_extracti128_si256::<1>(v));
    let s = _mm_add_epi32(s, _mm_unpackhi_epi64(s, s));
    _mm_cvtsi128_si32(_mm_add_epi32(s, _mm_shuffle_epi32::<0b01>(s)))
}

/// # Safety
/// AVX2, FMA and F16C must be available; `a` must describe `M` readable weight rows of
/// `a.nb` blocks and `N` activation rows.
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn legacy_tile<const T: u8, const M: usize, const N: usize>(a: &LegacyArgs, out: &mut Out) {
    let b = bb(T);
    // Request the tile four ahead from DRAM (see the AVX-512 kernel).
    let ahead = a.w.wrapping_add(4 * M * a.row_bytes);
    for off in (0..M * a.row_bytes).step_by(64) {
        _mm_prefetch::<_MM_HINT_T0>(ahead.wrapping_add(off).cast());
    }
    let mut acc = [[_mm256_setzero_ps(); N]; M];
    let lanes = _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7);
    let mut g = 0;
    while g < a.nb {
        let nbg = (a.nb - g).min(8);
        let mask = _mm256_cmpgt_epi32(_mm256_set1_epi32(nbg as i32), lanes);
        // SAFETY (whole block): every pointer stays inside weight row `r` (blocks
        // g..g + nbg) or activation row `j` (their elements, scales and sums).
        unsafe {
            let mut dw = [_mm256_setzero_ps(); M];
            let mut mw = [_mm256_setzero_ps(); M];
            for r in 0..M {
                (dw[r], mw[r]) = scales8::<T>(a.w.add(r * a.row_bytes + g * b), nbg);
            }
            let mut dx = [_mm256_setzero_ps(); N];
            for j in 0..N {
                dx[j] = _mm256_maskload_ps(a.d.add(j * a.nb + g), mask);
                if !signed_levels(T) {
                    let sx = _mm256_maskload_ps(a.s.add(j * a.nb + g), mask);
                    for r in 0..M {
                        acc[r][j] = _mm256_fmadd_ps(mw[r], sx, acc[r][j]);
                    }
                }
            }
            for c in 0..nbg {
                let idx = _mm256_set1_epi32(c as i32);
                let mut wq = [_mm256_setzero_si256(); M];
                let mut dws = [_mm256_setzero_ps(); M];
                for r in 0..M {
                    wq[r] = codes::<T>(a.w.add(r * a.row_bytes + (g + c) * b));
                    dws[r] = _mm256_permutevar8x32_ps(dw[r], idx);
                }
                for j in 0..N {
                    let x = _mm256_loadu_si256(a.qs.add(j * a.cols + (g + c) * QK).cast());
                    let dxs = _mm256_permutevar8x32_ps(dx[j], idx);
                    for r in 0..M {
                        let p = _mm256_cvtepi32_ps(dot32::<T>(wq[r], x));
                        acc[r][j] = _mm256_fmadd_ps(p, _mm256_mul_ps(dws[r], dxs), acc[r][j]);
                    }
                }
            }
        }
        g += 8;
    }
    for r in 0..M {
        for j in 0..N {
            out[r][j] = hsum_ps(acc[r][j]);
        }
    }
}

// Float type tags.
const F32: u8 = 0;
const F16: u8 = 1;
const BF16: u8 = 2;

const fn elem_bytes(t: u8) -> usize {
    if t == F32 {
        4
    } else {
        2
    }
}

fn float<const T: u8>(w: &WTile, a: &F32Acts, j0: usize, nr: usize, out: &mut Out) {
    w.check(1, elem_bytes(T));
    a.check(w, j0, nr);
    let (wp, xp) = (w.data.as_ptr(), a.x[j0 * a.cols..].as_ptr());
    macro_rules! go {
        ($m:literal, $n:literal) => {
            // SAFETY: reachable only after feature detection; `check` asserted bounds.
            unsafe { float_tile::<T, $m, $n>(wp, w.row_bytes, xp, a.cols, out) }
        };
    }
    tile_shapes!(w.rows, nr, go)
}

/// Eight weights at `p` as `f32`.
///
/// # Safety
/// Eight elements must be readable at `p`.
#[target_feature(enable = "avx2,f16c")]
#[inline]
unsafe fn load_w8<const T: u8>(p: *const u8) -> __m256 {
    // SAFETY: the caller guarantees eight elements.
    unsafe {
        match T {
            F32 => _mm256_loadu_ps(p.cast()),
            F16 => _mm256_cvtph_ps(_mm_loadu_si128(p.cast())),
            _ => {
                let h = _mm256_cvtepu16_epi32(_mm_loadu_si128(p.cast()));
                _mm256_castsi256_ps(_mm256_slli_epi32::<16>(h))
            }
        }
    }
}

/// # Safety
/// AVX2, FMA and F16C must be available; `M` rows of `cols` weights at `w` (`row_bytes`
/// apart) and `N` rows of `cols` floats at `x` must be readable.
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn float_tile<const T: u8, const M: usize, const N: usize>(
    w: *const u8,
    row_bytes: usize,
    x: *const f32,
    cols: usize,
    out: &mut Out,
) {
    let es = elem_bytes(T);
    let mut acc = [[_mm256_setzero_ps(); N]; M];
    let mut i = 0;
    while i < cols {
        let n = (cols - i).min(8);
        // SAFETY: elements i..i + n of each row are in bounds; a partial group is first
        // copied into zero-padded buffers so the loads stay in bounds.
        unsafe {
            let mut wv = [_mm256_setzero_ps(); M];
            let mut wbuf = [0u8; 32];
            for r in 0..M {
                let p = w.add(r * row_bytes + i * es);
                wv[r] = if n == 8 {
                    load_w8::<T>(p)
                } else {
                    std::ptr::copy_nonoverlapping(p, wbuf.as_mut_ptr(), n * es);
                    load_w8::<T>(wbuf.as_ptr())
                };
            }
            let mut xbuf = [0f32; 8];
            for j in 0..N {
                let p = x.add(j * cols + i);
                let xv = if n == 8 {
                    _mm256_loadu_ps(p)
                } else {
                    std::ptr::copy_nonoverlapping(p, xbuf.as_mut_ptr(), n);
                    _mm256_loadu_ps(xbuf.as_ptr())
                };
                for r in 0..M {
                    acc[r][j] = _mm256_fmadd_ps(wv[r], xv, acc[r][j]);
                }
            }
        }
        i += 8;
    }
    for r in 0..M {
        for j in 0..N {
            out[r][j] = hsum_ps(acc[r][j]);
        }
    }
}

/// Largest lane.
#[target_feature(enable = "avx")]
#[inline]
fn hmax_ps(v: __m256) -> f32 {
    let s = _mm_max_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps::<1>(v));
    let s = _mm_max_ps(s, _mm_movehl_ps(s, s));
    _mm_cvtss_f32(_mm_max_ss(s, _mm_movehdup_ps(s)))
}

/// Rounds 32 floats times `inv` to bytes at `out` (half to even, like the scalar twin);
/// returns the four `i32` vectors for the sums.
///
/// # Safety
/// 32 floats readable at `x`, 32 bytes writable at `out`.
#[target_feature(enable = "avx2")]
#[inline]
unsafe fn round_store_32(x: *const f32, inv: __m256, out: *mut i8) -> [__m256i; 4] {
    // SAFETY: the caller guarantees 32 elements at both pointers.
    unsafe {
        let q: [__m256i; 4] = std::array::from_fn(|k| {
            _mm256_cvtps_epi32(_mm256_mul_ps(_mm256_loadu_ps(x.add(8 * k)), inv))
        });
        let p01 = _mm256_packs_epi32(q[0], q[1]);
        let p23 = _mm256_packs_epi32(q[2], q[3]);
        let bytes = _mm256_packs_epi16(p01, p23);
        let bytes = _mm256_permutevar8x32_epi32(bytes, _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7));
        _mm256_storeu_si256(out.cast(), bytes);
        q
    }
}

/// Largest magnitude among `n8 * 8` floats at `x`.
///
/// # Safety
/// `n8 * 8` floats readable at `x`.
#[target_feature(enable = "avx2")]
#[inline]
unsafe fn absmax(x: *const f32, n8: usize) -> f32 {
    let sign = _mm256_set1_ps(-0.0);
    let mut m = _mm256_setzero_ps();
    for k in 0..n8 {
        // SAFETY: within the `n8 * 8` floats the caller guarantees.
        m = _mm256_max_ps(
            m,
            _mm256_andnot_ps(sign, unsafe { _mm256_loadu_ps(x.add(8 * k)) }),
        );
    }
    hmax_ps(m)
}

fn quantize_q8(x: &[f32], qs: &mut [i8], d: &mut [f32], s: &mut [f32]) {
    let nb = x.len() / QK;
    assert!(qs.len() >= nb * QK && d.len() >= nb && s.len() >= nb);
    // SAFETY: reachable only after feature detection; lengths asserted above.
    unsafe { quantize_q8_impl(x.as_ptr(), qs.as_mut_ptr(), d, s, nb) }
}

/// # Safety
/// AVX2 must be available; `nb` blocks readable at `x` and writable at `qs`.
#[target_feature(enable = "avx2")]
unsafe fn quantize_q8_impl(x: *const f32, qs: *mut i8, d: &mut [f32], s: &mut [f32], nb: usize) {
    for b in 0..nb {
        // SAFETY: block b is within the `nb` blocks the caller guarantees.
        unsafe {
            let xb = x.add(b * QK);
            let (scale, inv) = scalar::q8_scale(absmax(xb, 4));
            let q = round_store_32(xb, _mm256_set1_ps(inv), qs.add(b * QK));
            let sum = hsum_epi32(_mm256_add_epi32(
                _mm256_add_epi32(q[0], q[1]),
                _mm256_add_epi32(q[2], q[3]),
            ));
            d[b] = scale;
            s[b] = scale * sum as f32;
        }
    }
}

fn quantize_q8k(x: &[f32], qs: &mut [i8], d: &mut [f32], bsums: &mut [i16]) {
    let nb = x.len() / QK_K;
    assert!(qs.len() >= nb * QK_K && d.len() >= nb && bsums.len() >= nb * 16);
    // SAFETY: reachable only after feature detection; lengths asserted above.
    unsafe { quantize_q8k_impl(x.as_ptr(), qs.as_mut_ptr(), d, bsums, nb) }
}

/// # Safety
/// AVX2 must be available; `nb` super-blocks readable at `x` and writable at `qs`.
#[target_feature(enable = "avx2")]
unsafe fn quantize_q8k_impl(
    x: *const f32,
    qs: *mut i8,
    d: &mut [f32],
    bsums: &mut [i16],
    nb: usize,
) {
    for b in 0..nb {
        // SAFETY: super-block b is within the `nb` the caller guarantees.
        unsafe {
            let xb = x.add(b * QK_K);
            let (scale, inv) = scalar::q8_scale(absmax(xb, QK_K / 8));
            let inv = _mm256_set1_ps(inv);
            for c in 0..QK_K / 32 {
                let q = round_store_32(xb.add(32 * c), inv, qs.add(b * QK_K + 32 * c));
                bsums[16 * b + 2 * c] = hsum_epi32(_mm256_add_epi32(q[0], q[1])) as i16;
                bsums[16 * b + 2 * c + 1] = hsum_epi32(_mm256_add_epi32(q[2], q[3])) as i16;
            }
            d[b] = scale;
        }
    }
}
