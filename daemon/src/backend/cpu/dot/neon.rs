//! NEON kernels: every weight type and the activation quantizers (K-quants in `k.rs`,
//! Q2_K, Q3_K and IQ4_XS in `k2.rs`), in two tables: `neon` for baseline AArch64 and
//! `neon-dotprod` for cores with the dot-product extension (`sdot`: Grace's Neoverse V2
//! and every Armv8.4+ core).
//!
//! Legacy blocks are decoded to signed 8-bit levels (`x = d * q + m`) and multiplied with
//! the activations into four exact 32-bit lanes (`IntDot`: `smull`/`smlal` and pairwise
//! widening, or `sdot`, which does the same 16 products in one instruction); the
//! per-block scaling is a vector FMA over those lanes. IQ4_NL is one of them: its nibbles
//! index its 16 signed levels with `tbl`.

use std::arch::aarch64::*;

use super::{scalar, F32Acts, Kernels, Out, Q8Acts, WTile};
use crate::quant::{QK, QK_K};

/// The entry points of a K-quant kernel module (`k`, `k2`): `kquant::<T>` on baseline
/// NEON and `kquant_sdot::<T>` on `sdot`, each checking the tile's shape against the
/// module's super-block size `bb(T)` and entering the module's `tile_with::<D, T>` with
/// the target features it needs. One copy, so the two modules' `unsafe` entries are the
/// same audited code.
macro_rules! kquant_entry_points {
    () => {
        /// The kernel for type `T` on baseline NEON.
        pub(super) fn kquant<const T: u8>(
            w: &WTile,
            a: &Q8KActs,
            j0: usize,
            nr: usize,
            out: &mut Out,
        ) {
            w.check(QK_K, bb(T));
            // SAFETY: NEON is part of the AArch64 baseline and detected before the table
            // is built.
            unsafe { tile::<T>(w, a, j0, nr, out) }
        }

        /// `kquant` with the integer products on `sdot`.
        pub(super) fn kquant_sdot<const T: u8>(
            w: &WTile,
            a: &Q8KActs,
            j0: usize,
            nr: usize,
            out: &mut Out,
        ) {
            w.check(QK_K, bb(T));
            // SAFETY: `dotprod` is detected before the table is built.
            unsafe { tile_sdot::<T>(w, a, j0, nr, out) }
        }

        /// # Safety
        /// NEON must be available.
        #[target_feature(enable = "neon")]
        unsafe fn tile<const T: u8>(w: &WTile, a: &Q8KActs, j0: usize, nr: usize, out: &mut Out) {
            tile_with::<Widening, T>(w, a, j0, nr, out)
        }

        /// # Safety
        /// The CPU must have the dot-product extension.
        #[target_feature(enable = "neon,dotprod")]
        unsafe fn tile_sdot<const T: u8>(
            w: &WTile,
            a: &Q8KActs,
            j0: usize,
            nr: usize,
            out: &mut Out,
        ) {
            tile_with::<Sdot, T>(w, a, j0, nr, out)
        }
    };
}

mod k;
mod k2;

pub(super) fn kernels() -> Option<Kernels> {
    if !std::arch::is_aarch64_feature_detected!("neon") {
        return None;
    }
    Some(Kernels {
        name: "neon",
        quantize_q8,
        quantize_q8k,
        q4_0: legacy::<Q4_0>,
        q4_1: legacy::<Q4_1>,
        q5_0: legacy::<Q5_0>,
        q5_1: legacy::<Q5_1>,
        q8_0: legacy::<Q8_0>,
        iq4_nl: legacy::<IQ4_NL>,
        f32: float::<F32>,
        f16: float::<F16>,
        bf16: float::<BF16>,
        q2_k: k2::kquant::<{ k2::Q2K }>,
        q3_k: k2::kquant::<{ k2::Q3K }>,
        q4_k: k::kquant::<{ k::Q4K }>,
        q5_k: k::kquant::<{ k::Q5K }>,
        q6_k: k::kquant::<{ k::Q6K }>,
        iq4_xs: k2::kquant::<{ k2::IQ4XS }>,
        ..scalar::KERNELS
    })
}

