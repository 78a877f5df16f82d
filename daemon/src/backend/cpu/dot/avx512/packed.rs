//! The AVX-512 kernel over packed Q4_0, Q4_1 and Q8_0 weights: 16 weight rows in the 16
//! lanes (the layout and the arithmetic are described in `dot/packed.rs`, whose scalar
//! kernel this one matches bit for bit).
//!
//! Per block and 16 rows the 4-bit types load 4 code vectors and split each into low and
//! high nibbles with a shift and a mask (Q8_0 loads 8 vectors as they are), then run one
//! `vpdpbusd` per vector and activation row against 4 activation bytes broadcast to every
//! lane; the 16 block scales are one `vcvtph2ps`, and the scaling two FMAs. That is a
//! fraction of the work of the GGUF-layout tile kernels, which must gather each row's
//! bytes and reduce across lanes, so it is the better kernel at every batch size: at one
//! activation row it runs at memory bandwidth, at eight it is still far from compute
//! bound.

use std::arch::x86_64::*;

use super::super::packed::{self as layout, check, code_bytes, d_offset, m_offset};
use super::super::{PackedGroup, PackedOut, Q8Acts, PACK_ROWS};
use crate::quant::{GgmlType, QK};

// Type tags for the const-generic kernel.
const Q4_0: u8 = 0;
const Q4_1: u8 = 1;
const Q8_0: u8 = 4;

const fn ggml_type(t: u8) -> GgmlType {
    match t {
        Q4_0 => GgmlType::Q4_0,
        Q4_1 => GgmlType::Q4_1,
        _ => GgmlType::Q8_0,
    }
}

pub(super) fn dot_q4_0(g: &PackedGroup, a: &Q8Acts, j0: usize, nr: usize, out: &mut PackedOut) {
    dot::<Q4_0>(g, a, j0, nr, out)
}

pub(super) fn dot_q4_1(g: &PackedGroup, a: &Q8Acts, j0: usize, nr: usize, out: &mut PackedOut) {
    dot::<Q4_1>(g, a, j0, nr, out)
}

pub(super) fn dot_q8_0(g: &PackedGroup, a: &Q8Acts, j0: usize, nr: usize, out: &mut PackedOut) {
    dot::<Q8_0>(g, a, j0, nr, out)
}

fn dot<const T: u8>(g: &PackedGroup, a: &Q8Acts, j0: usize, nr: usize, out: &mut PackedOut) {
    check(ggml_type(T), g, a, j0, nr);
    debug_assert!(layout::supported(ggml_type(T)));
    macro_rules! go {
        ($n:literal) => {
            // SAFETY: reachable only through the table `avx512::kernels()` builds after
            // detecting the features; `check` asserted the group's size and that
            // activation rows `j0..j0 + nr` are in bounds.
            unsafe { dot_impl::<T, $n>(g, a, j0, out) }
        };
    }
    match nr {
        1 => go!(1),
        2 => go!(2),
        3 => go!(3),
        4 => go!(4),
        5 => go!(5),
        6 => go!(6),
        7 => go!(7),
        _ => go!(8),
    }
}

/// Independent integer accumulators per activation row: with few rows one chain of
/// `vpdpbusd` per block would be latency bound (each waits for the previous one); with
/// many, the rows already give enough independent chains and registers run short.
const fn chains(n: usize) -> usize {
    match n {
        1 => 4,
        2..=4 => 2,
        _ => 1,
    }
}

