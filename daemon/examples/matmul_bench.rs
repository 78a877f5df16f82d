//! Hand-run benchmark of the CPU matmul on SmolLM2-135M's shapes.
//!
//! `cargo run --release -p sparkd --example matmul_bench [threads]`
//!
//! Prints, per shape and batch size, the fastest time per call, weight bandwidth (GB/s) and
//! arithmetic rate (GOP/s, 2 ops per multiply-add). Then a whole-model sweep: every
//! layer's matrices (30 layers, distinct memory, so weights stream from DRAM as in a
//! real forward pass) plus the output head, as the matmul part of one decode step and of
//! a 512-token prefill. `SPARKD_KERNELS=avx2` (etc.) forces another kernel table.

use std::time::{Duration, Instant};

use sparkd::backend::cpu::{
    kernel_name, matmul, should_pack, MatmulScratch, PackedMatrix, ThreadPool, Weight, WeightMatrix,
};
use sparkd::quant::{quantize, GgmlType};

struct Weights {
    ty: GgmlType,
    rows: usize,
    cols: usize,
    data: Vec<u8>,
    /// Packed as the model would pack it at load for this kernel table.
    packed: Option<PackedMatrix>,
}

impl Weights {
    fn random(ty: GgmlType, rows: usize, cols: usize, seed: u64) -> Self {
        let mut state = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
        let vals: Vec<f32> = (0..rows * cols)
            .map(|_| {
                state = state
                    .wrapping_mul(6364136223846793005)
                    .wrapping_add(1442695040888963407);
                ((state >> 40) as f32 / (1u32 << 23) as f32 - 1.0) * 0.05
            })
            .collect();
        let bytes = ty.bytes_for((rows * cols) as u64).expect("whole blocks") as usize;
        let mut data = vec![0u8; bytes];
        quantize(ty, &vals, &mut data).expect("sizes match");
        let gguf = WeightMatrix::new(ty, rows, cols, &data).expect("consistent");
        let packed = should_pack(ty).then(|| PackedMatrix::pack(&gguf).expect("packable"));
        Self {
            ty,
            rows,
            cols,
            data,
            packed,
        }
    }

    /// The matrix as the model's forward pass would see it.
    fn matrix(&self) -> Weight<'_> {
        match &self.packed {
            Some(p) => Weight::Packed(p),
            None => WeightMatrix::new(self.ty, self.rows, self.cols, &self.data)
                .expect("consistent")
                .into(),
        }
    }
}

/// Fastest of repeated calls of `f` filling `budget` (after one warm-up call): on a
/// shared machine the minimum is the best estimate of the uncontended time.
fn time(budget: Duration, f: impl FnMut()) -> Duration {
    time_both(budget, f).0
}

/// This process's CPU time (all threads).
fn cpu_time() -> Duration {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: `ts` is a valid, writable timespec.
    unsafe { libc::clock_gettime(libc::CLOCK_PROCESS_CPUTIME_ID, &mut ts) };
    Duration::new(ts.tv_sec as u64, ts.tv_nsec as u32)
}

/// Like `time`, plus the smallest process CPU time of a call: with one thread that is
/// the time the call needs when the scheduler does not take the core away mid-call.
fn time_both(budget: Duration, mut f: impl FnMut()) -> (Duration, Duration) {
    f();
    let start = Instant::now();
    let (mut best, mut best_cpu) = (Duration::MAX, Duration::MAX);
    let mut reps = 0u32;
    while reps < 3 || start.elapsed() < budget {
        let (t, c) = (Instant::now(), cpu_time());
        f();
        best = best.min(t.elapsed());
        best_cpu = best_cpu.min(cpu_time() - c);
        reps += 1;
    }
    (best, best_cpu)
}

