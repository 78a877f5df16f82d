//! `sparkd bench`: engine-level benchmarks of the loaded model (prefill, single-stream
//! and batched decode), optionally side by side with llama.cpp's `llama-bench`.
//!
//! Figures, not pass/fail: performance goals are judged on these numbers and ratios.

use std::path::Path;
use std::process::Command;
use std::time::{Duration, Instant};

use serde::Serialize;

use crate::model::{BlockTable, KvCache, Model, SeqInput, Workspace};

#[derive(Debug, Clone, Serialize)]
pub struct BenchReport {
    pub model: String,
    pub threads: usize,
    pub kernel: String,
    pub file_bytes: u64,
    pub weight_bytes_per_token: u64,
    pub prefill_128_tps: f64,
    pub prefill_512_tps: f64,
    pub decode_tps: f64,
    pub decode_gbps: f64,
    pub aggregate_4_tps: f64,
    pub aggregate_8_tps: f64,
    pub resident_after_load_bytes: u64,
    /// After every weight has been read and the KV pool used: the steady state.
    pub resident_after_run_bytes: u64,
    pub kv_bytes: u64,
    pub peer: Option<PeerReport>,
}

#[derive(Debug, Clone, Serialize)]
pub struct PeerReport {
    pub prefill_128_tps: f64,
    pub prefill_512_tps: f64,
    pub decode_tps: f64,
}

/// Tokens that look like text to the model but need no tokenizer: a fixed spread over
/// the vocabulary, so runs are repeatable.
fn bench_tokens(n: usize, vocab: usize, salt: usize) -> Vec<u32> {
    (0..n)
        .map(|i| ((i * 7919 + salt * 104_729 + 13) % vocab) as u32)
        .collect()
}

struct Bench<'m> {
    model: &'m Model,
    kv: KvCache,
    ws: Workspace,
}

impl Bench<'_> {
    fn prefill(&mut self, n: usize, reps: usize) -> f64 {
        let tokens = bench_tokens(n, self.model.config.vocab_size, 1);
        let mut best = Duration::MAX;
        for _ in 0..reps {
            let mut table = BlockTable::default();
            self.kv
                .reserve(&mut table, n)
                .expect("bench KV sized for the prompt");
            let batch = [SeqInput {
                table: &table,
                tokens: &tokens,
                start_pos: 0,
                want_logits: true,
            }];
            let t = Instant::now();
            self.model
                .forward(&batch, &mut self.kv, &mut self.ws)
                .expect("bench forward");
            best = best.min(t.elapsed());
            self.kv.release(&mut table);
        }
        n as f64 / best.as_secs_f64()
    }

    /// `streams` sequences with a short prompt each, then `steps` decode steps of one
    /// token per sequence; returns aggregate generated tokens per second.
    fn decode(&mut self, streams: usize, steps: usize) -> f64 {
        let vocab = self.model.config.vocab_size;
        let prompt = 16;
        let mut tables: Vec<BlockTable> = (0..streams).map(|_| BlockTable::default()).collect();
        let mut seqs: Vec<Vec<u32>> = (0..streams)
            .map(|s| bench_tokens(prompt, vocab, s + 2))
            .collect();
        for t in tables.iter_mut() {
            self.kv
                .reserve(t, prompt + steps + 1)
                .expect("bench KV sized for the streams");
        }
        let batch: Vec<SeqInput> = tables
            .iter()
            .zip(&seqs)
            .map(|(t, s)| SeqInput {
                table: t,
                tokens: s,
                start_pos: 0,
                want_logits: true,
            })
            .collect();
        self.model
            .forward(&batch, &mut self.kv, &mut self.ws)
            .expect("bench forward");
        drop(batch);
        let mut elapsed = Duration::ZERO;
        for step in 0..steps {
            for (i, s) in seqs.iter_mut().enumerate() {
                let logits = self.ws.logits(i, vocab);
                s.push(argmax(logits));
            }
            let batch: Vec<SeqInput> = tables
                .iter()
                .zip(&seqs)
                .map(|(t, s)| SeqInput {
                    table: t,
                    tokens: &s[prompt + step..prompt + step + 1],
                    start_pos: prompt + step,
                    want_logits: true,
                })
                .collect();
            let t = Instant::now();
            self.model
                .forward(&batch, &mut self.kv, &mut self.ws)
                .expect("bench forward");
            elapsed += t.elapsed();
        }
        for t in tables.iter_mut() {
            self.kv.release(t);
        }
        (streams * steps) as f64 / elapsed.as_secs_f64()
    }
}

fn argmax(v: &[f32]) -> u32 {
    let mut best = 0;
    for (i, &x) in v.iter().enumerate() {
        if x > v[best] {
            best = i;
        }
    }
    best as u32
}

