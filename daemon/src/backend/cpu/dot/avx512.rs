//! AVX-512 kernels (F, BW, VL, VNNI, VBMI: Ice Lake, Zen 4 and later) for the legacy
//! quant types, the float types and the activation quantizers. K-quants use the AVX2
//! kernels; Q4_0 / Q4_1 / Q8_0 weights packed at load have their own kernel
//! (`packed.rs`).
//!
//! Legacy blocks are decoded into unsigned 8-bit codes `c` with `x = d * c + m` (the
//! signed types get `m = -8d`, `-16d` or `-128d`, Q8_0 by flipping the sign bit), so one
//! `vpdpbusd` (u8 x s8) does the 64 multiply-adds of a block pair. The offset term
//! `sum_b m_b * s_b` (`s_b = d_x * sum(q_x)`, from the activation quantizer) is one FMA
//! per 16 blocks, whose scales are collected with byte permutes rather than a gather.
//!
//! The AVX-512 intrinsics are stable since Rust 1.89, above the workspace's declared
//! `rust-version` (see the `clippy::msrv` on this module's declaration).

use std::arch::x86_64::*;

use super::{avx2, scalar, F32Acts, Kernels, Out, Q8Acts, WTile};
use crate::quant::{GgmlType, QK, QK_K};

mod packed;

pub(super) fn kernels() -> Option<Kernels> {
    let ok = is_x86_feature_detected!("avx512f")
        && is_x86_feature_detected!("avx512bw")
        && is_x86_feature_detected!("avx512vl")
        && is_x86_feature_detected!("avx512vnni")
        && is_x86_feature_detected!("avx512vbmi")
        && is_x86_feature_detected!("bmi2")
        && is_x86_feature_detected!("fma");
    if !ok {
        return None;
    }
    let base = avx2::kernels().unwrap_or(scalar::KERNELS);
    Some(Kernels {
        name: "avx512-vnni",
        quantize_q8,
        quantize_q8k,
        q4_0: legacy::<Q4_0>,
        q4_1: legacy::<Q4_1>,
        q5_0: legacy::<Q5_0>,
        q5_1: legacy::<Q5_1>,
        q8_0: legacy::<Q8_0>,
        f32: float::<F32>,
        f16: float::<F16>,
        bf16: float::<BF16>,
        packed_q4_0: packed::dot_q4_0,
        packed_q4_1: packed::dot_q4_1,
        packed_q8_0: packed::dot_q8_0,
        pack_weights: true,
        ..base
    })
}

// Legacy type tags for the const-generic kernels.
const Q4_0: u8 = 0;
const Q4_1: u8 = 1;
const Q5_0: u8 = 2;
const Q5_1: u8 = 3;
const Q8_0: u8 = 4;

const fn ggml_type(t: u8) -> GgmlType {
    match t {
        Q4_0 => GgmlType::Q4_0,
        Q4_1 => GgmlType::Q4_1,
        Q5_0 => GgmlType::Q5_0,
        Q5_1 => GgmlType::Q5_1,
        _ => GgmlType::Q8_0,
    }
}

/// Bytes per block.
const fn bb(t: u8) -> usize {
    match t {
        Q4_0 => 18,
        Q4_1 => 20,
        Q5_0 => 22,
        Q5_1 => 24,
        _ => 34,
    }
}

/// Raw pointers to one tile's operands, valid for the reads the kernels make (checked by
/// the safe wrappers).
struct LegacyArgs {
    w: *const u8,
    row_bytes: usize,
    /// Blocks per row.
    nb: usize,
    /// Activation row `j0`; rows are `cols` apart, their scales and sums `nb` apart.
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
    debug_assert_eq!(ggml_type(T).block_bytes(), bb(T));
    macro_rules! go {
        ($m:literal, $n:literal) => {
            // SAFETY: this function is only reachable through the table `kernels()`
            // builds after detecting the features; `check` asserted that the tile's
            // rows and activation rows `j0..j0 + nr` are in bounds.
            unsafe { legacy_tile::<T, $m, $n>(&args, out) }
        };
    }
    tile_shapes!(w.rows, nr, go)
}

