//! The AVX-512 wide path for Q4_0, Q4_1 and Q8_0: 16 weight rows in the 16 lanes.
//!
//! Repacking stores, per block, eight 64-byte vectors: vector `s` holds elements
//! `4s..4s + 4` of the block for each of the 16 rows (lane = row), as unsigned codes. One
//! `vpdpbusd` against 4 activation bytes broadcast to every lane then advances 16 dot
//! products at once, and the per-block scaling is one FMA for all 16 rows, so a block
//! costs 8 `vpdpbusd` and 4 float operations per 16 rows and activation row (the tile
//! kernels need about 16 per 2 rows). Repacking costs about as much as running 3 or 4
//! activation rows, so the matmul only takes this path for larger batches.

use std::arch::x86_64::*;

use super::super::{Q8Acts, Repacked, WTile, Wide, WideOut, WIDE_ACTS, WIDE_ROWS};
use crate::quant::QK;

const Q4_0: u8 = 0;
const Q4_1: u8 = 1;
const Q8_0: u8 = 4;

const fn bb(t: u8) -> usize {
    match t {
        Q4_0 => 18,
        Q4_1 => 20,
        _ => 34,
    }
}

const fn qs_off(t: u8) -> usize {
    match t {
        Q4_0 => 2,
        Q4_1 => 4,
        _ => 2,
    }
}

/// Bytes of one repacked block: 8 vectors of 16 rows x 4 codes.
const BLOCK_BYTES: usize = 8 * 64;

pub(super) const WIDE_Q4_0: Wide = Wide {
    repack: repack::<Q4_0>,
    dot,
};
pub(super) const WIDE_Q4_1: Wide = Wide {
    repack: repack::<Q4_1>,
    dot,
};
pub(super) const WIDE_Q8_0: Wide = Wide {
    repack: repack::<Q8_0>,
    dot,
};

fn repack<const T: u8>(w: &WTile, out: &mut Repacked) {
    w.check_up_to(WIDE_ROWS, QK, bb(T));
    let nb = w.cols / QK;
    out.nb = nb;
    out.codes.resize(nb * BLOCK_BYTES, 0);
    out.d.resize(nb * WIDE_ROWS, 0.0);
    out.m.resize(nb * WIDE_ROWS, 0.0);
    assert!(
        w.row_bytes * WIDE_ROWS < i32::MAX as usize,
        "rows too long for 32-bit offsets"
    );
    // SAFETY: only reachable through the table built after feature detection; `check`
    // asserted that the tile's rows are in bounds and the buffers were sized above.
    unsafe { repack_impl::<T>(w, out) }
}

/// Zero bytes standing in for the missing rows of a partial group.
static ZEROS: [u8; 64] = [0; 64];

/// `vpermt2d` indices: dword `j` of the result takes dword `i` of the 16-byte row vector
/// of row `j % 8` from two registers holding rows 0..4 and 4..8 (one per 128-bit lane).
const fn transpose_index(i: usize) -> [i32; 16] {
    let mut idx = [0i32; 16];
    let mut j = 0;
    while j < 16 {
        idx[j] = (((j % 8) / 4) * 16 + (j % 4) * 4 + i) as i32;
        j += 1;
    }
    idx
}

static TRANSPOSE: [[i32; 16]; 4] = [
    transpose_index(0),
    transpose_index(1),
    transpose_index(2),
    transpose_index(3),
];

