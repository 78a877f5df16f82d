//! The weight-reading kernels (embedding, dequantize, mat-vec) and the prefill GEMM, run
//! on the CPU emulator (kernels/emu) and checked against sparkd's CPU reference:
//! dequantization bit for bit, products to f32 rounding. Skips without a C++ compiler.

mod common;

use common::*;
use half::{bf16, f16};
use sparkd::quant::{self, GgmlType};
use sparkd_kernels::consts::{
    GEMM_THREADS, GEMM_TILE, MMQ_ROWS, MMQ_THREADS, MMV_ROWS_PER_BLOCK, MMV_THREADS,
};
use sparkd_kernels::emu::Arg;
use sparkd_kernels::names::{self, Half, WeightType, MMQ_WIDTHS, MMV_BATCHES};

fn ggml(ty: WeightType) -> GgmlType {
    let t = GgmlType::from_id(ty.ggml_id()).expect("every kernel format is a ggml type");
    // A kernel format with another format's id would still pass every test below.
    assert_eq!(t.name().to_ascii_lowercase(), ty.suffix(), "{ty:?}");
    t
}

/// A row length with more than one block (and, for the mat-vec, a partial last tile).
fn cols_for(ty: WeightType) -> usize {
    match ty.block_elems() {
        256 => 768,
        32 => 576,
        _ => 520,
    }
}

/// Random bytes in the block layout (every quant bit pattern), with finite scales.
fn random_weights(ty: WeightType, rows: usize, cols: usize, rng: &mut Rng) -> Vec<u8> {
    let t = ggml(ty);
    let n = rows * cols;
    let mut b = vec![0u8; t.bytes_for(n as u64).unwrap() as usize];
    b.iter_mut().for_each(|x| *x = rng.next_u64() as u8);
    let put = |b: &mut [u8], off: usize, v: f32| {
        b[off..off + 2].copy_from_slice(&f16::from_f32(v).to_le_bytes());
    };
    match ty {
        WeightType::F32 => {
            let v = rng.vec(n, 2.0);
            b.copy_from_slice(&f32_bytes(&v));
        }
        WeightType::F16 => (0..n).for_each(|i| put(&mut b, 2 * i, rng.f32() * 2.0)),
        WeightType::BF16 => (0..n).for_each(|i| {
            b[2 * i..2 * i + 2].copy_from_slice(&bf16::from_f32(rng.f32() * 2.0).to_le_bytes())
        }),
        _ => {
            let bb = t.block_bytes();
            // Offsets of the f16 scales in each block (see kernels/quant.cuh).
            let scales: &[usize] = match ty {
                WeightType::Q4_0
                | WeightType::Q5_0
                | WeightType::Q8_0
                | WeightType::IQ4_NL
                | WeightType::IQ4_XS => &[0],
                WeightType::Q2_K => &[80, 82],
                WeightType::Q3_K => &[108],
                WeightType::Q6_K => &[208],
                _ => &[0, 2],
            };
            for blk in b.chunks_exact_mut(bb) {
                for &o in scales {
                    put(blk, o, rng.f32() * 0.1);
                }
            }
        }
    }
    b
}

fn reference_rows(ty: WeightType, w: &[u8], rows: usize, cols: usize) -> Vec<f32> {
    let mut out = vec![0.0; rows * cols];
    quant::dequantize(ggml(ty), w, &mut out).unwrap();
    out
}

