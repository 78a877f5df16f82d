//! Dequantization: quantized blocks back to `f32`, with ggml's exact arithmetic.
//!
//! These are the scalar reference routines (used for embedding lookups, tests and tools);
//! the matmul kernels never dequantize a whole tensor.

use half::{bf16, f16};

use super::types::{GgmlType, IQ4NL_VALUES, K_SCALE_SIZE, QK, QK_K};
use super::QuantError;

/// Reads the little-endian `f16` at `off`.
#[inline]
pub(crate) fn f16_at(b: &[u8], off: usize) -> f32 {
    f16::from_bits(u16::from_le_bytes([b[off], b[off + 1]])).to_f32()
}

/// Reads the little-endian `f32` at `off`.
#[inline]
pub(crate) fn f32_at(b: &[u8], off: usize) -> f32 {
    f32::from_le_bytes([b[off], b[off + 1], b[off + 2], b[off + 3]])
}

/// Unpacks the 6-bit scale and min of sub-block `j` of a Q4_K / Q5_K super-block
/// (ggml's `get_scale_min_k4`).
#[inline]
pub(crate) fn scale_min_k4(j: usize, q: &[u8]) -> (u8, u8) {
    if j < 4 {
        (q[j] & 63, q[j + 4] & 63)
    } else {
        (
            (q[j + 4] & 0xF) | ((q[j - 4] >> 6) << 4),
            (q[j + 4] >> 4) | ((q[j] >> 6) << 4),
        )
    }
}

/// Checks that `n_elems` elements of `ty` occupy exactly `n_bytes` bytes.
pub(crate) fn check_sizes(ty: GgmlType, n_elems: usize, n_bytes: usize) -> Result<(), QuantError> {
    let expected = ty
        .bytes_for(n_elems as u64)
        .ok_or(QuantError::NotBlockMultiple { ty, elems: n_elems })?;
    if expected != n_bytes as u64 {
        return Err(QuantError::LengthMismatch {
            ty,
            elems: n_elems,
            expected,
            got: n_bytes,
        });
    }
    Ok(())
}

/// Decodes `dst.len()` elements of type `ty` from `src`, which must hold exactly that
/// many elements.
pub fn dequantize(ty: GgmlType, src: &[u8], dst: &mut [f32]) -> Result<(), QuantError> {
    check_sizes(ty, dst.len(), src.len())?;
    let bb = ty.block_bytes();
    let be = ty.block_elems();
    let blocks = src.chunks_exact(bb).zip(dst.chunks_exact_mut(be));
    match ty {
        GgmlType::F32 => blocks.for_each(|(b, y)| y[0] = f32_at(b, 0)),
        GgmlType::F16 => blocks.for_each(|(b, y)| y[0] = f16_at(b, 0)),
        GgmlType::BF16 => blocks
            .for_each(|(b, y)| y[0] = bf16::from_bits(u16::from_le_bytes([b[0], b[1]])).to_f32()),
        GgmlType::Q4_0 => blocks.for_each(|(b, y)| q4_0(b, y)),
        GgmlType::Q4_1 => blocks.for_each(|(b, y)| q4_1(b, y)),
        GgmlType::Q5_0 => blocks.for_each(|(b, y)| q5_0(b, y)),
        GgmlType::Q5_1 => blocks.for_each(|(b, y)| q5_1(b, y)),
        GgmlType::Q8_0 => blocks.for_each(|(b, y)| q8_0(b, y)),
        // Q8_1's `s` is redundant for dequantization.
        GgmlType::Q8_1 => blocks.for_each(|(b, y)| q8_at(b, 4, y)),
        GgmlType::Q2_K => blocks.for_each(|(b, y)| q2_k(b, y)),
        GgmlType::Q3_K => blocks.for_each(|(b, y)| q3_k(b, y)),
        GgmlType::Q4_K => blocks.for_each(|(b, y)| q4_k(b, y)),
        GgmlType::Q5_K => blocks.for_each(|(b, y)| q5_k(b, y)),
        GgmlType::Q6_K => blocks.for_each(|(b, y)| q6_k(b, y)),
        GgmlType::Q8_K => blocks.for_each(|(b, y)| q8_k(b, y)),
        GgmlType::IQ4_NL => blocks.for_each(|(b, y)| iq4_nl(b, y)),
        GgmlType::IQ4_XS => blocks.for_each(|(b, y)| iq4_xs(b, y)),
    }
    Ok(())
}

fn q4_0(b: &[u8], y: &mut [f32]) {
    let d = f16_at(b, 0);
    let qs = &b[2..2 + QK / 2];
    for (j, &q) in qs.iter().enumerate() {
        y[j] = ((q & 0x0F) as i32 - 8) as f32 * d;
        y[j + QK / 2] = ((q >> 4) as i32 - 8) as f32 * d;
    }
}

fn q4_1(b: &[u8], y: &mut [f32]) {
    let (d, m) = (f16_at(b, 0), f16_at(b, 2));
    let qs = &b[4..4 + QK / 2];
    for (j, &q) in qs.iter().enumerate() {
        y[j] = (q & 0x0F) as f32 * d + m;
        y[j + QK / 2] = (q >> 4) as f32 * d + m;
    }
}