/// The 16 bytes at `off` of each row as four vectors: vector `i` holds bytes `4i..4i + 4`
/// of every row (lane = row).
///
/// # Safety
/// 16 bytes at `off` must be readable in each of the tile's rows.
#[target_feature(enable = "avx512f,avx512bw,avx512vl")]
#[inline]
unsafe fn transpose16(w: &WTile, off: usize) -> [__m512i; 4] {
    let row = |r: usize| -> *const u8 {
        if r < w.rows {
            w.data.as_ptr().wrapping_add(r * w.row_bytes + off)
        } else {
            ZEROS.as_ptr()
        }
    };
    // SAFETY: 16 bytes at each row pointer (the caller's guarantee, or `ZEROS`).
    unsafe {
        let l = |r: usize| _mm_loadu_si128(row(r).cast());
        let z: [__m512i; 4] = std::array::from_fn(|k| {
            let lo = _mm256_set_m128i(l(4 * k + 1), l(4 * k));
            let hi = _mm256_set_m128i(l(4 * k + 3), l(4 * k + 2));
            _mm512_inserti64x4::<1>(_mm512_castsi256_si512(lo), hi)
        });
        std::array::from_fn(|i| {
            let idx = _mm512_loadu_si512(TRANSPOSE[i].as_ptr().cast());
            let a = _mm512_permutex2var_epi32(z[0], idx, z[1]);
            let b = _mm512_permutex2var_epi32(z[2], idx, z[3]);
            _mm512_mask_blend_epi32(0xFF00, a, b)
        })
    }
}

/// # Safety
/// AVX-512 F/BW/VL must be available; the tile's rows must be in bounds and `out`'s
/// buffers sized for `out.nb` blocks.
#[target_feature(enable = "avx512f,avx512bw,avx512vl")]
unsafe fn repack_impl<const T: u8>(w: &WTile, out: &mut Repacked) {
    // The repack walks 16 rows side by side, which the hardware prefetchers follow
    // poorly when the weights come from DRAM: request the next group (the rows after
    // this tile; past the matrix end this prefetches nothing useful, and a prefetch
    // never faults), a few lines per block so the requests do not pile up.
    let group_lines = (w.rows * w.row_bytes).div_ceil(64);
    let lines_per_block = group_lines.div_ceil(out.nb.max(1));
    let next = w.data.as_ptr().wrapping_add(w.rows * w.row_bytes);
    let m4 = _mm512_set1_epi8(0x0F);
    // Block headers (`d`, and `m` for Q4_1) come from one gather per block: lane r reads
    // row r (rows are at most 16 * row_bytes < 2^31 bytes apart, checked by the caller).
    let rows_mask: __mmask16 = if w.rows >= WIDE_ROWS {
        0xFFFF
    } else {
        (1u16 << w.rows) - 1
    };
    let row_offsets = _mm512_mullo_epi32(
        _mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15),
        _mm512_set1_epi32(w.row_bytes as i32),
    );
    for b in 0..out.nb {
        for line in b * lines_per_block..((b + 1) * lines_per_block).min(group_lines) {
            _mm_prefetch::<_MM_HINT_T0>(next.wrapping_add(64 * line).cast());
        }
        let dst = out.codes[b * BLOCK_BYTES..(b + 1) * BLOCK_BYTES].as_mut_ptr();
        let base = b * bb(T) + qs_off(T);
        // SAFETY: the block's quants are within each row; `dst` has 8 vectors of room.
        unsafe {
            if T == Q8_0 {
                let flip = _mm512_set1_epi8(-128);
                for h in 0..2 {
                    let p = transpose16(w, base + 16 * h);
                    for (i, v) in p.iter().enumerate() {
                        let step = 4 * h + i;
                        _mm512_storeu_si512(dst.add(64 * step).cast(), _mm512_xor_si512(*v, flip));
                    }
                }
            } else {
                let p = transpose16(w, base);
                for (i, v) in p.iter().enumerate() {
                    let lo = _mm512_and_si512(*v, m4);
                    let hi = _mm512_and_si512(_mm512_srli_epi16::<4>(*v), m4);
                    _mm512_storeu_si512(dst.add(64 * i).cast(), lo);
                    _mm512_storeu_si512(dst.add(64 * (4 + i)).cast(), hi);
                }
            }
        }
        // SAFETY: each selected lane reads the first 4 bytes of block b of a tile row.
        unsafe {
            let g = _mm512_mask_i32gather_epi32::<1>(
                _mm512_setzero_si512(),
                rows_mask,
                row_offsets,
                w.data[b * bb(T)..].as_ptr().cast(),
            );
            let d = _mm512_cvtph_ps(_mm512_cvtepi32_epi16(g));
            let m = match T {
                Q4_1 => _mm512_cvtph_ps(_mm512_cvtepi32_epi16(_mm512_srli_epi32::<16>(g))),
                Q4_0 => _mm512_mul_ps(d, _mm512_set1_ps(-8.0)),
                _ => _mm512_mul_ps(d, _mm512_set1_ps(-128.0)),
            };
            _mm512_storeu_ps(out.d[b * WIDE_ROWS..].as_mut_ptr(), d);
            _mm512_storeu_ps(out.m[b * WIDE_ROWS..].as_mut_ptr(), m);
        }
    }
}