#[test]
fn embedding_rows_equal_the_cpu_dequantization_bit_for_bit() {
    let Some(emu) = emulator() else { return };
    let mut rng = Rng::new(1);
    for ty in WeightType::ALL {
        let (vocab, cols) = (5, cols_for(ty));
        let table = random_weights(ty, vocab, cols, &mut rng);
        let want = reference_rows(ty, &table, vocab, cols);
        let tokens = [3u32, 0, 4, 3, 9];
        let mut t = table.clone();
        let mut tok = u32_bytes(&tokens);
        let mut out = vec![0u8; tokens.len() * cols * 4];
        emu.launch(
            &names::embed(ty),
            [tokens.len() as u32, 1, 1],
            [64, 1, 1],
            &mut [
                Arg::Buf(&mut t),
                Arg::Buf(&mut tok),
                Arg::Buf(&mut out),
                Arg::I32(tokens.len() as i32),
                Arg::I32(cols as i32),
                Arg::I32(vocab as i32),
            ],
        )
        .unwrap();
        let got = bytes_f32(&out);
        for (i, &tk) in tokens.iter().enumerate() {
            let row = &got[i * cols..(i + 1) * cols];
            if (tk as usize) < vocab {
                let w = &want[tk as usize * cols..(tk as usize + 1) * cols];
                for (j, (g, w)) in row.iter().zip(w).enumerate() {
                    assert_eq!(g.to_bits(), w.to_bits(), "{ty:?} token {tk} element {j}");
                }
            } else {
                assert!(row.iter().all(|v| v.is_nan()), "{ty:?}: out-of-range token");
            }
        }
    }
}

#[test]
fn dequantized_tiles_are_the_cpu_values_rounded_to_f16_and_bf16() {
    let Some(emu) = emulator() else { return };
    let mut rng = Rng::new(2);
    for ty in WeightType::ALL {
        let (rows, cols) = (3, cols_for(ty));
        let w = random_weights(ty, rows, cols, &mut rng);
        let want = reference_rows(ty, &w, rows, cols);
        for (half, grid) in [(Half::F16, 1u32), (Half::BF16, 4)] {
            let mut wb = w.clone();
            let mut out = vec![0u8; rows * cols * 2];
            emu.launch(
                &names::dequant(ty, half),
                [grid, 1, 1],
                [64, 1, 1],
                &mut [
                    Arg::Buf(&mut wb),
                    Arg::Buf(&mut out),
                    Arg::I32(rows as i32),
                    Arg::I32(cols as i32),
                ],
            )
            .unwrap();
            for (i, (g, &v)) in bytes_u16(&out).iter().zip(&want).enumerate() {
                let w = match half {
                    Half::F16 => f16::from_f32(v).to_bits(),
                    Half::BF16 => bf16::from_f32(v).to_bits(),
                };
                assert_eq!(*g, w, "{ty:?} {half:?} element {i} ({v})");
            }
        }
    }
}

/// The epsilon of the fused-norm cases.
const NORM_EPS: f32 = 1e-5;

/// Each row of `x` (rows of `cols`) RMS-normalized and scaled by `gain`, in f64 rounded
/// to f32: what the mat-vec's fused norm stands for.
fn rms_normed(x: &[f32], gain: &[f32], cols: usize) -> Vec<f32> {
    x.chunks_exact(cols)
        .flat_map(|row| {
            let ms = row.iter().map(|&v| v as f64 * v as f64).sum::<f64>() / cols as f64;
            let scale = 1.0 / (ms + NORM_EPS as f64).sqrt();
            row.iter()
                .zip(gain)
                .map(move |(&v, &g)| (v as f64 * scale * g as f64) as f32)
        })
        .collect()
}

/// y = W x (+ bias) (+ y0) in f64, and the sum of |terms| per output for the tolerance.
fn matvec_reference(
    w: &[f32],
    x: &[f32],
    rows: usize,
    cols: usize,
    nb: usize,
    bias: Option<&[f32]>,
    y0: Option<&[f32]>,
) -> (Vec<f64>, Vec<f64>) {
    let mut y = vec![0.0; nb * rows];
    let mut mag = vec![0.0; nb * rows];
    for b in 0..nb {
        for r in 0..rows {
            let (mut s, mut m) = (0.0f64, 0.0f64);
            for k in 0..cols {
                let t = w[r * cols + k] as f64 * x[b * cols + k] as f64;
                s += t;
                m += t.abs();
            }
            if let Some(bias) = bias {
                s += bias[r] as f64;
                m += (bias[r] as f64).abs();
            }
            if let Some(y0) = y0 {
                s += y0[b * rows + r] as f64;
                m += (y0[b * rows + r] as f64).abs();
            }
            y[b * rows + r] = s;
            mag[b * rows + r] = m;
        }
    }
    (y, mag)
}

