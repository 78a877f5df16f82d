//! `sparkd bench`: engine-level benchmarks of the loaded model (prefill, single-stream
//! and batched decode), optionally side by side with llama.cpp's `llama-bench`.
//!
//! Figures, not pass/fail: performance goals are judged on these numbers and ratios.

use std::path::Path;
use std::process::Command;
use std::sync::Arc;
use std::time::{Duration, Instant};

use serde::Serialize;

use crate::backend::parity::greedy;
use crate::backend::{Backend, CpuBackend};
use crate::model::{BlockTable, Model, SeqInput};

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
pub(crate) fn bench_tokens(n: usize, vocab: usize, salt: usize) -> Vec<u32> {
    (0..n)
        .map(|i| ((i * 7919 + salt * 104_729 + 13) % vocab) as u32)
        .collect()
}

/// The best of `reps` single-sequence prefills of `n` tokens, as the backend times its
/// forward (on the device for a GPU).
pub(crate) fn prefill_best(
    b: &mut dyn Backend,
    vocab: usize,
    n: usize,
    reps: usize,
) -> anyhow::Result<Duration> {
    let tokens = bench_tokens(n, vocab, 1);
    let mut best = Duration::MAX;
    for _ in 0..reps.max(1) {
        let mut table = BlockTable::default();
        b.reserve(&mut table, n)?;
        let batch = [SeqInput {
            table: &table,
            tokens: &tokens,
            start_pos: 0,
            want_logits: true,
            greedy: None,
        }];
        let took = b.forward(&batch);
        b.release(&mut table);
        best = best.min(took?);
    }
    Ok(best)
}

/// What a timed decode run did.
pub(crate) struct DecodeRun {
    pub tokens: usize,
    /// The steps' own durations (on the device, for GPUs).
    pub elapsed: Duration,
    /// The same steps on the host's clock, with what the engine does around each:
    /// inputs up, outputs down, the greedy picks.
    pub wall: Duration,
    /// Cached positions the timed steps attended to, over all sequences (the KV bytes
    /// they read, per position).
    pub kv_positions: u64,
}

impl DecodeRun {
    pub fn tok_s(&self) -> f64 {
        self.tokens as f64 / self.elapsed.as_secs_f64().max(1e-9)
    }

    pub fn wall_tok_s(&self) -> f64 {
        self.tokens as f64 / self.wall.as_secs_f64().max(1e-9)
    }
}

/// Where a decode run's greedy picks come from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Picks {
    /// As the engine takes a plain greedy request's: from the backend where it makes
    /// them (`Backend::greedy_pick`), else from the logits on the host.
    AsEngine,
    /// Whole logit rows to the host, as for a sampled request.
    HostLogits,
}

/// `streams` sequences with a `prompt`-token prompt each, prefilled together, then one
/// untimed warm-up step (it sizes buffers and, on the GPU, captures the step's graph)
/// and `steps` timed steps of one greedy token per sequence.
pub(crate) fn greedy_decode(
    b: &mut dyn Backend,
    vocab: usize,
    streams: usize,
    prompt: usize,
    steps: usize,
) -> anyhow::Result<DecodeRun> {
    decode_run(b, vocab, streams, prompt, steps, Picks::AsEngine)
}

/// [`greedy_decode`], with the picks from `picks`.
pub(crate) fn decode_run(
    b: &mut dyn Backend,
    vocab: usize,
    streams: usize,
    prompt: usize,
    steps: usize,
    picks: Picks,
) -> anyhow::Result<DecodeRun> {
    let mut tables: Vec<BlockTable> = vec![BlockTable::default(); streams];
    let mut seqs: Vec<Vec<u32>> = (0..streams)
        .map(|s| bench_tokens(prompt, vocab, s + 2))
        .collect();
    let result = (|| {
        for t in tables.iter_mut() {
            b.reserve(t, prompt + steps + 1)?;
        }
        let batch: Vec<SeqInput> = tables
            .iter()
            .zip(&seqs)
            .map(|(t, s)| SeqInput {
                table: t,
                tokens: s,
                start_pos: 0,
                want_logits: true,
                greedy: None,
            })
            .collect();
        b.forward(&batch)?;
        drop(batch);
        let mut run = DecodeRun {
            tokens: 0,
            elapsed: Duration::ZERO,
            wall: Duration::ZERO,
            kv_positions: 0,
        };
        // The prompt's picks (the prefill hands over whole rows).
        push_picks(b, &mut seqs);
        for step in 0..=steps {
            let pos = prompt + step;
            let batch: Vec<SeqInput> = tables
                .iter()
                .zip(&seqs)
                .map(|(t, s)| SeqInput {
                    table: t,
                    tokens: &s[pos..pos + 1],
                    start_pos: pos,
                    want_logits: true,
                    greedy: (picks == Picks::AsEngine).then_some(&[]),
                })
                .collect();
            let started = Instant::now();
            let took = b.forward(&batch)?;
            drop(batch);
            push_picks(b, &mut seqs);
            if step > 0 {
                run.tokens += streams;
                run.elapsed += took;
                run.wall += started.elapsed();
                run.kv_positions += (streams * (pos + 1)) as u64;
            }
        }
        Ok(run)
    })();
    for t in tables.iter_mut() {
        b.release(t);
    }
    result
}

