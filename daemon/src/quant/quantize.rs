//! Reference quantizers: `f32` to each block format, bit for bit as ggml's
//! `quantize_row_*_ref` (with floating-point contraction off, as Rust never contracts).
//!
//! They are deterministic and scalar; they write synthetic model files and test data. The
//! matmul's own activation quantizers live in the CPU backend.

use half::f16;

use super::dequant::check_sizes;
use super::quantize_iq::{quantize_iq4_nl, quantize_iq4_xs};
use super::quantize_k::{
    quantize_q2_k, quantize_q3_k, quantize_q4_k, quantize_q5_k, quantize_q6_k, quantize_q8_k,
};
use super::types::{GgmlType, QK};
use super::QuantError;

/// Encodes `src` as `ty` into `dst`, which must be exactly the encoded size.
pub fn quantize(ty: GgmlType, src: &[f32], dst: &mut [u8]) -> Result<(), QuantError> {
    check_sizes(ty, src.len(), dst.len())?;
    let bb = ty.block_bytes();
    let be = ty.block_elems();
    let blocks = src.chunks_exact(be).zip(dst.chunks_exact_mut(bb));
    match ty {
        GgmlType::F32 => blocks.for_each(|(x, b)| b.copy_from_slice(&x[0].to_le_bytes())),
        GgmlType::F16 => blocks.for_each(|(x, b)| put_f16(b, 0, x[0])),
        GgmlType::BF16 => {
            blocks.for_each(|(x, b)| b.copy_from_slice(&bf16_bits(x[0]).to_le_bytes()))
        }
        GgmlType::Q4_0 => blocks.for_each(|(x, b)| q4_0(x, b)),
        GgmlType::Q4_1 => blocks.for_each(|(x, b)| q4_1(x, b)),
        GgmlType::Q5_0 => blocks.for_each(|(x, b)| q5_0(x, b)),
        GgmlType::Q5_1 => blocks.for_each(|(x, b)| q5_1(x, b)),
        GgmlType::Q8_0 => blocks.for_each(|(x, b)| q8_0(x, b)),
        GgmlType::Q8_1 => blocks.for_each(|(x, b)| q8_1(x, b)),
        GgmlType::Q2_K => blocks.for_each(|(x, b)| quantize_q2_k(x, b)),
        GgmlType::Q3_K => blocks.for_each(|(x, b)| quantize_q3_k(x, b)),
        GgmlType::Q4_K => blocks.for_each(|(x, b)| quantize_q4_k(x, b)),
        GgmlType::Q5_K => blocks.for_each(|(x, b)| quantize_q5_k(x, b)),
        GgmlType::Q6_K => blocks.for_each(|(x, b)| quantize_q6_k(x, b)),
        GgmlType::Q8_K => blocks.for_each(|(x, b)| quantize_q8_k(x, b)),
        GgmlType::IQ4_NL => blocks.for_each(|(x, b)| quantize_iq4_nl(x, b)),
        GgmlType::IQ4_XS => blocks.for_each(|(x, b)| quantize_iq4_xs(x, b)),
    }
    Ok(())
}

/// Writes `v` as a little-endian `f16` (round to nearest even, as ggml) at `off`.
#[inline]
pub(crate) fn put_f16(b: &mut [u8], off: usize, v: f32) {
    b[off..off + 2].copy_from_slice(&f16::from_f32(v).to_bits().to_le_bytes());
}

/// Rounds an `f32` to `f16` and back, as ggml does when it stores then reloads a scale.
#[inline]
pub(crate) fn f16_round(v: f32) -> f32 {
    f16::from_f32(v).to_f32()
}

/// ggml's `GGML_FP32_TO_BF16`: round to nearest even, NaNs forced quiet.
pub(crate) fn bf16_bits(v: f32) -> u16 {
    let u = v.to_bits();
    if (u & 0x7fff_ffff) > 0x7f80_0000 {
        return ((u >> 16) | 64) as u16;
    }
    ((u as u64 + (0x7fff + ((u >> 16) & 1)) as u64) >> 16) as u16
}

