//! Every SIMD kernel against its scalar twin, and the scalar kernels against a plain
//! `f32` dot product of the dequantized weights.

use super::*;
use crate::backend::cpu::testutil::{
    act_quant_bound, dequantize_all, random_acts, random_weights, Rng,
};
use crate::quant::GgmlType;

const LEGACY: [GgmlType; 6] = [
    GgmlType::Q4_0,
    GgmlType::Q4_1,
    GgmlType::Q5_0,
    GgmlType::Q5_1,
    GgmlType::Q8_0,
    GgmlType::IQ4_NL,
];
const KQUANT: [GgmlType; 6] = [
    GgmlType::Q2_K,
    GgmlType::Q3_K,
    GgmlType::Q4_K,
    GgmlType::Q5_K,
    GgmlType::Q6_K,
    GgmlType::IQ4_XS,
];
const FLOAT: [GgmlType; 3] = [GgmlType::F32, GgmlType::F16, GgmlType::BF16];

fn all_types() -> impl Iterator<Item = GgmlType> {
    LEGACY.into_iter().chain(KQUANT).chain(FLOAT)
}

/// Row lengths to test: odd block counts, one 16-block group and more, the model's.
fn cols_for(ty: GgmlType) -> &'static [usize] {
    if LEGACY.contains(&ty) {
        &[32, 64, 96, 160, 544, 576, 1536]
    } else if KQUANT.contains(&ty) {
        &[256, 512, 768]
    } else {
        &[1, 7, 16, 17, 33, 100, 576]
    }
}

/// Activation rows per case: enough for `j0 = 1` with a full tile.
const ACT_ROWS: usize = NR + 1;

struct Case {
    ty: GgmlType,
    cols: usize,
    w: Vec<u8>,
    /// Dequantized weights, `MR x cols`.
    wf: Vec<f32>,
    x: Vec<f32>,
    qs: Vec<i8>,
    d: Vec<f32>,
    s: Vec<f32>,
    kqs: Vec<i8>,
    kd: Vec<f32>,
    kbsums: Vec<i16>,
}

impl Case {
    fn new(ty: GgmlType, cols: usize, rng: &mut Rng) -> Self {
        let w = random_weights(ty, MR, cols, rng);
        let wf = dequantize_all(ty, &w, MR, cols);
        let x = random_acts(ACT_ROWS * cols, rng);
        let mut c = Case {
            ty,
            cols,
            w,
            wf,
            x,
            qs: vec![],
            d: vec![],
            s: vec![],
            kqs: vec![],
            kd: vec![],
            kbsums: vec![],
        };
        if cols % 32 == 0 {
            let n = c.x.len();
            c.qs = vec![0; n];
            c.d = vec![0.0; n / 32];
            c.s = vec![0.0; n / 32];
            scalar::quantize_q8(&c.x, &mut c.qs, &mut c.d, &mut c.s);
        }
        if cols % 256 == 0 {
            let n = c.x.len();
            c.kqs = vec![0; n];
            c.kd = vec![0.0; n / 256];
            c.kbsums = vec![0; n / 16];
            scalar::quantize_q8k(&c.x, &mut c.kqs, &mut c.kd, &mut c.kbsums);
        }
        c
    }

    fn row_bytes(&self) -> usize {
        self.w.len() / MR
    }

