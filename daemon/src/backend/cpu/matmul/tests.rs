//! The matmul driver: thread-count independence, agreement with a float reference,
//! argument checks.

use super::*;
use crate::backend::cpu::testutil::{
    act_quant_bound, dequantize_all, random_acts, random_weights, Rng,
};
use crate::backend::cpu::PackedMatrix;

fn weight_types() -> impl Iterator<Item = GgmlType> {
    GgmlType::ALL.into_iter().filter(|t| t.is_weight_type())
}

fn cols_for(ty: GgmlType) -> usize {
    match ty {
        GgmlType::Q2_K
        | GgmlType::Q3_K
        | GgmlType::Q4_K
        | GgmlType::Q5_K
        | GgmlType::Q6_K
        | GgmlType::IQ4_XS => 512,
        GgmlType::F32 | GgmlType::F16 | GgmlType::BF16 => 72,
        _ => 160,
    }
}

fn run(pool: &ThreadPool, w: &WeightMatrix, x: &[f32], n: usize) -> Vec<f32> {
    let mut y = vec![f32::NAN; n * w.rows];
    matmul(pool, w, x, n, &mut y, &mut MatmulScratch::default());
    y
}

#[test]
fn thread_count_does_not_change_results() {
    let pools = [ThreadPool::new(1), ThreadPool::new(2), ThreadPool::new(3)];
    let mut rng = Rng::new(10);
    for ty in weight_types() {
        let cols = cols_for(ty);
        for rows in [1, 7, 33, 100] {
            let data = random_weights(ty, rows, cols, &mut rng);
            let w = WeightMatrix::new(ty, rows, cols, &data).unwrap();
            for n in (1..=9).chain([17, 64]) {
                let x = random_acts(n * cols, &mut rng);
                let want = run(&pools[0], &w, &x, n);
                assert!(
                    want.iter().all(|v| v.is_finite()),
                    "{ty}: every output written"
                );
                for pool in &pools[1..] {
                    let got = run(pool, &w, &x, n);
                    let same = got
                        .iter()
                        .zip(&want)
                        .all(|(a, b)| a.to_bits() == b.to_bits());
                    assert!(same, "{ty} rows={rows} n={n} threads={}", pool.n_threads());
                }
            }
        }
    }
}

#[test]
fn matmul_matches_a_float_reference() {
    let pool = ThreadPool::new(2);
    let mut rng = Rng::new(11);
    let mut scratch = MatmulScratch::default();
    for ty in weight_types() {
        let (rows, cols, n) = (37, cols_for(ty) * 2, 5);
        let data = random_weights(ty, rows, cols, &mut rng);
        let wf = dequantize_all(ty, &data, rows, cols);
        let w = WeightMatrix::new(ty, rows, cols, &data).unwrap();
        let x = random_acts(n * cols, &mut rng);
        let mut y = vec![0.0; n * rows];
        matmul(&pool, w, &x, n, &mut y, &mut scratch);
        for i in 0..n {
            for r in 0..rows {
                let (wr, xi) = (&wf[r * cols..(r + 1) * cols], &x[i * cols..(i + 1) * cols]);
                let exact: f32 = wr.iter().zip(xi).map(|(a, b)| a * b).sum();
                let scale: f32 = wr.iter().zip(xi).map(|(a, b)| (a * b).abs()).sum();
                let tol = match ty {
                    GgmlType::F32 | GgmlType::F16 | GgmlType::BF16 => 1e-5 * scale,
                    GgmlType::Q2_K
                    | GgmlType::Q3_K
                    | GgmlType::Q4_K
                    | GgmlType::Q5_K
                    | GgmlType::Q6_K
                    | GgmlType::IQ4_XS => 1e-5 * scale + act_quant_bound(wr, xi, 256),
                    _ => 1e-5 * scale + act_quant_bound(wr, xi, 32),
                };
                let got = y[i * rows + r];
                assert!(
                    (got - exact).abs() <= tol + 1e-6,
                    "{ty} y[{i}][{r}] = {got}, want {exact}"
                );
            }
        }
    }
}