#[test]
fn matvec_matches_the_dequantized_product_for_every_format_and_batch_variant() {
    let Some(emu) = emulator() else { return };
    let mut rng = Rng::new(3);
    let rows = 37; // not a multiple of the 16 rows a block covers
    for (ti, ty) in WeightType::ALL.into_iter().enumerate() {
        let cols = cols_for(ty);
        let w = random_weights(ty, rows, cols, &mut rng);
        let wf = reference_rows(ty, &w, rows, cols);
        for (vi, nb_max) in MMV_BATCHES.into_iter().enumerate() {
            // Fewer rows than the variant holds, except for b1, checks the masking.
            let nb = if nb_max == 1 { 1 } else { nb_max - 1 };
            let x = rng.vec(nb * cols, 3.0);
            let bias = (ti % 2 == 0).then(|| rng.vec(rows, 1.0));
            let y0 = (ti % 3 == 0).then(|| rng.vec(nb * rows, 1.0));
            // Every other case fuses the RMSNorm in front: x is then the raw stream.
            let gain = ((ti + vi) % 2 == 1).then(|| rng.vec(cols, 1.5));
            let x_ref = match &gain {
                Some(g) => rms_normed(&x, g, cols),
                None => x.clone(),
            };
            let (want, mag) =
                matvec_reference(&wf, &x_ref, rows, cols, nb, bias.as_deref(), y0.as_deref());
            let mut wb = w.clone();
            let mut xb = f32_bytes(&x);
            let mut yb = y0
                .as_deref()
                .map(f32_bytes)
                .unwrap_or_else(|| vec![0; nb * rows * 4]);
            let mut bb = bias.as_deref().map(f32_bytes);
            let bias_arg = match &mut bb {
                Some(b) => Arg::Buf(b),
                None => Arg::Null,
            };
            let mut gb = gain.as_deref().map(f32_bytes);
            let gain_arg = match &mut gb {
                Some(g) => Arg::Buf(g),
                None => Arg::Null,
            };
            emu.launch(
                &names::mmv(ty, nb_max),
                [rows.div_ceil(MMV_ROWS_PER_BLOCK) as u32, 1, 1],
                [MMV_THREADS, 1, 1],
                &mut [
                    Arg::Buf(&mut wb),
                    Arg::Buf(&mut xb),
                    Arg::Buf(&mut yb),
                    bias_arg,
                    Arg::I32(rows as i32),
                    Arg::I32(cols as i32),
                    Arg::I32(nb as i32),
                    Arg::I32(y0.is_some() as i32),
                    gain_arg,
                    Arg::F32(NORM_EPS),
                ],
            )
            .unwrap();
            let norm = if gain.is_some() { " fused norm" } else { "" };
            let what = format!("{} nb={nb}{norm}", names::mmv(ty, nb_max));
            assert_close(&what, &bytes_f32(&yb), &want, &mag, 1e-5);
        }
    }
}

#[test]
fn fused_gate_up_matvec_applies_swiglu_for_every_format() {
    let Some(emu) = emulator() else { return };
    let mut rng = Rng::new(8);
    let rows = 37; // an odd count: the last block's second row is past the end
    for ty in WeightType::ALL {
        let cols = cols_for(ty);
        let (gate, up) = (
            random_weights(ty, rows, cols, &mut rng),
            random_weights(ty, rows, cols, &mut rng),
        );
        let (gf, uf) = (
            reference_rows(ty, &gate, rows, cols),
            reference_rows(ty, &up, rows, cols),
        );
        for (nb_max, nb) in [(1, 1), (4, 3)] {
            let x = rng.vec(nb * cols, 1.0);
            // The b4 cases fuse the FFN's RMSNorm in front.
            let gain = (nb_max == 4).then(|| rng.vec(cols, 1.5));
            let x_ref = match &gain {
                Some(g) => rms_normed(&x, g, cols),
                None => x.clone(),
            };
            let (g, g_mag) = matvec_reference(&gf, &x_ref, rows, cols, nb, None, None);
            let (u, u_mag) = matvec_reference(&uf, &x_ref, rows, cols, nb, None, None);
            // silu(g) u and a bound for it: each product within 1e-5 of its sum of
            // |terms| (as the plain mat-vec), carried through silu (slope under 1.1)
            // and the product; plus f32 rounding of the result.
            let silu = |g: f64| g / (1.0 + (-g).exp());
            let want: Vec<f64> = g.iter().zip(&u).map(|(&g, &u)| silu(g) * u).collect();
            let mag: Vec<f64> = (0..g.len())
                .map(|i| 1.1 * g_mag[i] * u[i].abs() + silu(g[i]).abs() * u_mag[i])
                .collect();
            let mut yb = vec![0; nb * rows * 4];
            let mut gain_bytes = gain.as_deref().map(f32_bytes).unwrap_or_default();
            emu.launch(
                &names::mmv_glu(ty, nb_max),
                [rows.div_ceil(MMV_ROWS_PER_BLOCK / 2) as u32, 1, 1],
                [MMV_THREADS, 1, 1],
                &mut [
                    Arg::Buf(&mut gate.clone()),
                    Arg::Buf(&mut up.clone()),
                    Arg::Buf(&mut f32_bytes(&x)),
                    Arg::Buf(&mut yb),
                    Arg::I32(rows as i32),
                    Arg::I32(cols as i32),
                    Arg::I32(nb as i32),
                    if gain.is_some() {
                        Arg::Buf(&mut gain_bytes)
                    } else {
                        Arg::Null
                    },
                    Arg::F32(NORM_EPS),
                ],
            )
            .unwrap();
            let what = format!("{} nb={nb}", names::mmv_glu(ty, nb_max));
            assert_close(&what, &bytes_f32(&yb), &want, &mag, 1e-5);
        }
    }
}