/// The `neon` table with its integer dot products on `sdot`.
pub(super) fn kernels_dotprod() -> Option<Kernels> {
    if !std::arch::is_aarch64_feature_detected!("dotprod") {
        return None;
    }
    Some(Kernels {
        name: "neon-dotprod",
        q4_0: legacy_sdot::<Q4_0>,
        q4_1: legacy_sdot::<Q4_1>,
        q5_0: legacy_sdot::<Q5_0>,
        q5_1: legacy_sdot::<Q5_1>,
        q8_0: legacy_sdot::<Q8_0>,
        iq4_nl: legacy_sdot::<IQ4_NL>,
        q2_k: k2::kquant_sdot::<{ k2::Q2K }>,
        q3_k: k2::kquant_sdot::<{ k2::Q3K }>,
        q4_k: k::kquant_sdot::<{ k::Q4K }>,
        q5_k: k::kquant_sdot::<{ k::Q5K }>,
        q6_k: k::kquant_sdot::<{ k::Q6K }>,
        iq4_xs: k2::kquant_sdot::<{ k2::IQ4XS }>,
        ..kernels()?
    })
}

/// How 16 signed 8-bit products are summed, exactly, into four 32-bit lanes. Which
/// products land in which lane differs between the two; every kernel sums the lanes.
pub(super) trait IntDot {
    /// `acc` plus the products of `w` and `x`, where two products fit an `i16`
    /// (`|w * x| <= 128 * 127`).
    fn dot_acc(acc: int32x4_t, w: int8x16_t, x: int8x16_t) -> int32x4_t;
}

/// Baseline NEON: `smull`/`smlal` into 16-bit pairs, widened pairwise.
pub(super) struct Widening;

impl IntDot for Widening {
    #[inline(always)]
    fn dot_acc(acc: int32x4_t, w: int8x16_t, x: int8x16_t) -> int32x4_t {
        // SAFETY: NEON is part of the AArch64 baseline.
        unsafe {
            let p = vmlal_high_s8(vmull_s8(vget_low_s8(w), vget_low_s8(x)), w, x);
            vpadalq_s16(acc, p)
        }
    }
}

/// The dot-product extension: lane `i` gains the four products of bytes `4i..4i + 4`.
pub(super) struct Sdot;

impl IntDot for Sdot {
    #[inline(always)]
    fn dot_acc(mut acc: int32x4_t, w: int8x16_t, x: int8x16_t) -> int32x4_t {
        // SAFETY: a register-only instruction, reached only through the tables that
        // `kernels_dotprod` builds where the CPU has it. `sdot` has no stable intrinsic
        // yet; the directive lets the assembler take it inside functions that the
        // compiler builds for baseline AArch64 (the generic bodies below).
        unsafe {
            std::arch::asm!(
                ".arch_extension dotprod",
                "sdot {acc:v}.4s, {w:v}.16b, {x:v}.16b",
                acc = inout(vreg) acc,
                w = in(vreg) w,
                x = in(vreg) x,
                options(pure, nomem, nostack),
            );
        }
        acc
    }
}

// Legacy type tags for the const-generic kernels.
const Q4_0: u8 = 0;
const Q4_1: u8 = 1;
const Q5_0: u8 = 2;
const Q5_1: u8 = 3;
const Q8_0: u8 = 4;
const IQ4_NL: u8 = 5;

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

/// Whether the type has a stored offset `m` (the others' levels are made signed).
const fn has_m(t: u8) -> bool {
    t == Q4_1 || t == Q5_1
}