fn dot(w: &Repacked, a: &Q8Acts, j0: usize, nr: usize, out: &mut WideOut) {
    let nb = w.nb;
    assert_eq!(a.cols, nb * QK, "activation width");
    assert!((1..=WIDE_ACTS).contains(&nr), "{nr} activation rows");
    assert!(
        a.qs.len() >= (j0 + nr) * a.cols
            && a.d.len() >= (j0 + nr) * nb
            && a.s.len() >= (j0 + nr) * nb
    );
    assert!(
        w.codes.len() >= nb * BLOCK_BYTES
            && w.d.len() >= nb * WIDE_ROWS
            && w.m.len() >= nb * WIDE_ROWS
    );
    macro_rules! go {
        ($n:literal) => {
            // SAFETY: reachable only after feature detection; the asserts above bound
            // every read.
            unsafe { dot_impl::<$n>(w, a, j0, out) }
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

/// # Safety
/// AVX-512 F/VNNI and FMA must be available; `w` must hold `w.nb` repacked blocks and `a`
/// activation rows `j0..j0 + N` of `w.nb` blocks.
#[target_feature(enable = "avx512f,avx512bw,avx512vnni,fma")]
unsafe fn dot_impl<const N: usize>(w: &Repacked, a: &Q8Acts, j0: usize, out: &mut WideOut) {
    let nb = w.nb;
    let mut acc = [_mm512_setzero_ps(); N];
    let qs = a.qs[j0 * a.cols..].as_ptr();
    let (d, s) = (&a.d[j0 * nb..], &a.s[j0 * nb..]);
    for b in 0..nb {
        let mut isum = [_mm512_setzero_si512(); N];
        // SAFETY: block b's 8 vectors and each activation row's 32 bytes of block b are
        // in bounds (the wrapper's asserts).
        unsafe {
            let codes = w.codes.as_ptr().add(b * BLOCK_BYTES);
            for step in 0..8 {
                let wv = _mm512_loadu_si512(codes.add(64 * step).cast());
                for j in 0..N {
                    let x = (qs.add(j * a.cols + b * QK + 4 * step) as *const i32).read_unaligned();
                    isum[j] = _mm512_dpbusd_epi32(isum[j], wv, _mm512_set1_epi32(x));
                }
            }
            let dw = _mm512_loadu_ps(w.d.as_ptr().add(b * WIDE_ROWS));
            let mw = _mm512_loadu_ps(w.m.as_ptr().add(b * WIDE_ROWS));
            for j in 0..N {
                let scale = _mm512_mul_ps(dw, _mm512_set1_ps(d[j * nb + b]));
                acc[j] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(isum[j]), scale, acc[j]);
                acc[j] = _mm512_fmadd_ps(mw, _mm512_set1_ps(s[j * nb + b]), acc[j]);
            }
        }
    }
    for j in 0..N {
        // SAFETY: 16 floats into a 16-float row.
        unsafe { _mm512_storeu_ps(out[j].as_mut_ptr(), acc[j]) };
    }
}