/// Offset of the packed quants within a block.
const fn qs_off(t: u8) -> usize {
    match t {
        Q4_0 => 2,
        Q4_1 => 4,
        Q5_0 => 6,
        _ => 8,
    }
}

// Register layout of a block pair. A `vpdpbusd` lane sums 4 bytes; lanes alternate
// between the two blocks (lane `l` belongs to block `l % 2`), so the per-block scales of a
// pair are one 64-bit broadcast `[s0, s1, s0, s1, ..]` from memory instead of a permute.
// Byte `p` holds element `e` of block `t` with `t = (p / 4) % 2` and
// `e = 4 * ((p / 8) % 4) + p % 4 + 16 * (p / 32)`: the low half of the register holds
// elements 0..16 of both blocks (the low nibbles of 4-bit quants), the high half 16..32.

/// The pair-layout position of element `e` of block `t`.
const fn pair_pos(t: usize, e: usize) -> usize {
    32 * (e / 16) + 8 * ((e % 16) / 4) + 4 * t + e % 4
}

/// `vpermb` indices from natural order (block 0 then block 1, 32 bytes each) to the pair
/// layout: the activations' permutation.
const fn act_index() -> [u8; 64] {
    let mut idx = [0u8; 64];
    let mut t = 0;
    while t < 2 {
        let mut e = 0;
        while e < 32 {
            idx[pair_pos(t, e)] = (32 * t + e) as u8;
            e += 1;
        }
        t += 1;
    }
    idx
}

/// `vpermb` indices from a 64-byte window at a 4/5-bit block pair to its packed quant
/// bytes in the pair layout (element `e` reads byte `e % 16`; the high half is shifted
/// right by 4 afterwards).
const fn nibble_index(t: u8) -> [u8; 64] {
    let mut idx = [0u8; 64];
    let mut blk = 0;
    while blk < 2 {
        let mut e = 0;
        while e < 32 {
            idx[pair_pos(blk, e)] = (blk * bb(t) + qs_off(t) + e % 16) as u8;
            e += 1;
        }
        blk += 1;
    }
    idx
}

/// `vpermt2b` indices from two 32-byte Q8_0 quant vectors (block 0 in the first source,
/// block 1 in the second, at byte 64) to the pair layout.
const fn q8_index() -> [u8; 64] {
    let mut idx = [0u8; 64];
    let mut t = 0;
    while t < 2 {
        let mut e = 0;
        while e < 32 {
            idx[pair_pos(t, e)] = (64 * t + e) as u8;
            e += 1;
        }
        t += 1;
    }
    idx
}

static ACT_INDEX: [u8; 64] = act_index();
static NIBBLE_INDEX: [[u8; 64]; 4] = [
    nibble_index(Q4_0),
    nibble_index(Q4_1),
    nibble_index(Q5_0),
    nibble_index(Q5_1),
];
static Q8_INDEX: [u8; 64] = q8_index();

/// Bytes of block 0 in the pair layout (for a lone last block).
const BLOCK0_BYTES: __mmask64 = 0x0F0F_0F0F_0F0F_0F0F;