pub fn run(
    model: &Model,
    name: &str,
    threads: usize,
    peer: Option<&Path>,
) -> anyhow::Result<BenchReport> {
    let resident_after_load = crate::engine::resident_bytes();
    let kv_tokens = 8 * 128 + 1024;
    let mut b = Bench {
        model,
        kv: model.new_kv_cache(kv_tokens),
        ws: Workspace::new(threads),
    };
    // Warm up: page in the weights and size the buffers.
    b.prefill(32, 1);
    let prefill_128_tps = b.prefill(128, 3);
    let prefill_512_tps = b.prefill(512, 2);
    let decode_tps = b.decode(1, 64);
    let aggregate_4_tps = b.decode(4, 48);
    let aggregate_8_tps = b.decode(8, 48);
    let resident_after_run = crate::engine::resident_bytes();
    let bytes_per_token = model.weights.bytes_per_token();
    let peer = match peer {
        Some(dir) => Some(run_peer(dir, &model.path, threads)?),
        None => None,
    };
    Ok(BenchReport {
        model: name.to_string(),
        threads: b.ws.threads(),
        kernel: crate::backend::cpu::kernel_name().to_string(),
        file_bytes: model.file.file_len(),
        weight_bytes_per_token: bytes_per_token,
        prefill_128_tps,
        prefill_512_tps,
        decode_tps,
        decode_gbps: decode_tps * bytes_per_token as f64 / 1e9,
        aggregate_4_tps,
        aggregate_8_tps,
        resident_after_load_bytes: resident_after_load,
        resident_after_run_bytes: resident_after_run,
        kv_bytes: b.kv.bytes() as u64,
        peer,
    })
}

/// Runs llama.cpp's `llama-bench` on the same file and threads.
fn run_peer(dir: &Path, model: &Path, threads: usize) -> anyhow::Result<PeerReport> {
    let exe = dir.join("llama-bench");
    let out = Command::new(&exe)
        .arg("-m")
        .arg(model)
        .args([
            "-t",
            &threads.to_string(),
            "-p",
            "128,512",
            "-n",
            "64",
            "-r",
            "3",
            "-o",
            "json",
        ])
        .output()
        .map_err(|e| anyhow::anyhow!("cannot run {}: {e}", exe.display()))?;
    if !out.status.success() {
        anyhow::bail!(
            "llama-bench failed: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    }
    let rows: Vec<serde_json::Value> = serde_json::from_slice(&out.stdout)?;
    let pick = |p: u64, g: u64| {
        rows.iter()
            .find(|r| r["n_prompt"].as_u64() == Some(p) && r["n_gen"].as_u64() == Some(g))
            .and_then(|r| r["avg_ts"].as_f64())
            .ok_or_else(|| anyhow::anyhow!("llama-bench output lacks pp{p}/tg{g}"))
    };
    Ok(PeerReport {
        prefill_128_tps: pick(128, 0)?,
        prefill_512_tps: pick(512, 0)?,
        decode_tps: pick(0, 64)?,
    })
}

pub fn print_table(r: &BenchReport) {
    let ratio = |ours: f64, theirs: Option<f64>| match theirs {
        Some(t) if t > 0.0 => format!("{:>9.1} {:>7.2}x", t, ours / t),
        _ => format!("{:>9} {:>8}", "-", "-"),
    };
    let p = r.peer.as_ref();
    println!(
        "model {} · {} threads · kernels {} · {:.1} MB file, {:.1} MB read per token",
        r.model,
        r.threads,
        r.kernel,
        r.file_bytes as f64 / 1e6,
        r.weight_bytes_per_token as f64 / 1e6
    );
    println!(
        "{:<28} {:>9} {:>9} {:>8}",
        "test", "sparkd", "llama.cpp", "ratio"
    );
    println!(
        "{:<28} {:>9.1} {}",
        "prefill pp128 (tok/s)",
        r.prefill_128_tps,
        ratio(r.prefill_128_tps, p.map(|p| p.prefill_128_tps))
    );
    println!(
        "{:<28} {:>9.1} {}",
        "prefill pp512 (tok/s)",
        r.prefill_512_tps,
        ratio(r.prefill_512_tps, p.map(|p| p.prefill_512_tps))
    );
    println!(
        "{:<28} {:>9.1} {}",
        "decode tg64 (tok/s)",
        r.decode_tps,
        ratio(r.decode_tps, p.map(|p| p.decode_tps))
    );
    println!(
        "{:<28} {:>9.1} {:>9} {:>7.2}x",
        "aggregate decode, 4 seqs",
        r.aggregate_4_tps,
        "",
        r.aggregate_4_tps / r.decode_tps
    );
    println!(
        "{:<28} {:>9.1} {:>9} {:>7.2}x",
        "aggregate decode, 8 seqs",
        r.aggregate_8_tps,
        "",
        r.aggregate_8_tps / r.decode_tps
    );
    println!("decode reads {:.1} GB/s of weights", r.decode_gbps);
    let budget = (r.file_bytes + r.kv_bytes) as f64 * 1.1;
    println!(
        "resident after load {:.1} MB; after the run {:.1} MB (file {:.1} MB + KV pool {:.1} MB, +10% = {:.1} MB)",
        r.resident_after_load_bytes as f64 / 1e6,
        r.resident_after_run_bytes as f64 / 1e6,
        r.file_bytes as f64 / 1e6,
        r.kv_bytes as f64 / 1e6,
        budget / 1e6
    );
    println!("(aggregate ratios are against our own single-stream decode)");
}