/// Appends each sequence's greedy pick of the last step, as the engine takes it.
fn push_picks(b: &mut dyn Backend, seqs: &mut [Vec<u32>]) {
    for (i, s) in seqs.iter_mut().enumerate() {
        let pick = b.greedy_pick(i);
        s.push(pick.unwrap_or_else(|| greedy(b.logits_mut(i))));
    }
}

pub fn run(
    model: Arc<Model>,
    name: &str,
    threads: usize,
    peer: Option<&Path>,
) -> anyhow::Result<BenchReport> {
    let resident_after_load = crate::engine::resident_bytes();
    let kv_tokens = 8 * 128 + 1024;
    let vocab = model.config.vocab_size;
    let mut cpu = CpuBackend::new(model.clone(), kv_tokens, threads);
    let b: &mut dyn Backend = &mut cpu;
    let tps = |n: usize, t: Duration| n as f64 / t.as_secs_f64().max(1e-9);
    // Warm up: page in the weights and size the buffers.
    prefill_best(b, vocab, 32, 1)?;
    let prefill_128_tps = tps(128, prefill_best(b, vocab, 128, 3)?);
    let prefill_512_tps = tps(512, prefill_best(b, vocab, 512, 2)?);
    let decode_tps = greedy_decode(b, vocab, 1, 16, 64)?.tok_s();
    let aggregate_4_tps = greedy_decode(b, vocab, 4, 16, 48)?.tok_s();
    let aggregate_8_tps = greedy_decode(b, vocab, 8, 16, 48)?.tok_s();
    let resident_after_run = crate::engine::resident_bytes();
    let bytes_per_token = model.weights.bytes_per_token();
    let peer = match peer {
        Some(dir) => Some(run_peer(dir, &model.path, threads)?),
        None => None,
    };
    Ok(BenchReport {
        model: name.to_string(),
        threads: cpu.workspace().threads(),
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
        kv_bytes: cpu.kv().bytes() as u64,
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::gguf::GgufFile;
    use crate::model::synth::{synth_gguf, SynthSpec};

    fn tiny() -> Arc<Model> {
        let bytes = synth_gguf(&SynthSpec::tiny()).expect("synth").to_bytes();
        let file = GgufFile::from_bytes(bytes).expect("parse");
        Arc::new(Model::from_file(file, Path::new("tiny.gguf")).expect("load"))
    }

    #[test]
    fn the_engine_loops_count_what_they_time_and_give_the_cache_back() {
        let model = tiny();
        let vocab = model.config.vocab_size;
        let mut cpu = CpuBackend::new(model.clone(), 1024, 1);
        let run = greedy_decode(&mut cpu, vocab, 3, 5, 4).expect("decode");
        assert_eq!(run.tokens, 3 * 4, "the warm-up step is not counted");
        // Timed steps at positions 6..=9 (the warm-up was 5), each attending to pos + 1.
        assert_eq!(run.kv_positions, 3 * (7 + 8 + 9 + 10));
        assert!(run.elapsed > Duration::ZERO);
        assert_eq!(cpu.kv_used_blocks(), 0);

        assert!(prefill_best(&mut cpu, vocab, 40, 2).expect("prefill") > Duration::ZERO);
        assert_eq!(cpu.kv_used_blocks(), 0);

        // A run past the cache is an error, and what it had reserved is given back.
        let mut small = CpuBackend::new(model, 32, 1);
        assert!(greedy_decode(&mut small, vocab, 2, 10, 8).is_err());
        assert_eq!(small.kv_used_blocks(), 0);
    }
}
