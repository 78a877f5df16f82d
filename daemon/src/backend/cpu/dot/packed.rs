//! The packed weight layout for Q4_0, Q4_1 and Q8_0, and its scalar kernel (the twin of
//! the AVX-512 one and the fallback of every other table).
//!
//! Weights are packed once at model load (see `cpu::packed`) into groups of
//! `PACK_ROWS` = 16 rows with the rows in the 32-bit lanes of a 512-bit vector, so that
//! one `vpdpbusd` against 4 activation bytes broadcast to every lane advances 16 dot
//! products at once and one FMA scales all 16. The layout takes exactly the GGUF byte
//! count (4-bit codes stay packed two to a byte, scales stay `f16`), so a packed model
//! costs no more memory than the mapped file. A group of `nb` blocks per row is three
//! planes, one after the other:
//!
//! * codes, `code_bytes(ty)` per block: code byte `k` of block `b` of lane (row) `r` is
//!   at `b * code_bytes + code_pos(r, k)`, i.e. 64-byte vector `k / 4` holds bytes
//!   `4(k/4)..4(k/4) + 4` of every row. For the 4-bit types a code byte is the GGUF quant
//!   byte (element `k` in the low nibble, `k + 16` in the high one); for Q8_0 it is the
//!   quant with its sign bit flipped (an unsigned code, `q + 128`).
//! * `d`: the block scales as `f16`, at `d_offset + 2 * (16 * b + r)`.
//! * `m` (Q4_1 only): the block minimums, likewise at `m_offset`.
//!
//! Each weight is `x = d * c + m` with `m = -8d` (Q4_0) or `-128d` (Q8_0), so a dot
//! product is `sum_b (d_b * dx_b) * isum_b + sum_b m_b * sx_b` with `isum_b` the integer
//! dot of codes and activation quants and `sx_b = dx_b * sum(qx_b)`; the two sums are
//! accumulated apart and added at the end, as llama.cpp does. Every kernel evaluates
//! exactly that, in that order, with fused multiply-adds: the SIMD kernel and this one
//! agree bit for bit, and a result does not depend on how many activation rows a call
//! handles.

use half::f16;

use super::{PackedGroup, PackedOut, Q8Acts, PACK_ACTS, PACK_ROWS};
use crate::quant::{GgmlType, QK};

/// Whether `ty` has a packed layout.
pub(crate) fn supported(ty: GgmlType) -> bool {
    matches!(ty, GgmlType::Q4_0 | GgmlType::Q4_1 | GgmlType::Q8_0)
}

/// Bytes of codes per block of a group: 16 rows of 16 (4-bit) or 32 (8-bit) bytes.
pub(crate) fn code_bytes(ty: GgmlType) -> usize {
    match ty {
        GgmlType::Q8_0 => QK * PACK_ROWS,
        _ => QK / 2 * PACK_ROWS,
    }
}

/// Code bytes per row and block (the GGUF quant bytes).
pub(crate) fn row_code_bytes(ty: GgmlType) -> usize {
    code_bytes(ty) / PACK_ROWS
}

/// Position of code byte `k` of lane `r` within a block's codes.
#[inline]
pub(crate) const fn code_pos(r: usize, k: usize) -> usize {
    64 * (k / 4) + 4 * r + k % 4
}

/// Offset of the `d` plane in a group of `nb` blocks.
pub(crate) fn d_offset(ty: GgmlType, nb: usize) -> usize {
    nb * code_bytes(ty)
}

/// Offset of the `m` plane (Q4_1) in a group of `nb` blocks.
pub(crate) fn m_offset(ty: GgmlType, nb: usize) -> usize {
    d_offset(ty, nb) + nb * 2 * PACK_ROWS
}

/// Bytes of a group of `nb` blocks per row: 16 GGUF rows' worth.
pub(crate) fn group_bytes(ty: GgmlType, nb: usize) -> usize {
    nb * PACK_ROWS * ty.block_bytes()
}

#[inline]
fn f16_at(b: &[u8], off: usize) -> f32 {
    f16::from_bits(u16::from_le_bytes([b[off], b[off + 1]])).to_f32()
}

/// Scale and offset of block `b` of lane `r`.
#[inline]
pub(crate) fn scales(ty: GgmlType, g: &PackedGroup, b: usize, r: usize) -> (f32, f32) {
    let i = 2 * (PACK_ROWS * b + r);
    let d = f16_at(g.data, d_offset(ty, g.nb) + i);
    let m = match ty {
        GgmlType::Q4_1 => f16_at(g.data, m_offset(ty, g.nb) + i),
        GgmlType::Q4_0 => d * -8.0,
        _ => d * -128.0,
    };
    (d, m)
}

/// Asserts what a packed kernel reads: a whole group and activation rows
/// `j0..j0 + nr`.
pub(crate) fn check(ty: GgmlType, g: &PackedGroup, a: &Q8Acts, j0: usize, nr: usize) {
    assert_eq!(g.data.len(), group_bytes(ty, g.nb), "packed group size");
    assert_eq!(a.cols, g.nb * QK, "activation width");
    assert!((1..=PACK_ACTS).contains(&nr), "{nr} activation rows");
    assert!(
        a.qs.len() >= (j0 + nr) * a.cols
            && a.d.len() >= (j0 + nr) * g.nb
            && a.s.len() >= (j0 + nr) * g.nb,
        "activation rows {j0}+{nr} out of range"
    );
}

/// The scalar packed kernel (see the module comment for the arithmetic).
pub(crate) fn dot(
    ty: GgmlType,
    g: &PackedGroup,
    a: &Q8Acts,
    j0: usize,
    nr: usize,
    out: &mut PackedOut,
) {
    check(ty, g, a, j0, nr);
    let (nb, cb) = (g.nb, code_bytes(ty));
    for j in 0..nr {
        let (qs, dx, sx) = (a.qs(j0 + j), a.d(j0 + j), a.s(j0 + j));
        for r in 0..PACK_ROWS {
            let (mut acc, mut acc_m) = (0.0f32, 0.0f32);
            for b in 0..nb {
                let codes = &g.data[b * cb..(b + 1) * cb];
                let x = &qs[b * QK..(b + 1) * QK];
                let mut isum = 0i32;
                if ty == GgmlType::Q8_0 {
                    for (k, &xk) in x.iter().enumerate() {
                        isum += codes[code_pos(r, k)] as i32 * xk as i32;
                    }
                } else {
                    for k in 0..QK / 2 {
                        let c = codes[code_pos(r, k)];
                        isum +=
                            (c & 0x0F) as i32 * x[k] as i32 + (c >> 4) as i32 * x[k + 16] as i32;
                    }
                }
                let (d, m) = scales(ty, g, b, r);
                acc = (isum as f32).mul_add(d * dx[b], acc);
                acc_m = m.mul_add(sx[b], acc_m);
            }
            out[j][r] = acc + acc_m;
        }
    }
}

pub(crate) fn dot_q4_0(g: &PackedGroup, a: &Q8Acts, j0: usize, nr: usize, out: &mut PackedOut) {
    dot(GgmlType::Q4_0, g, a, j0, nr, out)
}

pub(crate) fn dot_q4_1(g: &PackedGroup, a: &Q8Acts, j0: usize, nr: usize, out: &mut PackedOut) {
    dot(GgmlType::Q4_1, g, a, j0, nr, out)
}

pub(crate) fn dot_q8_0(g: &PackedGroup, a: &Q8Acts, j0: usize, nr: usize, out: &mut PackedOut) {
    dot(GgmlType::Q8_0, g, a, j0, nr, out)
}