/// Eight f16 values as f32 (exactly), in two halves of four.
#[target_feature(enable = "neon")]
#[inline]
fn halves_to_f32(bits: [u16; 8]) -> ([f32; 4], [f32; 4]) {
    let (mut lo, mut hi) = ([0f32; 4], [0f32; 4]);
    // SAFETY: 8 halves read and 4 + 4 floats written, all local arrays.
    unsafe {
        let h = vld1q_u16(bits.as_ptr());
        let (l, u): (float32x4_t, float32x4_t);
        // `fcvtl` (half to single, baseline AdvSIMD) has no stable intrinsic: the f16
        // vector type is still unstable.
        std::arch::asm!(
            "fcvtl {l:v}.4s, {h:v}.4h",
            "fcvtl2 {u:v}.4s, {h:v}.8h",
            l = out(vreg) l,
            u = out(vreg) u,
            h = in(vreg) h,
            options(pure, nomem, nostack),
        );
        vst1q_f32(lo.as_mut_ptr(), l);
        vst1q_f32(hi.as_mut_ptr(), u);
    }
    (lo, hi)
}

/// Raw pointers to one tile's operands (see `avx512::LegacyArgs`).
struct LegacyArgs<'a> {
    w: &'a [u8],
    row_bytes: usize,
    nb: usize,
    qs: *const i8,
    d: &'a [f32],
    s: &'a [f32],
    cols: usize,
}

fn legacy<const T: u8>(w: &WTile, a: &Q8Acts, j0: usize, nr: usize, out: &mut Out) {
    let args = legacy_args::<T>(w, a, j0, nr);
    macro_rules! go {
        ($m:literal, $n:literal) => {
            // SAFETY: NEON is detected before the table is built (and is part of the
            // AArch64 baseline); `legacy_args` asserted the bounds of the activation
            // rows the kernel reads through `qs`.
            unsafe { legacy_tile::<T, $m, $n>(&args, out) }
        };
    }
    tile_shapes!(w.rows, nr, go)
}

fn legacy_sdot<const T: u8>(w: &WTile, a: &Q8Acts, j0: usize, nr: usize, out: &mut Out) {
    let args = legacy_args::<T>(w, a, j0, nr);
    macro_rules! go {
        ($m:literal, $n:literal) => {
            // SAFETY: `dotprod` is detected before the table is built; `legacy_args`
            // asserted the bounds of the activation rows the kernel reads through `qs`.
            unsafe { legacy_tile_sdot::<T, $m, $n>(&args, out) }
        };
    }
    tile_shapes!(w.rows, nr, go)
}

/// The tile's operands, after asserting the layout the kernels read through `qs`.
fn legacy_args<'a, const T: u8>(
    w: &WTile<'a>,
    a: &Q8Acts<'a>,
    j0: usize,
    nr: usize,
) -> LegacyArgs<'a> {
    w.check(QK, bb(T));
    a.check(w, j0, nr);
    let nb = w.cols / QK;
    LegacyArgs {
        w: w.data,
        row_bytes: w.row_bytes,
        nb,
        qs: a.qs[j0 * a.cols..].as_ptr(),
        d: &a.d[j0 * nb..],
        s: &a.s[j0 * nb..],
        cols: a.cols,
    }
}

/// 0xFF in byte `i` where bit `i` of the 16-bit `bits` is set.
#[target_feature(enable = "neon")]
#[inline]
fn bytes_from_bits16(bits: u32) -> uint8x16_t {
    const BIT: [u8; 16] = [1, 2, 4, 8, 16, 32, 64, 128, 1, 2, 4, 8, 16, 32, 64, 128];
    let v = vcombine_u8(vdup_n_u8(bits as u8), vdup_n_u8((bits >> 8) as u8));
    // SAFETY: a 16-byte constant.
    vtstq_u8(v, unsafe { vld1q_u8(BIT.as_ptr()) })
}

/// The IQ4_NL levels, for `tbl` on the nibbles (IQ4_NL and IQ4_XS).
#[target_feature(enable = "neon")]
#[inline]
pub(super) fn iq4nl_table() -> int8x16_t {
    // SAFETY: `IQ4NL_VALUES` holds 16 bytes.
    unsafe { vld1q_s8(crate::quant::IQ4NL_VALUES.as_ptr()) }
}