/// The fifth bits of a Q5 block's elements `j` and `j + 16`, already shifted to bit 4.
#[inline]
fn q5_high_bits(qh: u32, j: usize) -> (u8, u8) {
    (
        (((qh >> j) << 4) & 0x10) as u8,
        ((qh >> (j + 12)) & 0x10) as u8,
    )
}

fn q5_0(b: &[u8], y: &mut [f32]) {
    let d = f16_at(b, 0);
    let qh = u32::from_le_bytes([b[2], b[3], b[4], b[5]]);
    let qs = &b[6..6 + QK / 2];
    for (j, &q) in qs.iter().enumerate() {
        let (h0, h1) = q5_high_bits(qh, j);
        y[j] = (((q & 0x0F) | h0) as i32 - 16) as f32 * d;
        y[j + QK / 2] = (((q >> 4) | h1) as i32 - 16) as f32 * d;
    }
}

fn q5_1(b: &[u8], y: &mut [f32]) {
    let (d, m) = (f16_at(b, 0), f16_at(b, 2));
    let qh = u32::from_le_bytes([b[4], b[5], b[6], b[7]]);
    let qs = &b[8..8 + QK / 2];
    for (j, &q) in qs.iter().enumerate() {
        let (h0, h1) = q5_high_bits(qh, j);
        y[j] = ((q & 0x0F) | h0) as f32 * d + m;
        y[j + QK / 2] = ((q >> 4) | h1) as f32 * d + m;
    }
}

fn q8_0(b: &[u8], y: &mut [f32]) {
    q8_at(b, 2, y)
}

/// An `f16` scale followed (at `qs_off`) by 32 signed bytes.
fn q8_at(b: &[u8], qs_off: usize, y: &mut [f32]) {
    let d = f16_at(b, 0);
    for (yj, &q) in y.iter_mut().zip(&b[qs_off..qs_off + QK]) {
        *yj = q as i8 as f32 * d;
    }
}

/// The 2-bit level of element `i` of a Q2_K / Q3_K super-block from its `qs` bytes:
/// halves of 128, each 32 bytes holding four elements 32 apart.
#[inline]
pub(crate) fn k_2bit_level(qs: &[u8], i: usize) -> u8 {
    let (half, k) = (i / 128, i % 128);
    (qs[32 * half + k % 32] >> (2 * (k / 32))) & 3
}

/// The signed 6-bit scale of sub-block `j` (of 16) of a Q3_K super-block, offset removed.
#[inline]
pub(crate) fn q3_k_scale(scales: &[u8], j: usize) -> i32 {
    let low = if j < 8 {
        scales[j] & 0xF
    } else {
        scales[j - 8] >> 4
    };
    let high = (scales[8 + j % 4] >> (2 * (j / 4))) & 3;
    (low | (high << 4)) as i32 - 32
}

fn q2_k(b: &[u8], y: &mut [f32]) {
    let scales = &b[..QK_K / 16];
    let qs = &b[QK_K / 16..QK_K / 16 + QK_K / 4];
    let off = QK_K / 16 + QK_K / 4;
    let (d, dmin) = (f16_at(b, off), f16_at(b, off + 2));
    for (j, y) in y.chunks_exact_mut(16).enumerate() {
        let dl = d * (scales[j] & 0xF) as f32;
        let ml = dmin * (scales[j] >> 4) as f32;
        for (l, v) in y.iter_mut().enumerate() {
            *v = dl * k_2bit_level(qs, 16 * j + l) as f32 - ml;
        }
    }
}

fn q3_k(b: &[u8], y: &mut [f32]) {
    let hmask = &b[..QK_K / 8];
    let qs = &b[QK_K / 8..QK_K / 8 + QK_K / 4];
    let sc_off = QK_K / 8 + QK_K / 4;
    let scales = &b[sc_off..sc_off + K_SCALE_SIZE];
    let d = f16_at(b, sc_off + K_SCALE_SIZE);
    for (j, y) in y.chunks_exact_mut(16).enumerate() {
        let dl = d * q3_k_scale(scales, j) as f32;
        for (l, v) in y.iter_mut().enumerate() {
            let i = 16 * j + l;
            let high = (hmask[i % 32] >> (i / 32)) & 1;
            // The third bit set means the level is not shifted down by 4.
            let q = k_2bit_level(qs, i) as i32 - if high != 0 { 0 } else { 4 };
            *v = dl * q as f32;
        }
    }
}

fn q4_k(b: &[u8], y: &mut [f32]) {
    let (d, dmin) = (f16_at(b, 0), f16_at(b, 2));
    let scales = &b[4..4 + K_SCALE_SIZE];
    let qs = &b[4 + K_SCALE_SIZE..4 + K_SCALE_SIZE + QK_K / 2];
    for (c, (q, y)) in qs.chunks_exact(32).zip(y.chunks_exact_mut(64)).enumerate() {
        let (sc1, m1) = scale_min_k4(2 * c, scales);
        let (sc2, m2) = scale_min_k4(2 * c + 1, scales);
        let (d1, m1) = (d * sc1 as f32, dmin * m1 as f32);
        let (d2, m2) = (d * sc2 as f32, dmin * m2 as f32);
        for l in 0..32 {
            y[l] = d1 * (q[l] & 0xF) as f32 - m1;
            y[l + 32] = d2 * (q[l] >> 4) as f32 - m2;
        }
    }
}