/// A buffer argument, or null for an empty one (an absent matrix, output or bias).
fn buf_or_null(b: &mut [u8]) -> Arg<'_> {
    if b.is_empty() {
        Arg::Null
    } else {
        Arg::Buf(b)
    }
}

#[test]
fn three_matvecs_of_one_input_share_a_launch() {
    let Some(emu) = emulator() else { return };
    let mut rng = Rng::new(9);
    // q, k, v shapes: the block ranges of the three matrices meet mid-grid, and the
    // last block of each is partial. A pair leaves the third matrix out (rows 0).
    for (ty, rows) in [
        (WeightType::Q4_K, vec![37, 10, 6]),
        (WeightType::Q8_0, vec![9, 14]),
        (WeightType::Q6_K, vec![5, 5, 13]),
        (WeightType::Q2_K, vec![19, 4]),
        (WeightType::Q3_K, vec![6, 17, 3]),
        (WeightType::IQ4_NL, vec![11, 3, 20]),
        (WeightType::IQ4_XS, vec![7, 18]),
    ] {
        let cols = cols_for(ty);
        let ws: Vec<Vec<u8>> = rows
            .iter()
            .map(|&r| random_weights(ty, r, cols, &mut rng))
            .collect();
        for (nb_max, nb) in [(1, 1), (4, 3)] {
            let x = rng.vec(nb * cols, 2.0);
            let gain = (nb_max == 4).then(|| rng.vec(cols, 1.5));
            let x_ref = match &gain {
                Some(g) => rms_normed(&x, g, cols),
                None => x.clone(),
            };
            let biases: Vec<Option<Vec<f32>>> = rows
                .iter()
                .enumerate()
                .map(|(i, &r)| (i != 1).then(|| rng.vec(r, 1.0)))
                .collect();
            let mut wb: Vec<Vec<u8>> = ws.clone();
            wb.resize(3, Vec::new());
            // NaN-filled outputs: a row no block writes stays NaN and fails.
            let mut yb: Vec<Vec<u8>> = rows
                .iter()
                .map(|&r| f32_bytes(&vec![f32::NAN; nb * r]))
                .collect();
            yb.resize(3, Vec::new());
            let mut bb: Vec<Vec<u8>> = biases
                .iter()
                .map(|b| b.as_deref().map(f32_bytes).unwrap_or_default())
                .collect();
            bb.resize(3, Vec::new());
            let mut xb = f32_bytes(&x);
            let mut gb = gain.as_deref().map(f32_bytes).unwrap_or_default();
            let blocks: usize = rows.iter().map(|r| r.div_ceil(MMV_ROWS_PER_BLOCK)).sum();
            let [w0, w1, w2] = &mut wb[..] else {
                unreachable!()
            };
            let [y0, y1, y2] = &mut yb[..] else {
                unreachable!()
            };
            let [b0, b1, b2] = &mut bb[..] else {
                unreachable!()
            };
            let row = |i: usize| Arg::I32(rows.get(i).copied().unwrap_or(0) as i32);
            emu.launch(
                &names::mmv3(ty, nb_max),
                [blocks as u32, 1, 1],
                [MMV_THREADS, 1, 1],
                &mut [
                    buf_or_null(w0),
                    buf_or_null(w1),
                    buf_or_null(w2),
                    buf_or_null(y0),
                    buf_or_null(y1),
                    buf_or_null(y2),
                    buf_or_null(b0),
                    buf_or_null(b1),
                    buf_or_null(b2),
                    row(0),
                    row(1),
                    row(2),
                    Arg::Buf(&mut xb),
                    Arg::I32(cols as i32),
                    Arg::I32(nb as i32),
                    if gain.is_some() {
                        Arg::Buf(&mut gb)
                    } else {
                        Arg::Null
                    },
                    Arg::F32(NORM_EPS),
                ],
            )
            .unwrap();
            for (i, &r) in rows.iter().enumerate() {
                let wf = reference_rows(ty, &ws[i], r, cols);
                let (want, mag) =
                    matvec_reference(&wf, &x_ref, r, cols, nb, biases[i].as_deref(), None);
                let what = format!(
                    "{} matrix {i} of {} nb={nb}",
                    names::mmv3(ty, nb_max),
                    rows.len()
                );
                assert_close(&what, &bytes_f32(&yb[i]), &want, &mag, 1e-5);
            }
        }
    }
}