fn main() {
    let threads: usize = std::env::args()
        .nth(1)
        .and_then(|a| a.parse().ok())
        .unwrap_or(2);
    let pool = ThreadPool::new(threads);
    println!("kernels: {}, threads: {threads}", kernel_name());

    let dispatch = time(Duration::from_millis(200), || pool.run(&|_, _| {}));
    println!(
        "empty ThreadPool::run: {:.2} us",
        dispatch.as_secs_f64() * 1e6
    );

    let shapes = [
        (GgmlType::Q4_1, 576, 576, "attn q/o"),
        (GgmlType::Q4_1, 192, 576, "attn k/v"),
        (GgmlType::Q4_1, 1536, 576, "ffn gate/up"),
        (GgmlType::Q4_1, 576, 1536, "ffn down"),
        (GgmlType::Q8_0, 49152, 576, "output head"),
    ];
    let mut scratch = MatmulScratch::default();
    println!(
        "{:<12} {:>6} {:>5} {:>5} {:>11} {:>8} {:>8}",
        "matrix", "rows", "cols", "n", "us/call", "GB/s", "GOP/s"
    );
    for (ty, rows, cols, name) in shapes {
        let w = Weights::random(ty, rows, cols, rows as u64 ^ cols as u64);
        let m = w.matrix();
        for n in [1usize, 8, 128, 512] {
            let x: Vec<f32> = (0..n * cols)
                .map(|i| ((i * 7919) % 1000) as f32 / 500.0 - 1.0)
                .collect();
            let mut y = vec![0.0f32; n * rows];
            let t = time(Duration::from_millis(300), || {
                matmul(&pool, m, &x, n, &mut y, &mut scratch)
            });
            let secs = t.as_secs_f64();
            println!(
                "{:<12} {:>6} {:>5} {:>5} {:>11.1} {:>8.2} {:>8.1}",
                name,
                rows,
                cols,
                n,
                secs * 1e6,
                w.data.len() as f64 / secs / 1e9,
                2.0 * (rows * cols * n) as f64 / secs / 1e9,
            );
        }
    }

    // The whole model, layer by layer, as a forward pass would run it.
    let layer_shapes = [
        (576, 576),
        (192, 576),
        (192, 576),
        (576, 576),
        (1536, 576),
        (1536, 576),
        (576, 1536),
    ];
    let layers: Vec<Weights> = (0..30)
        .flat_map(|l| {
            layer_shapes
                .iter()
                .enumerate()
                .map(move |(i, &(r, c))| Weights::random(GgmlType::Q4_1, r, c, (l * 16 + i) as u64))
        })
        .collect();
    let head = Weights::random(GgmlType::Q8_0, 49152, 576, 999);
    let total_bytes: usize = layers.iter().map(|w| w.data.len()).sum::<usize>() + head.data.len();
    println!(
        "\nmodel sweep: {} matrices + head, {:.1} MB of weights",
        layers.len(),
        total_bytes as f64 / 1e6
    );
    for (n, with_head) in [(1usize, true), (8, true), (512, false)] {
        let max_cols = 1536;
        let x: Vec<f32> = (0..n * max_cols)
            .map(|i| ((i * 7919) % 1000) as f32 / 500.0 - 1.0)
            .collect();
        let mut y = vec![0.0f32; n * 49152];
        let budget = if n >= 512 {
            Duration::from_secs(2)
        } else {
            Duration::from_millis(500)
        };
        let (t, cpu) = time_both(budget, || {
            for w in &layers {
                let m = w.matrix();
                matmul(
                    &pool,
                    m,
                    &x[..n * w.cols],
                    n,
                    &mut y[..n * w.rows],
                    &mut scratch,
                );
            }
            if with_head {
                let (m, w) = (head.matrix(), &head);
                matmul(
                    &pool,
                    m,
                    &x[..n * w.cols],
                    n,
                    &mut y[..n * w.rows],
                    &mut scratch,
                );
            }
        });
        let secs = t.as_secs_f64();
        let bytes = total_bytes - if with_head { 0 } else { head.data.len() };
        println!(
            "n={n:<4} {}: {:8.2} ms/pass ({:8.2} ms CPU), {:7.1} tok/s (matmuls only), {:6.2} GB/s of weights",
            if with_head { "layers+head" } else { "layers only" },
            secs * 1e3,
            cpu.as_secs_f64() * 1e3,
            n as f64 / secs,
            bytes as f64 / secs / 1e9,
        );
    }
}