/// The signed levels of one block: elements 0..16 and 16..32.
#[target_feature(enable = "neon")]
#[inline]
fn levels<const T: u8>(blk: &[u8]) -> (int8x16_t, int8x16_t) {
    assert!(blk.len() >= bb(T));
    // SAFETY: every load reads 16 bytes within the block (asserted above).
    unsafe {
        if T == Q8_0 {
            let p = blk.as_ptr().add(2).cast::<i8>();
            return (vld1q_s8(p), vld1q_s8(p.add(16)));
        }
        let qs_off = match T {
            Q4_0 | IQ4_NL => 2,
            Q4_1 => 4,
            Q5_0 => 6,
            _ => 8,
        };
        let q = vld1q_u8(blk.as_ptr().add(qs_off));
        let mut lo = vandq_u8(q, vdupq_n_u8(0x0F));
        let mut hi = vshrq_n_u8::<4>(q);
        if T == IQ4_NL {
            // Nibbles are below 16, so no index falls outside the table.
            let t = iq4nl_table();
            return (vqtbl1q_s8(t, lo), vqtbl1q_s8(t, hi));
        }
        if T == Q5_0 || T == Q5_1 {
            let o = qs_off - 4;
            let qh = u32::from_le_bytes([blk[o], blk[o + 1], blk[o + 2], blk[o + 3]]);
            let sixteen = vdupq_n_u8(0x10);
            lo = vorrq_u8(lo, vandq_u8(bytes_from_bits16(qh), sixteen));
            hi = vorrq_u8(hi, vandq_u8(bytes_from_bits16(qh >> 16), sixteen));
        }
        let off = match T {
            Q4_0 => 8,
            Q5_0 => 16,
            _ => 0,
        };
        let off = vdupq_n_s8(off);
        (
            vsubq_s8(vreinterpretq_s8_u8(lo), off),
            vsubq_s8(vreinterpretq_s8_u8(hi), off),
        )
    }
}

/// Exact dot product of 32 levels with 32 activations, in four 32-bit lanes.
#[target_feature(enable = "neon")]
#[inline]
fn dot32<D: IntDot>(w: (int8x16_t, int8x16_t), x: (int8x16_t, int8x16_t)) -> int32x4_t {
    // |level * x| <= 128 * 127, as `IntDot` needs.
    D::dot_acc(D::dot_acc(vdupq_n_s32(0), w.0, x.0), w.1, x.1)
}

/// # Safety
/// NEON must be available and `a.qs` must point at `N` readable activation rows of
/// `a.cols` bytes (`a.d` and `a.s` are bounds-checked slices).
#[target_feature(enable = "neon")]
unsafe fn legacy_tile<const T: u8, const M: usize, const N: usize>(a: &LegacyArgs, out: &mut Out) {
    // SAFETY: the caller's contract.
    unsafe { legacy_tile_with::<Widening, T, M, N>(a, out) }
}

/// # Safety
/// As `legacy_tile`, and the CPU must have the dot-product extension.
#[target_feature(enable = "neon,dotprod")]
unsafe fn legacy_tile_sdot<const T: u8, const M: usize, const N: usize>(
    a: &LegacyArgs,
    out: &mut Out,
) {
    // SAFETY: the caller's contract.
    unsafe { legacy_tile_with::<Sdot, T, M, N>(a, out) }
}