/// The element with the largest magnitude (the first one on ties), as ggml finds it.
fn signed_absmax(x: &[f32]) -> f32 {
    let (mut amax, mut max) = (0.0f32, 0.0f32);
    for &v in x {
        if amax < v.abs() {
            amax = v.abs();
            max = v;
        }
    }
    max
}

fn min_max(x: &[f32]) -> (f32, f32) {
    let (mut min, mut max) = (f32::MAX, -f32::MAX);
    for &v in x {
        if v < min {
            min = v;
        }
        if v > max {
            max = v;
        }
    }
    (min, max)
}

fn inverse(d: f32) -> f32 {
    if d != 0.0 {
        1.0 / d
    } else {
        0.0
    }
}

fn q4_0(x: &[f32], b: &mut [u8]) {
    let d = signed_absmax(x) / -8.0;
    let id = inverse(d);
    put_f16(b, 0, d);
    for j in 0..QK / 2 {
        // C's `(int8_t)(v + 8.5f)` truncates toward zero.
        let q0 = ((x[j] * id + 8.5) as i8).min(15) as u8;
        let q1 = ((x[j + QK / 2] * id + 8.5) as i8).min(15) as u8;
        b[2 + j] = q0 | (q1 << 4);
    }
}

fn q4_1(x: &[f32], b: &mut [u8]) {
    let (min, max) = min_max(x);
    let d = (max - min) / 15.0;
    let id = inverse(d);
    put_f16(b, 0, d);
    put_f16(b, 2, min);
    for j in 0..QK / 2 {
        let q0 = (((x[j] - min) * id + 0.5) as i8).min(15) as u8;
        let q1 = (((x[j + QK / 2] - min) * id + 0.5) as i8).min(15) as u8;
        b[4 + j] = q0 | (q1 << 4);
    }
}

/// Packs 5-bit values: low nibbles into `qs`, fifth bits into the 32-bit `qh`.
fn pack_q5(q: impl Fn(usize) -> u8, qh_out: &mut [u8], qs: &mut [u8]) {
    let mut qh = 0u32;
    for (j, out) in qs.iter_mut().enumerate() {
        let (q0, q1) = (q(j), q(j + QK / 2));
        *out = (q0 & 0x0F) | ((q1 & 0x0F) << 4);
        qh |= (((q0 & 0x10) >> 4) as u32) << j;
        qh |= (((q1 & 0x10) >> 4) as u32) << (j + QK / 2);
    }
    qh_out.copy_from_slice(&qh.to_le_bytes());
}

fn q5_0(x: &[f32], b: &mut [u8]) {
    let d = signed_absmax(x) / -16.0;
    let id = inverse(d);
    put_f16(b, 0, d);
    let (qh, qs) = b[2..].split_at_mut(4);
    pack_q5(|j| ((x[j] * id + 16.5) as i8).min(31) as u8, qh, qs);
}

fn q5_1(x: &[f32], b: &mut [u8]) {
    let (min, max) = min_max(x);
    let d = (max - min) / 31.0;
    let id = inverse(d);
    put_f16(b, 0, d);
    put_f16(b, 2, min);
    let (qh, qs) = b[4..].split_at_mut(4);
    // ggml does not clamp here: `(max - min) * id` rounds to at most 31.
    pack_q5(|j| ((x[j] - min) * id + 0.5) as u8, qh, qs);
}

fn q8_0(x: &[f32], b: &mut [u8]) {
    let amax = x.iter().fold(0.0f32, |a, v| a.max(v.abs()));
    let d = amax / 127.0;
    let id = inverse(d);
    put_f16(b, 0, d);
    for (o, &v) in b[2..].iter_mut().zip(x) {
        *o = (v * id).round() as i8 as u8;
    }
}

fn q8_1(x: &[f32], b: &mut [u8]) {
    let amax = x.iter().fold(0.0f32, |a, v| a.max(v.abs()));
    let d = amax / 127.0;
    let id = inverse(d);
    put_f16(b, 0, d);
    let mut sum = 0i32;
    for (o, &v) in b[4..].iter_mut().zip(x) {
        let q = (v * id).round() as i8;
        *o = q as u8;
        sum += q as i32;
    }
    put_f16(b, 2, sum as f32 * d);
}