#[test]
fn matvec_walks_long_rows_in_several_strides_per_warp() {
    let Some(emu) = emulator() else { return };
    let mut rng = Rng::new(7);
    // 576 groups of eight: the block's 256 lanes stride over them two or three times
    // (the loop is unrolled by two, so both the pairs and the odd step run).
    let (rows, cols) = (6, 4608);
    for ty in [
        WeightType::Q4_K,
        WeightType::Q6_K,
        WeightType::Q2_K,
        WeightType::Q3_K,
        WeightType::IQ4_NL,
        WeightType::IQ4_XS,
        WeightType::Q8_0,
        WeightType::BF16,
    ] {
        let w = random_weights(ty, rows, cols, &mut rng);
        let wf = reference_rows(ty, &w, rows, cols);
        for (nb_max, nb) in [(1, 1), (4, 3)] {
            let x = rng.vec(nb * cols, 1.0);
            let (want, mag) = matvec_reference(&wf, &x, rows, cols, nb, None, None);
            let mut yb = vec![0; nb * rows * 4];
            emu.launch(
                &names::mmv(ty, nb_max),
                [rows.div_ceil(MMV_ROWS_PER_BLOCK) as u32, 1, 1],
                [MMV_THREADS, 1, 1],
                &mut [
                    Arg::Buf(&mut w.clone()),
                    Arg::Buf(&mut f32_bytes(&x)),
                    Arg::Buf(&mut yb),
                    Arg::Null,
                    Arg::I32(rows as i32),
                    Arg::I32(cols as i32),
                    Arg::I32(nb as i32),
                    Arg::I32(0),
                    Arg::Null,
                    Arg::F32(0.0),
                ],
            )
            .unwrap();
            let what = format!("{} nb={nb} cols={cols}", names::mmv(ty, nb_max));
            assert_close(&what, &bytes_f32(&yb), &want, &mag, 1e-5);
        }
    }
}

