//! The packed kernels: every table's against the scalar twin (bit for bit: the same
//! integer sums and the same float operations in the same order) and the scalar twin
//! against the scalar GGUF-layout tiles (to rounding).

use super::*;
use crate::backend::cpu::testutil::{dequantize_all, random_acts, random_weights, Rng};
use crate::backend::cpu::{PackedMatrix, WeightMatrix};
use crate::quant::GgmlType;

const PACKABLE: [GgmlType; 3] = [GgmlType::Q4_0, GgmlType::Q4_1, GgmlType::Q8_0];

fn packed_kernel(k: &Kernels, ty: GgmlType) -> PackedDot {
    match ty {
        GgmlType::Q4_0 => k.packed_q4_0,
        GgmlType::Q4_1 => k.packed_q4_1,
        _ => k.packed_q8_0,
    }
}

fn tile_kernel(k: &Kernels, ty: GgmlType) -> LegacyTile {
    match ty {
        GgmlType::Q4_0 => k.q4_0,
        GgmlType::Q4_1 => k.q4_1,
        _ => k.q8_0,
    }
}

#[test]
fn packed_kernels_match_the_scalar_twin_and_tiles() {
    let mut rng = Rng::new(20);
    let tables = available();
    for ty in PACKABLE {
        // Odd block counts, one block, the model's widths; partial and whole groups.
        for cols in [32, 96, 160, 576, 1536] {
            for rows in [1, 5, 16, 17, 33] {
                let w = random_weights(ty, rows, cols, &mut rng);
                let wf = dequantize_all(ty, &w, rows, cols);
                let x = random_acts((PACK_ACTS + 1) * cols, &mut rng);
                let n = x.len();
                let (mut qs, mut d, mut s) = (vec![0i8; n], vec![0f32; n / 32], vec![0f32; n / 32]);
                scalar::quantize_q8(&x, &mut qs, &mut d, &mut s);
                let acts = Q8Acts {
                    qs: &qs,
                    d: &d,
                    s: &s,
                    cols,
                };
                let gguf = WeightMatrix::new(ty, rows, cols, &w).unwrap();
                let p = PackedMatrix::pack(&gguf).unwrap();
                let rb = gguf.row_bytes();
                for g in 0..p.n_groups() {
                    let group = p.group(g);
                    for (j0, nr) in [(0, 1), (1, 2), (1, 3), (0, PACK_ACTS), (1, PACK_ACTS)] {
                        let mut want: PackedOut = [[f32::NAN; PACK_ROWS]; PACK_ACTS];
                        packed_kernel(&tables[0], ty)(&group, &acts, j0, nr, &mut want);
                        for k in &tables[1..] {
                            let mut got: PackedOut = [[f32::NAN; PACK_ROWS]; PACK_ACTS];
                            packed_kernel(k, ty)(&group, &acts, j0, nr, &mut got);
                            for j in 0..nr {
                                for r in 0..PACK_ROWS {
                                    assert_eq!(
                                        got[j][r].to_bits(),
                                        want[j][r].to_bits(),
                                        "{} {ty} cols={cols} rows={rows} g={g} [{j}][{r}]",
                                        k.name
                                    );
                                }
                            }
                        }
                        for j in 0..nr {
                            for r in 0..PACK_ROWS {
                                let row = g * PACK_ROWS + r;
                                if row >= rows {
                                    assert_eq!(want[j][r], 0.0, "padding row gives 0");
                                    continue;
                                }
                                let one = WTile {
                                    data: &w[row * rb..(row + 1) * rb],
                                    row_bytes: rb,
                                    rows: 1,
                                    cols,
                                };
                                let mut t = [[0f32; NR]; MR];
                                tile_kernel(&tables[0], ty)(&one, &acts, j0 + j, 1, &mut t);
                                let xr = &x[(j0 + j) * cols..(j0 + j + 1) * cols];
                                let mag: f32 = wf[row * cols..(row + 1) * cols]
                                    .iter()
                                    .zip(xr)
                                    .map(|(a, b)| (a * b).abs())
                                    .sum();
                                let tol = 2e-5 * mag + 1e-30;
                                assert!(
                                    (want[j][r] - t[0][0]).abs() <= tol,
                                    "{ty} cols={cols} rows={rows} [{j}][{row}]: {} vs tile {}",
                                    want[j][r],
                                    t[0][0]
                                );
                            }
                        }
                    }
                }
            }
        }
    }
}

#[test]
fn only_the_avx512_table_packs() {
    for k in available() {
        assert_eq!(k.pack_weights, k.name == "avx512-vnni", "{}", k.name);
    }
}

/// Against the exact value of the quantized product (f64): the float rounding of the
/// packed kernel is as small as the tiles' (both ~1e-7 of `sum |w x|`).
#[test]
fn packed_kernels_are_as_accurate_as_the_tiles() {
    let mut rng = Rng::new(21);
    let tables = available();
    let k = tables.last().unwrap();
    for ty in PACKABLE {
        let (rows, cols) = (64, 1536);
        let w = random_weights(ty, rows, cols, &mut rng);
        let wf = dequantize_all(ty, &w, rows, cols);
        let x = random_acts(cols, &mut rng);
        let (mut qs, mut d, mut s) = (
            vec![0i8; cols],
            vec![0f32; cols / 32],
            vec![0f32; cols / 32],
        );
        scalar::quantize_q8(&x, &mut qs, &mut d, &mut s);
        let acts = Q8Acts {
            qs: &qs,
            d: &d,
            s: &s,
            cols,
        };
        let gguf = WeightMatrix::new(ty, rows, cols, &w).unwrap();
        let p = PackedMatrix::pack(&gguf).unwrap();
        let rb = gguf.row_bytes();
        let (mut ep, mut et) = (0f64, 0f64);
        for g in 0..p.n_groups() {
            let mut got: PackedOut = [[0.0; PACK_ROWS]; PACK_ACTS];
            packed_kernel(k, ty)(&p.group(g), &acts, 0, 1, &mut got);
            for r in 0..PACK_ROWS {
                let row = g * PACK_ROWS + r;
                let exact: f64 = (0..cols)
                    .map(|i| wf[row * cols + i] as f64 * qs[i] as f64 * d[i / 32] as f64)
                    .sum();
                let mag: f64 = (0..cols)
                    .map(|i| (wf[row * cols + i] as f64 * qs[i] as f64 * d[i / 32] as f64).abs())
                    .sum();
                let one = WTile {
                    data: &w[row * rb..(row + 1) * rb],
                    row_bytes: rb,
                    rows: 1,
                    cols,
                };
                let mut t = [[0f32; NR]; MR];
                tile_kernel(k, ty)(&one, &acts, 0, 1, &mut t);
                ep = ep.max((got[0][r] as f64 - exact).abs() / mag);
                et = et.max((t[0][0] as f64 - exact).abs() / mag);
            }
        }
        eprintln!("{} {ty}: max rel err packed {ep:.3e} tile {et:.3e}", k.name);
        assert!(ep < 5e-7 && et < 5e-7, "{} {ty}: {ep} / {et}", k.name);
    }
}