/// The body of both legacy tile kernels.
///
/// # Safety
/// As `legacy_tile`, and what `D` needs.
#[target_feature(enable = "neon")]
#[inline]
unsafe fn legacy_tile_with<D: IntDot, const T: u8, const M: usize, const N: usize>(
    a: &LegacyArgs,
    out: &mut Out,
) {
    let b = bb(T);
    let mut acc = [[vdupq_n_f32(0.0); N]; M];
    let mut macc = [[0.0f32; N]; M];
    for blk in 0..a.nb {
        let mut w = [(vdupq_n_s8(0), vdupq_n_s8(0)); M];
        // The rows' scales in lanes 0..M and offsets in lanes 4..4 + M, converted
        // together (a call per scale costs more than the block's integer products).
        let mut scale_bits = [0u16; 8];
        for r in 0..M {
            let bytes = &a.w[r * a.row_bytes + blk * b..r * a.row_bytes + (blk + 1) * b];
            w[r] = levels::<T>(bytes);
            scale_bits[r] = u16::from_le_bytes([bytes[0], bytes[1]]);
            if has_m(T) {
                scale_bits[4 + r] = u16::from_le_bytes([bytes[2], bytes[3]]);
            }
        }
        let (dw, mw) = halves_to_f32(scale_bits);
        for j in 0..N {
            // SAFETY: block `blk` of activation row j is within the `N` rows the caller
            // guarantees.
            let x = unsafe {
                let p = a.qs.add(j * a.cols + blk * QK);
                (vld1q_s8(p), vld1q_s8(p.add(16)))
            };
            let (dx, sx) = (a.d[j * a.nb + blk], a.s[j * a.nb + blk]);
            for r in 0..M {
                let isum = vcvtq_f32_s32(dot32::<D>(w[r], x));
                acc[r][j] = vfmaq_n_f32(acc[r][j], isum, dw[r] * dx);
                if has_m(T) {
                    macc[r][j] += mw[r] * sx;
                }
            }
        }
    }
    for r in 0..M {
        for j in 0..N {
            out[r][j] = vaddvq_f32(acc[r][j]) + macc[r][j];
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
    let x = &a.x[j0 * a.cols..];
    macro_rules! go {
        ($m:literal, $n:literal) => {
            // SAFETY: NEON is part of the AArch64 baseline and detected first.
            unsafe { float_tile::<T, $m, $n>(w, x, a.cols, out) }
        };
    }
    tile_shapes!(w.rows, nr, go)
}

/// Four weights as `f32`.
#[target_feature(enable = "neon")]
#[inline]
fn load_w4<const T: u8>(b: &[u8]) -> float32x4_t {
    assert!(b.len() >= 4 * elem_bytes(T));
    // SAFETY: four elements are readable (asserted above).
    unsafe {
        match T {
            F32 => vld1q_f32(b.as_ptr().cast()),
            F16 => {
                let h = vld1_u16(b.as_ptr().cast());
                let f: float32x4_t;
                // `fcvtl` (half to single) has no stable intrinsic: the f16 vector type
                // is still unstable.
                std::arch::asm!("fcvtl {0:v}.4s, {1:v}.4h", out(vreg) f, in(vreg) h, options(pure, nomem, nostack));
                f
            }
            _ => vreinterpretq_f32_u32(vshll_n_u16::<16>(vld1_u16(b.as_ptr().cast()))),
        }
    }
}

/// # Safety
/// NEON must be available.
#[target_feature(enable = "neon")]
unsafe fn float_tile<const T: u8, const M: usize, const N: usize>(
    w: &WTile,
    x: &[f32],
    cols: usize,
    out: &mut Out,
) {
    let es = elem_bytes(T);
    let mut acc = [[vdupq_n_f32(0.0); N]; M];
    let mut i = 0;
    while i < cols {
        let n = (cols - i).min(4);
        let mut wv = [vdupq_n_f32(0.0); M];
        for r in 0..M {
            let row = &w.row(r)[i * es..(i + n) * es];
            wv[r] = if n == 4 {
                load_w4::<T>(row)
            } else {
                let mut buf = [0u8; 16];
                buf[..n * es].copy_from_slice(row);
                load_w4::<T>(&buf)
            };
        }
        for j in 0..N {
            let mut buf = [0f32; 4];
            buf[..n].copy_from_slice(&x[j * cols + i..j * cols + i + n]);
            // SAFETY: a 4-element local buffer.
            let xv = unsafe { vld1q_f32(buf.as_ptr()) };
            for r in 0..M {
                acc[r][j] = vfmaq_f32(acc[r][j], wv[r], xv);
            }
        }
        i += 4;
    }
    for r in 0..M {
        for j in 0..N {
            out[r][j] = vaddvq_f32(acc[r][j]);
        }
    }
}

/// Rounds `8 * k` floats times `inv` (half to even, like the scalar twin) into `q`;
/// returns the sum of every 16 of them.
#[target_feature(enable = "neon")]
#[inline]
fn round_store(x: &[f32], inv: f32, q: &mut [i8], sums: &mut [i32]) {
    for ((xs, qs), sum) in x
        .chunks_exact(16)
        .zip(q.chunks_exact_mut(16))
        .zip(sums.iter_mut())
    {
        // SAFETY: 16 floats read and 16 bytes written, within the chunks.
        unsafe {
            let v: [int32x4_t; 4] = std::array::from_fn(|k| {
                vcvtnq_s32_f32(vmulq_n_f32(vld1q_f32(xs.as_ptr().add(4 * k)), inv))
            });
            let h0 = vcombine_s16(vqmovn_s32(v[0]), vqmovn_s32(v[1]));
            let h1 = vcombine_s16(vqmovn_s32(v[2]), vqmovn_s32(v[3]));
            vst1q_s8(qs.as_mut_ptr(), vcombine_s8(vqmovn_s16(h0), vqmovn_s16(h1)));
            *sum = vaddvq_s32(vaddq_s32(vaddq_s32(v[0], v[1]), vaddq_s32(v[2], v[3])));
        }
    }
}

#[target_feature(enable = "neon")]
#[inline]
fn absmax(x: &[f32]) -> f32 {
    let mut m = vdupq_n_f32(0.0);
    for c in x.chunks_exact(4) {
        // SAFETY: four floats within the chunk.
        m = vmaxq_f32(m, vabsq_f32(unsafe { vld1q_f32(c.as_ptr()) }));
    }
    vmaxvq_f32(m)
}

fn quantize_q8(x: &[f32], qs: &mut [i8], d: &mut [f32], s: &mut [f32]) {
    // SAFETY: NEON is part of the AArch64 baseline and detected first.
    unsafe { quantize_q8_impl(x, qs, d, s) }
}

#[target_feature(enable = "neon")]
fn quantize_q8_impl(x: &[f32], qs: &mut [i8], d: &mut [f32], s: &mut [f32]) {
    let blocks = x.chunks_exact(QK).zip(qs.chunks_exact_mut(QK));
    for ((xb, qb), (db, sb)) in blocks.zip(d.iter_mut().zip(s.iter_mut())) {
        let (scale, inv) = scalar::q8_scale(absmax(xb));
        let mut sums = [0i32; 2];
        round_store(xb, inv, qb, &mut sums);
        *db = scale;
        *sb = scale * (sums[0] + sums[1]) as f32;
    }
}

fn quantize_q8k(x: &[f32], qs: &mut [i8], d: &mut [f32], bsums: &mut [i16]) {
    // SAFETY: NEON is part of the AArch64 baseline and detected first.
    unsafe { quantize_q8k_impl(x, qs, d, bsums) }
}

#[target_feature(enable = "neon")]
fn quantize_q8k_impl(x: &[f32], qs: &mut [i8], d: &mut [f32], bsums: &mut [i16]) {
    let blocks = x.chunks_exact(QK_K).zip(qs.chunks_exact_mut(QK_K));
    for ((xb, qb), (db, bs)) in blocks.zip(d.iter_mut().zip(bsums.chunks_exact_mut(16))) {
        let (scale, inv) = scalar::q8_scale(absmax(xb));
        let mut sums = [0i32; 16];
        round_store(xb, inv, qb, &mut sums);
        for (b, s) in bs.iter_mut().zip(sums) {
            *b = s as i16;
        }
        *db = scale;
    }
}