#[test]
fn tensor_core_matmul_matches_the_f16_rounded_product_for_every_format_and_width() {
    let Some(emu) = emulator() else { return };
    let mut rng = Rng::new(6);
    // Not a multiple of the 16 rows a block covers: the last block has rows g < 5 only,
    // so its second m16 half (rows g + 8) is masked too.
    let rows = 37;
    let f16_round =
        |v: &[f32]| -> Vec<f32> { v.iter().map(|&x| f16::from_f32(x).to_f32()).collect() };
    for (ti, ty) in WeightType::ALL.into_iter().enumerate() {
        // 520 columns (float formats) end in a quad with one group of four: the tail.
        let cols = cols_for(ty);
        let w = random_weights(ty, rows, cols, &mut rng);
        // The kernel rounds each dequantized weight to f16 (round to nearest even).
        let wf = f16_round(&reference_rows(ty, &w, rows, cols));
        for width in MMQ_WIDTHS {
            // Fewer rows than the variant holds, except at 8, checks the masking.
            let n = if width == 8 { width } else { width - 3 };
            let x = rng.vec(n * cols, 1.0);
            let bias = (ti % 2 == 0).then(|| rng.vec(rows, 1.0));
            let y0 = (ti % 3 == 1).then(|| rng.vec(n * rows, 1.0));
            let mut xh = to_half(emu, &x, Half::F16);
            let (want, mag) = matvec_reference(
                &wf,
                &half_values(&xh, Half::F16),
                rows,
                cols,
                n,
                bias.as_deref(),
                y0.as_deref(),
            );
            let mut wb = w.clone();
            let mut yb = y0
                .as_deref()
                .map(f32_bytes)
                .unwrap_or_else(|| vec![0; n * rows * 4]);
            let mut bb = bias.as_deref().map(f32_bytes);
            let bias_arg = match &mut bb {
                Some(b) => Arg::Buf(b),
                None => Arg::Null,
            };
            emu.launch(
                &names::mmq(ty, width),
                [rows.div_ceil(MMQ_ROWS) as u32, 1, 1],
                [MMQ_THREADS, 1, 1],
                &mut [
                    Arg::Buf(&mut wb),
                    Arg::Buf(&mut xh),
                    Arg::Buf(&mut yb),
                    bias_arg,
                    Arg::I32(rows as i32),
                    Arg::I32(cols as i32),
                    Arg::I32(n as i32),
                    Arg::I32(y0.is_some() as i32),
                ],
            )
            .unwrap();
            // Exact f16 inputs: only the f32 accumulation differs from the f64 sum.
            let what = format!("{} n={n}", names::mmq(ty, width));
            assert_close(&what, &bytes_f32(&yb), &want, &mag, 2e-6);
        }
    }
}

#[test]
fn tensor_core_gate_up_matmul_applies_swiglu_into_f16() {
    let Some(emu) = emulator() else { return };
    let mut rng = Rng::new(10);
    // 21 rows: the last block of 8 has 5, so both of its halves (gate, up) are masked.
    let rows = 21;
    let f16_round =
        |v: &[f32]| -> Vec<f32> { v.iter().map(|&x| f16::from_f32(x).to_f32()).collect() };
    let silu = |g: f64| g / (1.0 + (-g).exp());
    for ty in [
        WeightType::Q4_K,
        WeightType::Q6_K,
        WeightType::Q2_K,
        WeightType::Q3_K,
        WeightType::IQ4_NL,
        WeightType::IQ4_XS,
        WeightType::Q8_0,
        WeightType::F16,
    ] {
        let cols = cols_for(ty);
        let (gate, up) = (
            random_weights(ty, rows, cols, &mut rng),
            random_weights(ty, rows, cols, &mut rng),
        );
        let gf = f16_round(&reference_rows(ty, &gate, rows, cols));
        let uf = f16_round(&reference_rows(ty, &up, rows, cols));
        for (width, n) in [(8, 5), (64, 61)] {
            // Small activations: the random weights' products would pass f16's range.
            let x = rng.vec(n * cols, 0.01);
            let mut xh = to_half(emu, &x, Half::F16);
            let xv = half_values(&xh, Half::F16);
            let (g, g_mag) = matvec_reference(&gf, &xv, rows, cols, n, None, None);
            let (u, u_mag) = matvec_reference(&uf, &xv, rows, cols, n, None, None);
            let want: Vec<f64> = g.iter().zip(&u).map(|(&g, &u)| silu(g) * u).collect();
            // The f16 rounding of the result (half a subnormal step below f16's normal
            // range), plus each sum's f32 error (2e-6 of its |terms|, as the plain
            // mat-mul) carried through silu and the product.
            let bound: Vec<f64> = (0..want.len())
                .map(|i| {
                    (want[i].abs() * 2f64.powi(-11)).max(2f64.powi(-25))
                        + 2e-6 * (1.1 * g_mag[i] * u[i].abs() + silu(g[i]).abs() * u_mag[i])
                })
                .collect();
            // NaN bits: an output the kernel does not write fails.
            let mut out = vec![0xff; n * rows * 2];
            emu.launch(
                &names::mmq_glu(ty, width),
                [rows.div_ceil(MMQ_ROWS / 2) as u32, 1, 1],
                [MMQ_THREADS, 1, 1],
                &mut [
                    Arg::Buf(&mut gate.clone()),
                    Arg::Buf(&mut up.clone()),
                    Arg::Buf(&mut xh),
                    Arg::Buf(&mut out),
                    Arg::I32(rows as i32),
                    Arg::I32(cols as i32),
                    Arg::I32(n as i32),
                ],
            )
            .unwrap();
            let what = format!("{} n={n}", names::mmq_glu(ty, width));
            assert_close(&what, &half_values(&out, Half::F16), &want, &bound, 1.0);
        }
    }
}