/// Reference mode: every layout and type gives the f64 dot product of the decoded
/// weights, rounded once (so to within a few f32 ulps of the sum's magnitude), whatever
/// the thread count; and quantized activations (serving) land within their own bound of
/// it.
#[test]
fn reference_mode_is_exact_for_every_layout_and_type() {
    let pools = [ThreadPool::new(1), ThreadPool::new(3)];
    let mut rng = Rng::new(17);
    for ty in weight_types() {
        let (rows, cols, n) = (37, cols_for(ty) * 2, 6);
        let data = random_weights(ty, rows, cols, &mut rng);
        let wf = dequantize_all(ty, &data, rows, cols);
        let w = WeightMatrix::new(ty, rows, cols, &data).unwrap();
        let packed = PACKABLE
            .contains(&ty)
            .then(|| PackedMatrix::pack(&w).unwrap());
        let x = random_acts(n * cols, &mut rng);
        let mut layouts: Vec<Weight> = vec![w.into()];
        layouts.extend(packed.as_ref().map(Weight::from));
        for (layout, pool) in layouts
            .iter()
            .flat_map(|l| pools.iter().map(move |p| (l, p)))
        {
            let mut y = vec![f32::NAN; n * rows];
            let mut scratch = MatmulScratch::new(MatmulMode::Reference);
            matmul(pool, *layout, &x, n, &mut y, &mut scratch);
            let mut serving = vec![f32::NAN; n * rows];
            matmul(
                pool,
                *layout,
                &x,
                n,
                &mut serving,
                &mut MatmulScratch::default(),
            );
            for i in 0..n {
                for r in 0..rows {
                    let (wr, xi) = (&wf[r * cols..(r + 1) * cols], &x[i * cols..(i + 1) * cols]);
                    let exact: f64 = wr.iter().zip(xi).map(|(&a, &b)| a as f64 * b as f64).sum();
                    let mag: f64 = wr
                        .iter()
                        .zip(xi)
                        .map(|(&a, &b)| (a as f64 * b as f64).abs())
                        .sum();
                    let got = y[i * rows + r] as f64;
                    assert!(
                        (got - exact).abs() <= 1e-7 * mag + 1e-30,
                        "{ty} y[{i}][{r}] = {got}, want {exact} ({layout:?})"
                    );
                    let block = if cols_for(ty) == 512 { 256 } else { 32 };
                    let bound = match ty {
                        GgmlType::F32 | GgmlType::F16 | GgmlType::BF16 => 0.0,
                        _ => act_quant_bound(wr, xi, block) as f64,
                    };
                    let served = serving[i * rows + r] as f64;
                    assert!(
                        (served - exact).abs() <= 1e-5 * mag + bound + 1e-6,
                        "{ty} serving y[{i}][{r}] = {served}, reference {exact}"
                    );
                }
            }
        }
    }
}

#[test]
fn large_batches_use_the_parallel_quantizer_consistently() {
    // Big enough for the parallel activation quantizer and many chunks.
    let mut rng = Rng::new(12);
    let (rows, cols, n) = (300, 576, 64);
    for ty in [GgmlType::Q4_1, GgmlType::Q6_K] {
        let cols = if ty == GgmlType::Q6_K { 512 } else { cols };
        let data = random_weights(ty, rows, cols, &mut rng);
        let w = WeightMatrix::new(ty, rows, cols, &data).unwrap();
        let x = random_acts(n * cols, &mut rng);
        let a = run(&ThreadPool::new(1), &w, &x, n);
        let b = run(&ThreadPool::new(2), &w, &x, n);
        assert!(
            a.iter().zip(&b).all(|(p, q)| p.to_bits() == q.to_bits()),
            "{ty}"
        );
    }
}

#[test]
fn scratch_is_reused_without_growing() {
    let pool = ThreadPool::new(2);
    let mut rng = Rng::new(13);
    for ty in [GgmlType::Q8_0, GgmlType::Q4_K] {
        let data = random_weights(ty, 64, 256, &mut rng);
        let w = WeightMatrix::new(ty, 64, 256, &data).unwrap();
        let x = random_acts(16 * 256, &mut rng);
        let mut scratch = MatmulScratch::default();
        let mut y = vec![0.0; 16 * 64];
        matmul(&pool, w, &x, 16, &mut y, &mut scratch);
        let first = y.clone();
        let caps = scratch.capacities();
        matmul(&pool, w, &x[..256], 1, &mut y[..64], &mut scratch);
        matmul(&pool, w, &x, 16, &mut y, &mut scratch);
        assert_eq!(scratch.capacities(), caps, "{ty}");
        assert_eq!(y, first, "{ty}");
    }
}