    /// Runs `k`'s kernel for weight rows `r0..r0 + mr` and activation rows `j0..j0 + nr`.
    fn tile(&self, k: &Kernels, r0: usize, mr: usize, j0: usize, nr: usize) -> Out {
        let rb = self.row_bytes();
        let w = WTile {
            data: &self.w[r0 * rb..(r0 + mr) * rb],
            row_bytes: rb,
            rows: mr,
            cols: self.cols,
        };
        let mut out = [[f32::NAN; NR]; MR];
        let q8 = Q8Acts {
            qs: &self.qs,
            d: &self.d,
            s: &self.s,
            cols: self.cols,
        };
        let q8k = Q8KActs {
            qs: &self.kqs,
            d: &self.kd,
            bsums: &self.kbsums,
            cols: self.cols,
        };
        let f = F32Acts {
            x: &self.x,
            cols: self.cols,
        };
        match self.ty {
            GgmlType::Q4_0 => (k.q4_0)(&w, &q8, j0, nr, &mut out),
            GgmlType::Q4_1 => (k.q4_1)(&w, &q8, j0, nr, &mut out),
            GgmlType::Q5_0 => (k.q5_0)(&w, &q8, j0, nr, &mut out),
            GgmlType::Q5_1 => (k.q5_1)(&w, &q8, j0, nr, &mut out),
            GgmlType::Q8_0 => (k.q8_0)(&w, &q8, j0, nr, &mut out),
            GgmlType::IQ4_NL => (k.iq4_nl)(&w, &q8, j0, nr, &mut out),
            GgmlType::Q2_K => (k.q2_k)(&w, &q8k, j0, nr, &mut out),
            GgmlType::Q3_K => (k.q3_k)(&w, &q8k, j0, nr, &mut out),
            GgmlType::Q4_K => (k.q4_k)(&w, &q8k, j0, nr, &mut out),
            GgmlType::Q5_K => (k.q5_k)(&w, &q8k, j0, nr, &mut out),
            GgmlType::Q6_K => (k.q6_k)(&w, &q8k, j0, nr, &mut out),
            GgmlType::IQ4_XS => (k.iq4_xs)(&w, &q8k, j0, nr, &mut out),
            GgmlType::F32 => (k.f32)(&w, &f, j0, nr, &mut out),
            GgmlType::F16 => (k.f16)(&w, &f, j0, nr, &mut out),
            GgmlType::BF16 => (k.bf16)(&w, &f, j0, nr, &mut out),
            other => unreachable!("{other} is not a weight type"),
        }
        out
    }

    /// `sum |w_i * x_i|` for weight row `r`, activation row `j`: the scale of the
    /// rounding errors.
    fn magnitude(&self, r: usize, j: usize) -> f32 {
        let w = &self.wf[r * self.cols..(r + 1) * self.cols];
        let x = &self.x[j * self.cols..(j + 1) * self.cols];
        w.iter().zip(x).map(|(a, b)| (a * b).abs()).sum()
    }
}

#[test]
fn simd_kernels_match_their_scalar_twins() {
    let tables = available();
    assert_eq!(tables[0].name, "scalar");
    eprintln!(
        "kernel tables: {:?}",
        tables.iter().map(|k| k.name).collect::<Vec<_>>()
    );
    let mut rng = Rng::new(1);
    for ty in all_types() {
        for &cols in cols_for(ty) {
            let case = Case::new(ty, cols, &mut rng);
            for k in &tables[1..] {
                for (mr, nr, j0) in
                    (1..=MR).flat_map(|m| (1..=NR).flat_map(move |n| [(m, n, 0), (m, n, 1)]))
                {
                    let want = case.tile(&tables[0], 0, mr, j0, nr);
                    let got = case.tile(k, 0, mr, j0, nr);
                    for r in 0..mr {
                        for j in 0..nr {
                            let tol = 2e-5 * case.magnitude(r, j0 + j) + 1e-30;
                            let (a, b) = (got[r][j], want[r][j]);
                            assert!(
                                (a - b).abs() <= tol,
                                "{} {ty} cols={cols} tile {mr}x{nr} j0={j0} [{r}][{j}]: {a} vs scalar {b} (tol {tol})",
                                k.name
                            );
                        }
                    }
                }
            }
        }
    }
}

/// The matmul relies on this for thread-count-independent results.
#[test]
fn results_do_not_depend_on_the_tile_shape() {
    let mut rng = Rng::new(2);
    for k in available() {
        for ty in all_types() {
            let cols = *cols_for(ty).last().expect("non-empty");
            let case = Case::new(ty, cols, &mut rng);
            let full = case.tile(&k, 0, MR, 1, NR);
            for r in 0..MR {
                for j in 0..NR {
                    let single = case.tile(&k, r, 1, 1 + j, 1);
                    assert_eq!(
                        full[r][j].to_bits(),
                        single[0][0].to_bits(),
                        "{} {ty} [{r}][{j}]",
                        k.name
                    );
                }
            }
        }
    }
}