#[test]
fn f16_activations_saturate_at_the_largest_finite_value_and_keep_nan() {
    let Some(emu) = emulator() else { return };
    let v = [
        1.5f32,
        70_000.0,
        -1.0e9,
        f32::INFINITY,
        65_504.0,
        65_519.0, // rounds to 65504 anyway
        f32::NAN,
    ];
    let got: Vec<f32> = half_values(&to_half(emu, &v, Half::F16), Half::F16);
    let want = [1.5, 65_504.0, -65_504.0, 65_504.0, 65_504.0, 65_504.0];
    assert_eq!(&got[..6], &want);
    assert!(got[6].is_nan(), "NaN stays NaN: {got:?}");
    // bf16 has f32's range: no saturation there.
    let got = half_values(&to_half(emu, &v[..3], Half::BF16), Half::BF16);
    assert!(got[1] > 69_000.0 && got[2] < -9.9e8, "{got:?}");
}

/// Runs the f32 -> half conversion kernel.
fn to_half(emu: &sparkd_kernels::emu::Emulator, v: &[f32], half: Half) -> Vec<u8> {
    let mut inp = f32_bytes(v);
    let mut out = vec![0u8; v.len() * 2];
    emu.launch(
        &names::convert_from_f32(half),
        [2, 1, 1],
        [256, 1, 1],
        &mut [
            Arg::Buf(&mut inp),
            Arg::Buf(&mut out),
            Arg::I64(v.len() as i64),
        ],
    )
    .unwrap();
    out
}

fn half_values(b: &[u8], half: Half) -> Vec<f32> {
    bytes_u16(b)
        .into_iter()
        .map(|h| match half {
            Half::F16 => f16::from_bits(h).to_f32(),
            Half::BF16 => bf16::from_bits(h).to_f32(),
        })
        .collect()
}