/// # Safety
/// AVX-512 F/BW/VNNI and FMA must be available; `g` must be a whole packed group of
/// `g.nb` blocks and `a` must hold activation rows `j0..j0 + N` of `g.nb` blocks.
#[target_feature(enable = "avx512f,avx512bw,avx512vnni,fma")]
unsafe fn dot_impl<const T: u8, const N: usize>(
    g: &PackedGroup,
    a: &Q8Acts,
    j0: usize,
    out: &mut PackedOut,
) {
    let ty = ggml_type(T);
    let (nb, cb) = (g.nb, code_bytes(ty));
    let base = g.data.as_ptr();
    let dp = base.wrapping_add(d_offset(ty, nb));
    let mp = base.wrapping_add(m_offset(ty, nb));
    let qs = a.qs[j0 * a.cols..].as_ptr();
    let (dx, sx) = (&a.d[j0 * nb..], &a.s[j0 * nb..]);
    let m4 = _mm512_set1_epi8(0x0F);
    let mut acc = [_mm512_setzero_ps(); N];
    let mut acc_m = [_mm512_setzero_ps(); N];
    let c = chains(N);
    // Hardware prefetchers follow the group's three planes poorly from DRAM: request the
    // next group (the one after in memory; past the matrix end this prefetches nothing
    // useful, and a prefetch never faults) a few lines per block, so the requests do not
    // pile up. Only on the first call for a group: later ones find it in cache.
    let next = base.wrapping_add(g.data.len());
    let lines = if j0 == 0 {
        g.data.len().div_ceil(64)
    } else {
        0
    };
    let lines_per_block = lines.div_ceil(nb.max(1));
    for b in 0..nb {
        for line in b * lines_per_block..((b + 1) * lines_per_block).min(lines) {
            _mm_prefetch::<_MM_HINT_T0>(next.wrapping_add(64 * line).cast());
        }
        let mut isum = [[_mm512_setzero_si512(); 4]; N];
        // SAFETY: block b's codes (`cb` bytes at `b * cb`) and scales (32 bytes at
        // `2 * 16 * b` in each plane) lie inside the group, whose size `check` asserted;
        // each activation row has the 32 quants of block b (also asserted).
        unsafe {
            let codes = base.add(b * cb);
            let x = |j: usize, k: usize| {
                let p = qs.add(j * a.cols + b * QK + k) as *const i32;
                _mm512_set1_epi32(p.read_unaligned())
            };
            if T == Q8_0 {
                for v in 0..8 {
                    let wv = _mm512_loadu_si512(codes.add(64 * v).cast());
                    for j in 0..N {
                        let s = &mut isum[j][v % c];
                        *s = _mm512_dpbusd_epi32(*s, wv, x(j, 4 * v));
                    }
                }
            } else {
                for v in 0..4 {
                    let raw = _mm512_loadu_si512(codes.add(64 * v).cast());
                    let lo = _mm512_and_si512(raw, m4);
                    let hi = _mm512_and_si512(_mm512_srli_epi16::<4>(raw), m4);
                    for j in 0..N {
                        let s = &mut isum[j][v % c];
                        *s = _mm512_dpbusd_epi32(*s, lo, x(j, 4 * v));
                        *s = _mm512_dpbusd_epi32(*s, hi, x(j, 16 + 4 * v));
                    }
                }
            }
            let d = _mm512_cvtph_ps(_mm256_loadu_si256(dp.add(2 * PACK_ROWS * b).cast()));
            for j in 0..N {
                // Integer sums are exact in any grouping: the result is the same bits.
                let mut total = isum[j][0];
                for part in &isum[j][1..c] {
                    total = _mm512_add_epi32(total, *part);
                }
                let scale = _mm512_mul_ps(d, _mm512_set1_ps(dx[j * nb + b]));
                acc[j] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(total), scale, acc[j]);
            }
        }
    }
    // The offset terms in a second pass over the (cached) scales: in the loop above
    // their accumulators would not fit in the registers with many activation rows.
    // The same operations in the same order per row, so the same bits.
    for b in 0..nb {
        // SAFETY: block b's scales lie inside the group (as above).
        unsafe {
            let d = _mm512_cvtph_ps(_mm256_loadu_si256(dp.add(2 * PACK_ROWS * b).cast()));
            let m = match T {
                Q4_1 => _mm512_cvtph_ps(_mm256_loadu_si256(mp.add(2 * PACK_ROWS * b).cast())),
                Q4_0 => _mm512_mul_ps(d, _mm512_set1_ps(-8.0)),
                _ => _mm512_mul_ps(d, _mm512_set1_ps(-128.0)),
            };
            for j in 0..N {
                acc_m[j] = _mm512_fmadd_ps(m, _mm512_set1_ps(sx[j * nb + b]), acc_m[j]);
            }
        }
    }
    for j in 0..N {
        // SAFETY: 16 floats into a 16-float row.
        unsafe { _mm512_storeu_ps(out[j].as_mut_ptr(), _mm512_add_ps(acc[j], acc_m[j])) };
    }
}