/// The scalar kernels against `dequantize(W) . x` in `f32`: the difference is the
/// activation quantization error, at most half a step per element.
#[test]
fn scalar_kernels_match_a_float_dot_product() {
    let mut rng = Rng::new(3);
    let scalar = scalar::KERNELS;
    for ty in all_types() {
        for &cols in cols_for(ty) {
            let case = Case::new(ty, cols, &mut rng);
            let got = case.tile(&scalar, 0, MR, 0, NR);
            let block = if KQUANT.contains(&ty) { 256 } else { 32 };
            for r in 0..MR {
                for j in 0..NR {
                    let w = &case.wf[r * cols..(r + 1) * cols];
                    let x = &case.x[j * cols..(j + 1) * cols];
                    let exact: f64 = w.iter().zip(x).map(|(&a, &b)| a as f64 * b as f64).sum();
                    let mut bound = 1e-5 * case.magnitude(r, j) as f64;
                    if !FLOAT.contains(&ty) {
                        bound += act_quant_bound(w, x, block) as f64;
                    }
                    let err = (got[r][j] as f64 - exact).abs();
                    assert!(
                        err <= bound,
                        "{ty} cols={cols} [{r}][{j}]: error {err} > {bound}"
                    );
                }
            }
        }
    }
}

#[test]
fn activation_quantizers_match_scalar_bit_for_bit() {
    let mut rng = Rng::new(4);
    let tables = available();
    for len in [256, 512, 2048, 256 * 9] {
        let mut x = random_acts(len, &mut rng);
        x[5] = 1e30;
        x[40..72].fill(0.0);
        x[100] = -1e-30;
        let mut want = (vec![0i8; len], vec![0f32; len / 32], vec![0f32; len / 32]);
        scalar::quantize_q8(&x, &mut want.0, &mut want.1, &mut want.2);
        let mut want_k = (vec![0i8; len], vec![0f32; len / 256], vec![0i16; len / 16]);
        scalar::quantize_q8k(&x, &mut want_k.0, &mut want_k.1, &mut want_k.2);
        for k in &tables[1..] {
            let mut got = (vec![0i8; len], vec![0f32; len / 32], vec![0f32; len / 32]);
            (k.quantize_q8)(&x, &mut got.0, &mut got.1, &mut got.2);
            assert_eq!(got.0, want.0, "{} q8 quants", k.name);
            assert_eq!(bits(&got.1), bits(&want.1), "{} q8 scales", k.name);
            assert_eq!(bits(&got.2), bits(&want.2), "{} q8 sums", k.name);
            let mut got_k = (vec![0i8; len], vec![0f32; len / 256], vec![0i16; len / 16]);
            (k.quantize_q8k)(&x, &mut got_k.0, &mut got_k.1, &mut got_k.2);
            assert_eq!(got_k.0, want_k.0, "{} q8k quants", k.name);
            assert_eq!(bits(&got_k.1), bits(&want_k.1), "{} q8k scales", k.name);
            assert_eq!(got_k.2, want_k.2, "{} q8k sums", k.name);
        }
    }
}

fn bits(v: &[f32]) -> Vec<u32> {
    v.iter().map(|f| f.to_bits()).collect()
}

#[test]
fn activation_quantizer_round_trips_within_half_a_step() {
    let mut rng = Rng::new(5);
    let x = random_acts(1024, &mut rng);
    let (mut qs, mut d, mut s) = (vec![0i8; 1024], vec![0f32; 32], vec![0f32; 32]);
    scalar::quantize_q8(&x, &mut qs, &mut d, &mut s);
    for (b, xb) in x.chunks(32).enumerate() {
        let sum: i32 = qs[32 * b..32 * b + 32].iter().map(|&q| q as i32).sum();
        assert_eq!(s[b], d[b] * sum as f32);
        for (i, &v) in xb.iter().enumerate() {
            let back = qs[32 * b + i] as f32 * d[b];
            assert!((back - v).abs() <= d[b] * 0.5001, "block {b} elem {i}");
        }
    }
}