#[test]
fn weight_matrix_checks_sizes_and_types() {
    let ty = GgmlType::Q4_1;
    assert!(WeightMatrix::new(ty, 2, 64, &[0u8; 80]).is_ok());
    assert_eq!(
        WeightMatrix::new(ty, 2, 64, &[0u8; 79]).unwrap_err(),
        KernelError::SizeMismatch {
            ty,
            rows: 2,
            cols: 64,
            expected: 80,
            got: 79
        }
    );
    assert_eq!(
        WeightMatrix::new(ty, 2, 48, &[0u8; 60]).unwrap_err(),
        KernelError::RaggedRow { ty, cols: 48 }
    );
    assert_eq!(
        WeightMatrix::new(GgmlType::Q8_K, 1, 256, &[0u8; 292]).unwrap_err(),
        KernelError::UnsupportedType(GgmlType::Q8_K)
    );
    assert!(WeightMatrix::new(GgmlType::F32, usize::MAX / 2, 8, &[]).is_err());
}

#[test]
fn dequantize_row_reads_one_row() {
    let mut rng = Rng::new(14);
    for ty in weight_types() {
        let cols = cols_for(ty);
        let data = random_weights(ty, 5, cols, &mut rng);
        let all = dequantize_all(ty, &data, 5, cols);
        let w = WeightMatrix::new(ty, 5, cols, &data).unwrap();
        let mut row = vec![0.0; cols];
        dequantize_row(w, 3, &mut row);
        assert_eq!(row, all[3 * cols..4 * cols], "{ty}");
    }
}

#[test]
fn empty_shapes_are_fine() {
    let pool = ThreadPool::new(2);
    let mut scratch = MatmulScratch::default();
    let data = [0u8; 40];
    let w = WeightMatrix::new(GgmlType::Q4_1, 2, 32, &data[..40]).unwrap();
    matmul(&pool, w, &[], 0, &mut [], &mut scratch);
    let w0 = WeightMatrix::new(GgmlType::Q4_1, 0, 32, &[]).unwrap();
    matmul(&pool, w0, &[0.0; 32], 1, &mut [], &mut scratch);
}

const PACKABLE: [GgmlType; 3] = [GgmlType::Q4_0, GgmlType::Q4_1, GgmlType::Q8_0];

/// Packed weights give the same results as their GGUF layout, up to rounding (the
/// kernels sum in different orders), whatever the batch size, row count (partial last
/// groups) and thread count; and every batch size gives the same bits per row.
#[test]
fn packed_matmul_matches_the_gguf_layout() {
    let pools = [ThreadPool::new(1), ThreadPool::new(2), ThreadPool::new(3)];
    let mut rng = Rng::new(15);
    for ty in PACKABLE {
        for (rows, cols) in [(1, 32), (15, 96), (16, 160), (37, 576), (100, 64)] {
            let data = random_weights(ty, rows, cols, &mut rng);
            let wf = dequantize_all(ty, &data, rows, cols);
            let w = WeightMatrix::new(ty, rows, cols, &data).unwrap();
            let p = PackedMatrix::pack(&w).unwrap();
            assert_eq!(p.byte_len(), rows.div_ceil(16) * 16 * w.row_bytes());
            let n = 11;
            let x = random_acts(n * cols, &mut rng);
            let want = run(&pools[0], &w, &x, n);
            let mut got = vec![f32::NAN; n * rows];
            matmul(
                &pools[1],
                &p,
                &x,
                n,
                &mut got,
                &mut MatmulScratch::default(),
            );
            for i in 0..n {
                for r in 0..rows {
                    let (a, b) = (got[i * rows + r], want[i * rows + r]);
                    let mag: f32 = wf[r * cols..(r + 1) * cols]
                        .iter()
                        .zip(&x[i * cols..(i + 1) * cols])
                        .map(|(u, v)| (u * v).abs())
                        .sum();
                    assert!(
                        (a - b).abs() <= 2e-5 * mag + 1e-30,
                        "{ty} {rows}x{cols} [{i}][{r}]: packed {a} vs gguf {b}"
                    );
                }
            }
            for pool in &pools {
                for m in [1, 3, 8, 9] {
                    let mut y = vec![f32::NAN; m * rows];
                    matmul(
                        pool,
                        &p,
                        &x[..m * cols],
                        m,
                        &mut y,
                        &mut MatmulScratch::default(),
                    );
                    let same = y.iter().zip(&got).all(|(a, b)| a.to_bits() == b.to_bits());
                    assert!(
                        same,
                        "{ty} {rows}x{cols} n={m} threads={}",
                        pool.n_threads()
                    );
                }
            }
        }
    }
}