/// Unsigned codes of the block pair at `p` in the pair layout, or of one block (`two` is
/// false) with zeros in block 1's bytes. `avail` is the number of bytes from `p` to the
/// end of the row: loads never go past it.
///
/// # Safety
/// `avail` bytes must be readable at `p`, and they must hold two whole blocks (one when
/// `two` is false).
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vbmi,bmi2")]
#[inline]
unsafe fn codes<const T: u8>(p: *const u8, avail: usize, two: bool) -> __m512i {
    let b = bb(T);
    let lanes = if two { !0 } else { BLOCK0_BYTES };
    // SAFETY: Q8_0 reads the quants of the guaranteed blocks; the other types read a
    // window masked to the `avail` readable bytes (masked-off bytes are not accessed) and
    // the `qh` words of guaranteed blocks.
    unsafe {
        if T == Q8_0 {
            let idx = _mm512_loadu_si512(Q8_INDEX.as_ptr().cast());
            let lo = _mm512_castsi256_si512(_mm256_loadu_si256(p.add(2).cast()));
            let hi = if two {
                _mm512_castsi256_si512(_mm256_loadu_si256(p.add(b + 2).cast()))
            } else {
                lo
            };
            // Flipping the sign bit also turns a missing block 1 into 128s; its
            // activation bytes are zero, so they add nothing.
            let v = _mm512_permutex2var_epi8(lo, idx, hi);
            return _mm512_xor_si512(v, _mm512_set1_epi8(-128));
        }
        // A masked load only at the end of a row: on a cache miss a plain load streams
        // much better.
        let window = if avail >= 64 {
            _mm512_loadu_si512(p.cast())
        } else {
            _mm512_maskz_loadu_epi8((1u64 << avail) - 1, p.cast())
        };
        let idx = _mm512_loadu_si512(NIBBLE_INDEX[T as usize].as_ptr().cast());
        let z = _mm512_maskz_permutexvar_epi8(lanes, idx, window);
        let z = _mm512_srlv_epi64(z, _mm512_set_epi64(4, 4, 4, 4, 0, 0, 0, 0));
        let z = _mm512_and_si512(z, _mm512_set1_epi8(0x0F));
        if T == Q5_0 || T == Q5_1 {
            let qh = qs_off(T) - 4;
            let h0 = (p.add(qh) as *const u32).read_unaligned() as u64;
            let h1 = if two {
                (p.add(b + qh) as *const u32).read_unaligned() as u64
            } else {
                0
            };
            // Element e of block t sits at bit 8 * (e / 4) + 4 * t + e % 4.
            let high = _pdep_u64(h0, 0x0F0F_0F0F_0F0F_0F0F) | _pdep_u64(h1, 0xF0F0_F0F0_F0F0_F0F0);
            return _mm512_mask_add_epi8(z, high, z, _mm512_set1_epi8(16));
        }
        z
    }
}

// Block headers (the first 4 bytes: `d`, and `m` or more quants) of 16 consecutive
// blocks, collected without a gather (microcoded and slow): `vpermt2b` picks them out of
// 128-byte windows of the row, each holding `hdr_per_window` whole headers.

const fn hdr_per_window(t: u8) -> usize {
    (128 - 4) / bb(t) + 1
}

/// `vpermt2b` indices for window `w`: lane `i` (bytes 4i..4i+4) gets header `i` when it
/// lies in this window.
const fn hdr_index(t: u8, w: usize) -> [u8; 64] {
    let mut idx = [0u8; 64];
    let per = hdr_per_window(t);
    let mut i = 0;
    while i < 16 {
        if i / per == w {
            let mut k = 0;
            while k < 4 {
                idx[4 * i + k] = (bb(t) * i + k - w * per * bb(t)) as u8;
                k += 1;
            }
        }
        i += 1;
    }
    idx
}

/// The 32-bit lanes window `w` fills.
const fn hdr_lanes(t: u8, w: usize) -> u16 {
    let per = hdr_per_window(t);
    let mut m = 0u16;
    let mut i = 0;
    while i < 16 {
        if i / per == w {
            m |= 1 << i;
        }
        i += 1;
    }
    m
}

const fn hdr_indices(t: u8) -> [[u8; 64]; 4] {
    [
        hdr_index(t, 0),
        hdr_index(t, 1),
        hdr_index(t, 2),
        hdr_index(t, 3),
    ]
}

static HDR_INDEX: [[[u8; 64]; 4]; 5] = [
    hdr_indices(Q4_0),
    hdr_indices(Q4_1),
    hdr_indices(Q5_0),
    hdr_indices(Q5_1),
    hdr_indices(Q8_0),
];