fn q5_k(b: &[u8], y: &mut [f32]) {
    let (d, dmin) = (f16_at(b, 0), f16_at(b, 2));
    let scales = &b[4..4 + K_SCALE_SIZE];
    let qh_off = 4 + K_SCALE_SIZE;
    let qh = &b[qh_off..qh_off + QK_K / 8];
    let ql = &b[qh_off + QK_K / 8..qh_off + QK_K / 8 + QK_K / 2];
    for (c, (q, y)) in ql.chunks_exact(32).zip(y.chunks_exact_mut(64)).enumerate() {
        let (sc1, m1) = scale_min_k4(2 * c, scales);
        let (sc2, m2) = scale_min_k4(2 * c + 1, scales);
        let (d1, m1) = (d * sc1 as f32, dmin * m1 as f32);
        let (d2, m2) = (d * sc2 as f32, dmin * m2 as f32);
        let (u1, u2) = (1u8 << (2 * c), 2u8 << (2 * c));
        for l in 0..32 {
            let h1 = if qh[l] & u1 != 0 { 16 } else { 0 };
            let h2 = if qh[l] & u2 != 0 { 16 } else { 0 };
            y[l] = d1 * ((q[l] & 0xF) + h1) as f32 - m1;
            y[l + 32] = d2 * ((q[l] >> 4) + h2) as f32 - m2;
        }
    }
}

fn q6_k(b: &[u8], y: &mut [f32]) {
    let ql = &b[..QK_K / 2];
    let qh = &b[QK_K / 2..QK_K / 2 + QK_K / 4];
    let sc_off = QK_K / 2 + QK_K / 4;
    let sc = &b[sc_off..sc_off + QK_K / 16];
    let d = f16_at(b, sc_off + QK_K / 16);
    for (half, y) in y.chunks_exact_mut(128).enumerate() {
        let ql = &ql[64 * half..];
        let qh = &qh[32 * half..];
        let sc = &sc[8 * half..];
        for l in 0..32 {
            let is = l / 16;
            let q1 = ((ql[l] & 0xF) | ((qh[l] & 3) << 4)) as i32 - 32;
            let q2 = ((ql[l + 32] & 0xF) | (((qh[l] >> 2) & 3) << 4)) as i32 - 32;
            let q3 = ((ql[l] >> 4) | (((qh[l] >> 4) & 3) << 4)) as i32 - 32;
            let q4 = ((ql[l + 32] >> 4) | (((qh[l] >> 6) & 3) << 4)) as i32 - 32;
            // ggml evaluates `d * sc * q` left to right in float.
            y[l] = d * sc[is] as i8 as f32 * q1 as f32;
            y[l + 32] = d * sc[is + 2] as i8 as f32 * q2 as f32;
            y[l + 64] = d * sc[is + 4] as i8 as f32 * q3 as f32;
            y[l + 96] = d * sc[is + 6] as i8 as f32 * q4 as f32;
        }
    }
}

fn q8_k(b: &[u8], y: &mut [f32]) {
    let d = f32_at(b, 0);
    for (yj, &q) in y.iter_mut().zip(&b[4..4 + QK_K]) {
        *yj = d * q as i8 as f32;
    }
}

/// 32 non-linear 4-bit levels: low nibbles are elements 0..16, high nibbles 16..32.
fn iq4_levels(qs: &[u8], dl: f32, y: &mut [f32]) {
    for (j, &q) in qs.iter().enumerate().take(QK / 2) {
        y[j] = dl * IQ4NL_VALUES[(q & 0xF) as usize] as f32;
        y[j + QK / 2] = dl * IQ4NL_VALUES[(q >> 4) as usize] as f32;
    }
}

fn iq4_nl(b: &[u8], y: &mut [f32]) {
    iq4_levels(&b[2..2 + QK / 2], f16_at(b, 0), y);
}

/// The 6-bit scale of sub-block `ib` (of 8) of an IQ4_XS super-block, offset removed.
#[inline]
pub(crate) fn iq4_xs_scale(b: &[u8], ib: usize) -> i32 {
    let scales_h = u16::from_le_bytes([b[2], b[3]]);
    let low = (b[4 + ib / 2] >> (4 * (ib % 2))) & 0xF;
    let high = ((scales_h >> (2 * ib)) & 3) as u8;
    (low | (high << 4)) as i32 - 32
}

fn iq4_xs(b: &[u8], y: &mut [f32]) {
    let d = f16_at(b, 0);
    let qs = &b[8..8 + QK_K / 2];
    for (ib, (q, y)) in qs.chunks_exact(16).zip(y.chunks_exact_mut(QK)).enumerate() {
        iq4_levels(q, d * iq4_xs_scale(b, ib) as f32, y);
    }
}