#[test]
fn packing_round_trips_and_rejects_other_types() {
    let mut rng = Rng::new(16);
    for ty in PACKABLE {
        for (rows, cols) in [(1, 32), (17, 96), (32, 576)] {
            let data = random_weights(ty, rows, cols, &mut rng);
            let all = dequantize_all(ty, &data, rows, cols);
            let w = WeightMatrix::new(ty, rows, cols, &data).unwrap();
            let p = PackedMatrix::pack(&w).unwrap();
            let rb = w.row_bytes();
            let mut back = vec![0u8; rb];
            let mut row = vec![0.0; cols];
            for r in 0..rows {
                p.unpack_row(r, &mut back);
                assert_eq!(back, data[r * rb..(r + 1) * rb], "{ty} row {r}");
                dequantize_row(&p, r, &mut row);
                let bits = |v: &[f32]| v.iter().map(|f| f.to_bits()).collect::<Vec<_>>();
                assert_eq!(
                    bits(&row),
                    bits(&all[r * cols..(r + 1) * cols]),
                    "{ty} row {r}"
                );
            }
        }
    }
    for ty in [GgmlType::Q5_0, GgmlType::Q4_K, GgmlType::F16] {
        let cols = cols_for(ty);
        let data = random_weights(ty, 2, cols, &mut rng);
        let w = WeightMatrix::new(ty, 2, cols, &data).unwrap();
        assert_eq!(
            PackedMatrix::pack(&w).unwrap_err(),
            KernelError::UnsupportedType(ty)
        );
    }
}

/// Timing, not a check: `cargo test --release -p sparkd packed_speed -- --ignored
/// --nocapture`. Model-shaped Q4_1 layers (SmolLM2-135M, larger than the caches), GGUF
/// tiles against packed, interleaved, best of several rounds.
#[test]
#[ignore]
fn packed_speed() {
    let threads: usize = std::env::var("THREADS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(2);
    let pool = ThreadPool::new(threads);
    let mut rng = Rng::new(17);
    let ty = GgmlType::Q4_1;
    let shapes = [
        (576, 576),
        (192, 576),
        (192, 576),
        (576, 576),
        (1536, 576),
        (1536, 576),
        (576, 1536),
    ];
    let mut mats = Vec::new();
    for _ in 0..30 {
        for &(rows, cols) in &shapes {
            let data = random_weights(ty, rows, cols, &mut rng);
            mats.push((rows, cols, data));
        }
    }
    let packed: Vec<PackedMatrix> = mats
        .iter()
        .map(|(r, c, d)| PackedMatrix::pack(&WeightMatrix::new(ty, *r, *c, d).unwrap()).unwrap())
        .collect();
    let mut scratch = MatmulScratch::default();
    for n in [1, 2, 4, 8, 64] {
        let x = random_acts(n * 1536, &mut rng);
        let mut y = vec![0.0; n * 1536];
        let mut best = [f64::MAX; 2];
        for _ in 0..15 {
            for (which, b) in best.iter_mut().enumerate() {
                let (t, w) = (thread_cpu_secs(), std::time::Instant::now());
                for (i, (rows, cols, data)) in mats.iter().enumerate() {
                    let (xs, ys) = (&x[..n * cols], &mut y[..n * rows]);
                    if which == 0 {
                        let w = WeightMatrix::new(ty, *rows, *cols, data).unwrap();
                        matmul(&pool, w, xs, n, ys, &mut scratch);
                    } else {
                        matmul(&pool, &packed[i], xs, n, ys, &mut scratch);
                    }
                }
                // With one thread, this thread's CPU time: robust to a busy machine
                // (time spent descheduled does not count).
                let took = if threads == 1 {
                    thread_cpu_secs() - t
                } else {
                    w.elapsed().as_secs_f64()
                };
                *b = b.min(took);
            }
        }
        eprintln!(
            "n={n:<3} gguf {:7.2} ms  packed {:7.2} ms  speedup {:.2}x",
            best[0] * 1e3,
            best[1] * 1e3,
            best[0] / best[1]
        );
    }
}

fn thread_cpu_secs() -> f64 {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: `ts` is a valid, writable timespec.
    unsafe { libc::clock_gettime(libc::CLOCK_THREAD_CPUTIME_ID, &mut ts) };
    ts.tv_sec as f64 + ts.tv_nsec as f64 * 1e-9
}