/// Loads `n` bytes (at most 64) at `p`: a plain load when all 64 are readable.
///
/// # Safety
/// `min(avail, 64)` bytes must be readable at `p`.
#[target_feature(enable = "avx512f,avx512bw")]
#[inline]
unsafe fn load_upto64(p: *const u8, avail: usize) -> __m512i {
    // SAFETY: a plain load only when 64 bytes are readable; a masked one reads `avail`.
    unsafe {
        if avail >= 64 {
            _mm512_loadu_si512(p.cast())
        } else {
            _mm512_maskz_loadu_epi8(_bzhi_u64(!0, avail as u32), p.cast())
        }
    }
}

/// The scales `d` and offsets `m` of the `nbg` (1..=16) blocks at `p`; `avail` bytes of
/// the row are readable from `p`. Lanes from `nbg` on are zero.
///
/// # Safety
/// `avail` bytes must be readable at `p` and hold the `nbg` blocks.
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vbmi,bmi2")]
#[inline]
unsafe fn scales16<const T: u8>(p: *const u8, avail: usize, nbg: usize) -> (__m512, __m512) {
    let per = hdr_per_window(T);
    let mut g = _mm512_setzero_si512();
    let mut w = 0;
    while w * per < nbg {
        let start = w * per * bb(T);
        let left = avail - start;
        // SAFETY: window w starts at a block within the row (w * per < nbg), and the
        // loads are clamped to the `left` readable bytes.
        unsafe {
            let lo = load_upto64(p.add(start), left);
            let hi = if left > 64 {
                load_upto64(p.add(start + 64), left - 64)
            } else {
                _mm512_setzero_si512()
            };
            let idx = _mm512_loadu_si512(HDR_INDEX[T as usize][w].as_ptr().cast());
            let v = _mm512_permutex2var_epi8(lo, idx, hi);
            g = _mm512_mask_mov_epi32(g, hdr_lanes(T, w), v);
        }
        w += 1;
    }
    let valid: __mmask16 = if nbg >= 16 { 0xFFFF } else { (1u16 << nbg) - 1 };
    let g = _mm512_maskz_mov_epi32(valid, g);
    let d = _mm512_cvtph_ps(_mm512_cvtepi32_epi16(g));
    let m = match T {
        Q4_1 | Q5_1 => _mm512_cvtph_ps(_mm512_cvtepi32_epi16(_mm512_srli_epi32::<16>(g))),
        Q4_0 => _mm512_mul_ps(d, _mm512_set1_ps(-8.0)),
        Q5_0 => _mm512_mul_ps(d, _mm512_set1_ps(-16.0)),
        _ => _mm512_mul_ps(d, _mm512_set1_ps(-128.0)),
    };
    (d, m)
}

/// `[v[i], v[i + 1]]` repeated over the register: the scales of block pair `i` in the
/// pair layout, loaded with a 64-bit broadcast.
#[target_feature(enable = "avx512f")]
#[inline]
fn pair_scales(v: &[f32; 16], i: usize) -> __m512 {
    assert!(i + 1 < 16);
    // SAFETY: elements i and i + 1 are in bounds (asserted); an unaligned 8-byte read.
    let pair = unsafe { (v.as_ptr().add(i) as *const f64).read_unaligned() };
    _mm512_castpd_ps(_mm512_set1_pd(pair))
}