#[test]
fn tensor_core_gemm_matches_a_reference_product_with_bias_and_accumulate() {
    let Some(emu) = emulator() else { return };
    let mut rng = Rng::new(4);
    // m and n past one 128 tile, with different tile counts (a grid with its axes
    // swapped leaves a tile out); k not a multiple of the 32-wide k step, in five
    // slices, so the three-stage pipeline wraps around its stages.
    let (m, n, k) = (GEMM_TILE + 2, 2 * GEMM_TILE + 8, 136);
    for (half, with_bias, accumulate) in [(Half::F16, true, true), (Half::BF16, false, false)] {
        let a = rng.vec(m * k, 2.0);
        let b = rng.vec(n * k, 2.0);
        let mut ah = to_half(emu, &a, half);
        let mut bh = to_half(emu, &b, half);
        // The conversion kernel rounds to nearest even, like the half crate.
        let (av, bv) = (half_values(&ah, half), half_values(&bh, half));
        for (i, (&x, &r)) in a.iter().zip(&av).enumerate().take(500) {
            let want = match half {
                Half::F16 => f16::from_f32(x).to_f32(),
                Half::BF16 => bf16::from_f32(x).to_f32(),
            };
            assert_eq!(r.to_bits(), want.to_bits(), "conversion {i}");
        }
        let bias = rng.vec(n, 1.0);
        let c0 = rng.vec(m * n, 1.0);
        let mut want = vec![0.0f64; m * n];
        let mut mag = vec![0.0f64; m * n];
        for i in 0..m {
            for j in 0..n {
                let (mut s, mut g) = (0.0, 0.0);
                for t in 0..k {
                    let p = av[i * k + t] as f64 * bv[j * k + t] as f64;
                    s += p;
                    g += p.abs();
                }
                if with_bias {
                    s += bias[j] as f64;
                    g += (bias[j] as f64).abs();
                }
                if accumulate {
                    s += c0[i * n + j] as f64;
                    g += (c0[i * n + j] as f64).abs();
                }
                want[i * n + j] = s;
                mag[i * n + j] = g;
            }
        }
        let mut cb = if accumulate {
            f32_bytes(&c0)
        } else {
            vec![0; m * n * 4]
        };
        let mut biasb = f32_bytes(&bias);
        emu.launch(
            &names::gemm(half),
            [
                m.div_ceil(GEMM_TILE) as u32,
                n.div_ceil(GEMM_TILE) as u32,
                1,
            ],
            [GEMM_THREADS, 1, 1],
            &mut [
                Arg::Buf(&mut ah),
                Arg::Buf(&mut bh),
                Arg::Buf(&mut cb),
                if with_bias {
                    Arg::Buf(&mut biasb)
                } else {
                    Arg::Null
                },
                Arg::I32(m as i32),
                Arg::I32(n as i32),
                Arg::I32(k as i32),
                Arg::I32(accumulate as i32),
            ],
        )
        .unwrap();
        assert_close(&names::gemm(half), &bytes_f32(&cb), &want, &mag, 1e-5);
    }
}

#[test]
fn dequantize_then_gemm_equals_the_matvec_of_the_same_weights() {
    let Some(emu) = emulator() else { return };
    let mut rng = Rng::new(5);
    let ty = WeightType::Q4_K;
    let (m, n, k) = (3, 20, 256);
    let w = random_weights(ty, n, k, &mut rng);
    let x = rng.vec(m * k, 1.0);
    let mut wb = w.clone();
    let mut wh = vec![0u8; n * k * 2];
    emu.launch(
        &names::dequant(ty, Half::F16),
        [4, 1, 1],
        [256, 1, 1],
        &mut [
            Arg::Buf(&mut wb),
            Arg::Buf(&mut wh),
            Arg::I32(n as i32),
            Arg::I32(k as i32),
        ],
    )
    .unwrap();
    let mut xh = to_half(emu, &x, Half::F16);
    let mut gemm_out = vec![0u8; m * n * 4];
    emu.launch(
        &names::gemm(Half::F16),
        [1, 1, 1],
        [GEMM_THREADS, 1, 1],
        &mut [
            Arg::Buf(&mut xh),
            Arg::Buf(&mut wh),
            Arg::Buf(&mut gemm_out),
            Arg::Null,
            Arg::I32(m as i32),
            Arg::I32(n as i32),
            Arg::I32(k as i32),
            Arg::I32(0),
        ],
    )
    .unwrap();
    let mut xb = f32_bytes(&x);
    let mut mv_out = vec![0u8; m * n * 4];
    emu.launch(
        &names::mmv(ty, 4),
        [n.div_ceil(MMV_ROWS_PER_BLOCK) as u32, 1, 1],
        [MMV_THREADS, 1, 1],
        &mut [
            Arg::Buf(&mut w.clone()),
            Arg::Buf(&mut xb),
            Arg::Buf(&mut mv_out),
            Arg::Null,
            Arg::I32(n as i32),
            Arg::I32(k as i32),
            Arg::I32(m as i32),
            Arg::I32(0),
            Arg::Null,
            Arg::F32(0.0),
        ],
    )
    .unwrap();
    let wf = reference_rows(ty, &w, n, k);
    let (_, mag) = matvec_reference(&wf, &x, n, k, m, None, None);
    let mv: Vec<f64> = bytes_f32(&mv_out).into_iter().map(f64::from).collect();
    // f16 rounding of weights and activations: about 2^-11 relative per term.
    assert_close("gemm vs mmv", &bytes_f32(&gemm_out), &mv, &mag, 2e-3);
}