/// The tile kernel: `M` weight rows against `N` activation rows.
///
/// # Safety
/// AVX-512 F/BW/VL/VNNI/VBMI, BMI2 and FMA must be available; `a` must describe `M`
/// readable weight rows of `a.nb` blocks and `N` activation rows.
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx512vbmi,bmi2,fma")]
unsafe fn legacy_tile<const T: u8, const M: usize, const N: usize>(a: &LegacyArgs, out: &mut Out) {
    let b = bb(T);
    // Rows are walked a few at a time, which the hardware prefetchers follow poorly
    // from DRAM: request the tile four ahead (a few KB; past the matrix end this
    // prefetches nothing useful, and a prefetch never faults).
    let ahead = a.w.wrapping_add(4 * M * a.row_bytes);
    for off in (0..M * a.row_bytes).step_by(64) {
        _mm_prefetch::<_MM_HINT_T0>(ahead.wrapping_add(off).cast());
    }
    let mut acc = [[_mm512_setzero_ps(); N]; M];
    // SAFETY: a 64-byte static.
    let act_idx = unsafe { _mm512_loadu_si512(ACT_INDEX.as_ptr().cast()) };
    // Per 16-block group: the products of weight and activation block scales, read back
    // two at a time with a 64-bit broadcast.
    let mut sc = [[[0f32; 16]; N]; M];
    let mut g = 0;
    while g < a.nb {
        let nbg = (a.nb - g).min(16);
        let k: __mmask16 = if nbg == 16 { 0xFFFF } else { (1u16 << nbg) - 1 };
        // SAFETY (whole block): every pointer below stays inside weight row `r` (blocks
        // g..g + nbg) or activation row `j` (elements and scales of those blocks).
        unsafe {
            let mut dw = [_mm512_setzero_ps(); M];
            let mut mw = [_mm512_setzero_ps(); M];
            for r in 0..M {
                (dw[r], mw[r]) =
                    scales16::<T>(a.w.add(r * a.row_bytes + g * b), a.row_bytes - g * b, nbg);
            }
            for j in 0..N {
                let dx = _mm512_maskz_loadu_ps(k, a.d.add(j * a.nb + g));
                let sx = _mm512_maskz_loadu_ps(k, a.s.add(j * a.nb + g));
                for r in 0..M {
                    acc[r][j] = _mm512_fmadd_ps(mw[r], sx, acc[r][j]);
                    _mm512_storeu_ps(sc[r][j].as_mut_ptr(), _mm512_mul_ps(dw[r], dx));
                }
            }
            let mut c = 0;
            while c < nbg {
                let two = c + 1 < nbg;
                let mut wq = [_mm512_setzero_si512(); M];
                for r in 0..M {
                    let off = r * a.row_bytes + (g + c) * b;
                    wq[r] = codes::<T>(a.w.add(off), a.row_bytes - (g + c) * b, two);
                }
                for j in 0..N {
                    let xp = a.qs.add(j * a.cols + (g + c) * QK);
                    let x = if two {
                        _mm512_loadu_si512(xp.cast())
                    } else {
                        _mm512_zextsi256_si512(_mm256_loadu_si256(xp.cast()))
                    };
                    let x = _mm512_permutexvar_epi8(act_idx, x);
                    for r in 0..M {
                        let p = _mm512_dpbusd_epi32(_mm512_setzero_si512(), wq[r], x);
                        let scale = pair_scales(&sc[r][j], c);
                        acc[r][j] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(p), scale, acc[r][j]);
                    }
                }
                c += 2;
            }
        }
        g += 16;
    }
    for r in 0..M {
        for j in 0..N {
            out[r][j] = _mm512_reduce_add_ps(acc[r][j]);
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

/// Up to 16 weights at `p` as `f32` (lanes outside `k` are zero).
///
/// # Safety
/// The selected elements must be readable.
#[target_feature(enable = "avx512f,avx512bw,avx512vl")]
#[inline]
unsafe fn load_w16<const T: u8>(p: *const u8, k: __mmask16) -> __m512 {
    // SAFETY: masked loads only touch the selected elements.
    unsafe {
        match T {
            F32 => _mm512_maskz_loadu_ps(k, p.cast()),
            F16 => _mm512_cvtph_ps(_mm256_maskz_loadu_epi16(k, p.cast())),
            _ => {
                let h = _mm256_maskz_loadu_epi16(k, p.cast());
                _mm512_castsi512_ps(_mm512_slli_epi32::<16>(_mm512_cvtepu16_epi32(h)))
            }
        }
    }
}

/// # Safety
/// AVX-512 F/BW/VL and FMA must be available; `M` rows of `cols` weights at `w`
/// (`row_bytes` apart) and `N` rows of `cols` floats at `x` must be readable.
#[target_feature(enable = "avx512f,avx512bw,avx512vl,fma")]
unsafe fn float_tile<const T: u8, const M: usize, const N: usize>(
    w: *const u8,
    row_bytes: usize,
    x: *const f32,
    cols: usize,
    out: &mut Out,
) {
    let es = elem_bytes(T);
    let mut acc = [[_mm512_setzero_ps(); N]; M];
    let mut i = 0;
    while i < cols {
        let k: __mmask16 = if cols - i >= 16 {
            0xFFFF
        } else {
            (1u16 << (cols - i)) - 1
        };
        // SAFETY: elements i..i + 16 (masked to the row) of each row are in bounds.
        unsafe {
            let mut wv = [_mm512_setzero_ps(); M];
            for r in 0..M {
                wv[r] = load_w16::<T>(w.add(r * row_bytes + i * es), k);
            }
            for j in 0..N {
                let xv = _mm512_maskz_loadu_ps(k, x.add(j * cols + i));
                for r in 0..M {
                    acc[r][j] = _mm512_fmadd_ps(wv[r], xv, acc[r][j]);
                }
            }
        }
        i += 16;
    }
    for r in 0..M {
        for j in 0..N {
            out[r][j] = _mm512_reduce_add_ps(acc[r][j]);
        }
    }
}

fn quantize_q8(x: &[f32], qs: &mut [i8], d: &mut [f32], s: &mut [f32]) {
    let nb = x.len() / QK;
    assert!(qs.len() >= nb * QK && d.len() >= nb && s.len() >= nb);
    // SAFETY: reachable only after feature detection; lengths asserted above.
    unsafe { quantize_q8_impl(x.as_ptr(), qs.as_mut_ptr(), d, s, nb) }
}

/// # Safety
/// AVX-512 F must be available; `nb` blocks readable at `x`, writable at `qs`, and
/// `d`, `s` at least `nb` long.
#[target_feature(enable = "avx512f")]
unsafe fn quantize_q8_impl(x: *const f32, qs: *mut i8, d: &mut [f32], s: &mut [f32], nb: usize) {
    for b in 0..nb {
        // SAFETY: block b is within the `nb` blocks the caller guarantees.
        unsafe {
            let v0 = _mm512_loadu_ps(x.add(b * QK));
            let v1 = _mm512_loadu_ps(x.add(b * QK + 16));
            let amax = _mm512_reduce_max_ps(_mm512_max_ps(_mm512_abs_ps(v0), _mm512_abs_ps(v1)));
            let (scale, inv) = scalar::q8_scale(amax);
            let inv = _mm512_set1_ps(inv);
            let q0 = _mm512_cvtps_epi32(_mm512_mul_ps(v0, inv));
            let q1 = _mm512_cvtps_epi32(_mm512_mul_ps(v1, inv));
            _mm_storeu_si128(qs.add(b * QK).cast(), _mm512_cvtepi32_epi8(q0));
            _mm_storeu_si128(qs.add(b * QK + 16).cast(), _mm512_cvtepi32_epi8(q1));
            let sum = _mm512_reduce_add_epi32(_mm512_add_epi32(q0, q1));
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
/// AVX-512 F must be available; `nb` super-blocks readable at `x`, writable at `qs`,
/// `d` at least `nb` and `bsums` at least `16 * nb` long.
#[target_feature(enable = "avx512f")]
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
            let mut m = _mm512_setzero_ps();
            for i in 0..16 {
                m = _mm512_max_ps(m, _mm512_abs_ps(_mm512_loadu_ps(xb.add(16 * i))));
            }
            let (scale, inv) = scalar::q8_scale(_mm512_reduce_max_ps(m));
            let inv = _mm512_set1_ps(inv);
            for i in 0..16 {
                let q = _mm512_cvtps_epi32(_mm512_mul_ps(_mm512_loadu_ps(xb.add(16 * i)), inv));
                _mm_storeu_si128(qs.add(b * QK_K + 16 * i).cast(), _mm512_cvtepi32_epi8(q));
                bsums[16 * b + i] = _mm512_reduce_add_epi32(q) as i16;
            }
            d[b] = scale;
        }
    }
}
