//! The CUDA subcommands of gpu-check.sh (scripts/gpu-check.sh documents their output):
//! `sparkd gpu-parity` (GPU logits and greedy tokens against the CPU forward) and
//! `sparkd bench --device cuda` (device copy bandwidth, batched decode, prefill; JSON
//! lines). Both need a GPU; without one they stop with the probe's error.

use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use anyhow::Context;
use serde_json::json;

use crate::backend::cuda::{
    probe, CudaBackend, CudaGpu, CudaOptions, DeviceChoice, DeviceRequest, Gpu, GpuError, GpuInfo,
};
use crate::backend::parity::{compare, ParityPlan, ParityReport};
use crate::backend::CpuBackend;
use crate::bench::{bench_tokens, decode_run, greedy_decode, prefill_best, Picks};
use crate::cli::{model_path, GpuParityArgs};
use crate::model::{Model, BLOCK_TOKENS};
use sparkd_kernels::names::KvType;
use sparkd_kernels::Arch;

/// The GPU `request` names, or the probe's reason why there is none.
fn cuda_device(request: DeviceRequest) -> anyhow::Result<(GpuInfo, Arch)> {
    match probe(request).with_context(|| format!("no CUDA device for --device {request}"))? {
        DeviceChoice::Cuda { gpu, arch, .. } => Ok((gpu, arch)),
        DeviceChoice::Cpu { reason } => {
            anyhow::bail!("no CUDA device for --device {request}: {reason}")
        }
    }
}

pub fn parity(args: &GpuParityArgs) -> anyhow::Result<bool> {
    if args.device == DeviceRequest::Cpu {
        anyhow::bail!("gpu-parity compares a GPU with the CPU: --device must be cuda[:N]");
    }
    let (gpu_info, arch) = cuda_device(args.device)?;
    let path = model_path(&args.model, false)?;
    let threads = args
        .threads
        .unwrap_or_else(crate::backend::cpu::physical_cores);
    let new_gpu = || CudaGpu::new(gpu_info.ordinal, arch);
    let runs = parity_runs(&path, new_gpu, |_| {}, args.steps, threads)?;
    let (f32_run, tc) = (runs.f32_run, runs.tensor_core);
    let pass = runs.pass();
    println!(
        "{}",
        json!({
            "model": args.model,
            "device": gpu_info.name,
            "steps": f32_run.steps,
            "max_rel_err": f32_run.max_rel_err.max(tc.max_rel_err),
            "f32_max_rel_err": f32_run.max_rel_err,
            "greedy_matched": f32_run.greedy_matched,
            "near_tie_steps": f32_run.near_tie_steps,
            "tc_steps": tc.steps,
            "tc_max_rel_err": tc.max_rel_err,
            "tc_greedy_matched": tc.greedy_matched,
            "tc_near_tie_steps": tc.near_tie_steps,
            "pass": pass,
        })
    );
    Ok(pass)
}

/// The two parity runs of `sparkd gpu-parity`.
pub(crate) struct ParityRuns {
    /// Everything in f32: the mat-vec, an f32 KV cache.
    pub f32_run: ParityReport,
    /// The defaults with f16 operands: GEMM prefill, mmq decode, the f16 KV cache.
    pub tensor_core: ParityReport,
}

/// Largest relative logit error `gpu-parity` passes on the f32 paths. Against the
/// CPU's reference mode only summation order and the device's math functions differ
/// there (the emulator shows 5e-7 on the small model over 32 steps), so this is far
/// tighter than the 1e-2: a slip that costs precision without breaking the
/// output still fails.
pub(crate) const F32_PATHS_MAX_REL_ERR: f64 = 1e-3;
/// The same on the tensor-core paths, whose f16 operands and KV cache round each
/// input to 11 bits (4e-4 on the emulator): the bar.
pub(crate) const TENSOR_CORE_MAX_REL_ERR: f64 = 1e-2;

impl ParityRuns {
    /// Each run's logits within its bar of the CPU's ([`F32_PATHS_MAX_REL_ERR`],
    /// [`TENSOR_CORE_MAX_REL_ERR`]), and every greedy pick equal or a near tie (see
    /// [`parity_runs`]).
    pub fn pass(&self) -> bool {
        [
            (&self.f32_run, F32_PATHS_MAX_REL_ERR),
            (&self.tensor_core, TENSOR_CORE_MAX_REL_ERR),
        ]
        .iter()
        .all(|(r, bar)| r.max_rel_err < *bar && r.greedy_matched + r.near_tie_steps == r.steps)
    }
}

/// Runs the model at `path` on the CPU and on devices from `new_gpu` side by side (see
/// [`ParityRuns`]), one device per run, each shown to `inspect` after its run and
/// dropped before the next is made.
pub(crate) fn parity_runs<G: Gpu>(
    path: &Path,
    mut new_gpu: impl FnMut() -> Result<G, GpuError>,
    mut inspect: impl FnMut(&G),
    steps: usize,
    threads: usize,
) -> anyhow::Result<ParityRuns> {
    // The CPU reference reads its own copy, laid out for its kernels; the GPU gets the
    // file's layout uploaded from a mapping.
    let model = Arc::new(Model::load(path)?);
    let device_model = Model::load_mapped(path)?;
    let vocab = model.config.vocab_size;
    // Two runs, each prefilling its sequences together and then decoding them as a
    // batch. First all in f32 (the mat-vec, an f32 KV cache), two sequences. Then the
    // defaults, f16 operands, five sequences: a 266-row prefill on dequantize + GEMM
    // (`gemm_min_tokens` is 256), decode on the tensor-core mat-mul (`mmq_min_tokens`
    // is 4; the graph pads five to eight), the KV cache in f16.
    //
    // The reference is the CPU forward in its reference mode: weights decoded to f32,
    // products summed in f64, no 8-bit activations. (Served, the CPU quantizes
    // activations as llama.cpp does, which alone moves random-weight logits by up to
    // 1e-2 of their range: a GPU compared with that would spend the whole error budget
    // on the CPU's rounding.) Against it the emulated kernels show about 4e-5 on the
    // f32 paths and 4e-4 with f16 operands. Random weights make near ties common, so a
    // pick that differs from the CPU's passes only where the CPU scores it within
    // `parity::NEAR_TIE` of its own; the report counts exact matches apart.
    let lens: [&[usize]; 2] = [&[48, 20], &[120, 64, 33, 9, 40]];
    let plans = lens.map(|lens| ParityPlan {
        prompts: lens
            .iter()
            .enumerate()
            .map(|(i, &n)| bench_tokens(n, vocab, i + 1))
            .collect(),
        chunk: usize::MAX,
        steps,
    });
    let kv_tokens = lens
        .iter()
        .map(|l| l.iter().map(|n| n + steps + BLOCK_TOKENS).sum::<usize>())
        .max()
        .unwrap_or(0);
    let mut cpu = CpuBackend::reference(model.clone(), kv_tokens, threads);
    let defaults = CudaOptions {
        kv_tokens,
        ..CudaOptions::default()
    };
    let all_f32 = CudaOptions {
        mmq_min_tokens: usize::MAX,
        gemm_min_tokens: usize::MAX,
        kv_type: KvType::F32,
        ..defaults.clone()
    };
    let [f32_plan, tc_plan] = &plans;
    // One device at a time: the first run's weights and cache go before the second's
    // are uploaded.
    let mut run = |plan: &ParityPlan, opts: CudaOptions| -> anyhow::Result<_> {
        let mut gpu = CudaBackend::new(&device_model, new_gpu()?, opts)?;
        let report = compare(&mut cpu, &mut gpu, plan, |step, seq, err, a, b| {
            tracing::debug!(step, seq, err, cpu = a, gpu = b, "parity row");
        })?;
        inspect(gpu.gpu());
        Ok(report)
    };
    Ok(ParityRuns {
        f32_run: run(f32_plan, all_f32)?,
        tensor_core: run(tc_plan, defaults)?,
    })
}

fn emit(line: serde_json::Value, json_out: bool) {
    if json_out {
        println!("{line}");
    } else {
        let kind = line["kind"].as_str().unwrap_or("");
        let rest: Vec<String> = line
            .as_object()
            .map(|o| {
                o.iter()
                    .filter(|(k, _)| *k != "kind")
                    .map(|(k, v)| format!("{k}={v}"))
                    .collect()
            })
            .unwrap_or_default();
        println!("{kind:<8} {}", rest.join(" "));
    }
}

/// `sparkd bench --device cuda`; with `profile`, per-kernel device times last.
pub fn run(
    model: &Model,
    gpu_info: &GpuInfo,
    arch: Arch,
    batches: &[usize],
    prefills: &[usize],
    json_out: bool,
    profile: bool,
) -> anyhow::Result<()> {
    let prompt = 16;
    let steps = 32;
    let max_batch = batches.iter().copied().max().unwrap_or(1);
    let max_prefill = prefills.iter().copied().max().unwrap_or(0);
    let ctx = model.config.context_length;
    if let Some(&p) = prefills.iter().find(|&&p| p > ctx) {
        anyhow::bail!("--prefill {p} is past the model's context of {ctx}");
    }
    let kv_tokens = (max_batch * (prompt + steps + 32)).max(max_prefill + 16);
    let mut dev = CudaGpu::new(gpu_info.ordinal, arch)?;
    let (_, total) = dev.memory().unwrap_or((0, gpu_info.memory_bytes));
    emit(
        json!({"kind": "device", "name": gpu_info.name, "sm": arch.to_string(), "memory_bytes": total}),
        json_out,
    );
    emit(
        json!({"kind": "copy", "gb_s": copy_bandwidth(&mut dev)?}),
        json_out,
    );
    let mut b = CudaBackend::new(
        model,
        dev,
        CudaOptions {
            kv_tokens,
            ..CudaOptions::default()
        },
    )?;
    let vocab = model.config.vocab_size;
    let defaults = CudaOptions::default();
    let (mmq_min, gemm_min) = (defaults.mmq_min_tokens, defaults.gemm_min_tokens);
    // On where the device takes it (sm_90+): the default, first in each batch.
    let pdl = b.pdl();
    for &batch in batches {
        let batch = batch.max(1);
        // Batch 1 is where launch overhead shows most: measured without graphs and
        // without programmatic dependent launch too. Batches on the tensor-core mat-mul
        // are measured on the mat-vec too, which shows where the crossover
        // (`mmq_min_tokens`) belongs on this device.
        let mut modes = vec![(true, pdl, mmq_min)];
        if batch == 1 {
            modes.push((false, pdl, mmq_min));
            if pdl {
                modes.push((true, false, mmq_min));
            }
        } else if batch >= mmq_min {
            modes.push((true, pdl, usize::MAX));
        }
        for (n, (graphs, pdl, min_rows)) in modes.into_iter().enumerate() {
            b.set_graphs(graphs);
            b.set_pdl(pdl);
            b.set_matmul_thresholds(min_rows, gemm_min);
            let matmul = if batch >= min_rows { "mmq" } else { "mmv" };
            let run = greedy_decode(&mut b, vocab, batch, prompt, steps)?;
            let secs = run.elapsed.as_secs_f64().max(1e-9);
            let bytes = b.weight_bytes_per_step() * steps as u64
                + run.kv_positions * b.kv_bytes_per_token() as u64;
            let mut line = json!({"kind": "decode", "batch": batch, "graphs": graphs, "pdl": pdl, "matmul": matmul, "tok_s": run.tok_s(), "gb_s": bytes as f64 / secs / 1e9, "served_tok_s": run.wall_tok_s()});
            // The default configuration again with whole logit rows to the host, as a
            // sampled request takes them: what the copy costs the serving loop.
            if n == 0 {
                let whole = decode_run(&mut b, vocab, batch, prompt, steps, Picks::HostLogits)?;
                line["served_logits_tok_s"] = json!(whole.wall_tok_s());
            }
            emit(line, json_out);
        }
    }
    b.set_graphs(true);
    b.set_pdl(pdl);
    b.set_matmul_thresholds(mmq_min, gemm_min);
    for &n in prefills {
        let n = n.max(1);
        let best = prefill_best(&mut b, vocab, n, 2)?;
        emit(
            json!({"kind": "prefill", "tokens": n, "pdl": pdl, "tok_s": n as f64 / best.as_secs_f64().max(1e-9)}),
            json_out,
        );
    }
    if profile {
        // Timing launch by launch is driver code of its own: if it fails, the
        // figures above still stand.
        let prefill = prefills.iter().copied().max();
        match kernel_profiles(&mut b, vocab, batches, prefill) {
            Ok(lines) => lines.into_iter().for_each(|l| emit(l, json_out)),
            Err(e) => emit(
                json!({"kind": "profile_error", "error": format!("{e:#}")}),
                json_out,
            ),
        }
    }
    Ok(())
}

/// Where the device time of a step goes, kernel by kernel: a greedy decode at the
/// smallest and the largest of `batches`, and one prefill of `prefill` tokens. One JSON
/// line per kernel and phase, most time first, with its share of the phase.
pub(crate) fn kernel_profiles<G: Gpu>(
    b: &mut CudaBackend<G>,
    vocab: usize,
    batches: &[usize],
    prefill: Option<usize>,
) -> anyhow::Result<Vec<serde_json::Value>> {
    let mut phases = Vec::new();
    let mut decode_batches: Vec<usize> = [batches.iter().min(), batches.iter().max()]
        .into_iter()
        .flatten()
        .map(|&n| n.max(1))
        .collect();
    decode_batches.dedup();
    for batch in decode_batches {
        b.kernel_profile_begin()?;
        let run = greedy_decode(b, vocab, batch, 16, 8);
        let p = b.kernel_profile_end()?;
        run?;
        phases.push((format!("decode batch {batch}"), p.decode_steps, p.decode));
    }
    if let Some(n) = prefill.filter(|&n| n > 0) {
        b.kernel_profile_begin()?;
        let run = prefill_best(b, vocab, n, 1);
        let p = b.kernel_profile_end()?;
        run?;
        phases.push((format!("prefill {n}"), p.prefill_steps, p.prefill));
    }
    let mut lines = Vec::new();
    for (phase, steps, kernels) in phases {
        let total: f64 = kernels.iter().map(|k| k.time.as_secs_f64()).sum();
        for k in kernels {
            let secs = k.time.as_secs_f64();
            lines.push(json!({
                "kind": "profile",
                "phase": phase,
                "steps": steps,
                "kernel": k.kernel,
                "launches": k.launches,
                "ms_per_step": 1e3 * secs / steps.max(1) as f64,
                "share": if total > 0.0 { secs / total } else { 0.0 },
            }));
        }
    }
    Ok(lines)
}

/// Device-to-device copy bandwidth, (read + write) bytes / time, best of a few.
fn copy_bandwidth(dev: &mut CudaGpu) -> anyhow::Result<f64> {
    let bytes = 256usize << 20;
    let a = dev.alloc(bytes, "copy benchmark source")?;
    let c = dev.alloc(bytes, "copy benchmark destination")?;
    let mut best = Duration::MAX;
    for _ in 0..5 {
        dev.step_begin()?;
        dev.copy(c.ptr(), a.ptr(), bytes)?;
        best = best.min(dev.step_end()?);
    }
    dev.free(a);
    dev.free(c);
    Ok(2.0 * bytes as f64 / best.as_secs_f64().max(1e-9) / 1e9)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::backend::cuda::EmuGpu;
    use crate::model::synth::{synth_gguf, SynthSpec};
    use sparkd_kernels::emu::EmuError;

    /// gpu-parity's two runs through the kernel emulator on a tiny model: the plumbing
    /// a first GPU session depends on (KV sized for the plans, one device per run with
    /// its own options) and each run on its own kernels.
    #[test]
    fn gpu_parity_runs_the_f32_paths_then_the_tensor_core_paths() {
        if let Err(GpuError::Emulator(EmuError::NoCompiler(msg))) = EmuGpu::new() {
            eprintln!("SKIPPED: the kernel emulator needs a C++ compiler: {msg}");
            return;
        }
        let mut s = SynthSpec::tiny();
        s.n_layers = 1;
        let dir = std::env::temp_dir().join(format!("sparkd-gpu-parity-{}", std::process::id()));
        std::fs::create_dir_all(&dir).expect("temp dir");
        let path = dir.join("tiny.gguf");
        synth_gguf(&s)
            .expect("synth")
            .write_file(&path)
            .expect("write");
        // Launches per kernel-name prefix, per run: the f32 run's kernels, then those
        // only the defaults use.
        let prefixes = [
            "mmv_",
            "attn_decode_f32",
            "gemm_",
            "mmq_",
            "convert_f32_f16",
            "attn_decode_f16",
        ];
        let mut counts: Vec<Vec<u64>> = Vec::new();
        let inspect = |emu: &EmuGpu| counts.push(prefixes.map(|p| emu.launches_of(p)).to_vec());
        let runs = parity_runs(&path, EmuGpu::new, inspect, 2, 1).expect("parity runs");
        std::fs::remove_dir_all(&dir).expect("clean up");
        eprintln!(
            "f32 {:?}\ntensor cores {:?}",
            runs.f32_run, runs.tensor_core
        );
        assert_eq!((runs.f32_run.steps, runs.tensor_core.steps), (2, 2));
        assert!(runs.pass(), "parity on the emulator");
        let [first, second] = &counts[..] else {
            panic!("one inspection per run: {counts:?}")
        };
        assert!(first[0] > 0 && first[1] > 0, "{first:?}");
        for (i, prefix) in prefixes.iter().enumerate().skip(2) {
            assert_eq!(first[i], 0, "{prefix} in the f32 run");
            assert!(second[i] > 0, "{prefix} in the second run");
        }
    }

    /// `sparkd bench --profile` on the emulator: each phase holds its own steps'
    /// kernels only, shares add up, and graphs are back on for the steps after it.
    #[test]
    fn kernel_profiles_split_decode_from_prefill_and_restore_graphs() {
        let Ok(emu) = EmuGpu::new() else {
            eprintln!("SKIPPED: the kernel emulator needs a C++ compiler");
            return;
        };
        let mut s = SynthSpec::tiny();
        s.n_layers = 1;
        let bytes = synth_gguf(&s).expect("synth").to_bytes();
        let gguf = crate::gguf::GgufFile::from_bytes(bytes).expect("parse");
        let model = Model::from_file_unpacked(gguf, Path::new("tiny.gguf")).expect("load");
        let opts = CudaOptions {
            kv_tokens: 256,
            ..CudaOptions::default()
        };
        let mut b = CudaBackend::new(&model, emu, opts).expect("upload");
        let vocab = s.vocab_size;
        let lines = kernel_profiles(&mut b, vocab, &[1, 4], Some(40)).expect("profiles");
        let phases = ["decode batch 1", "decode batch 4", "prefill 40"];
        for phase in phases {
            let rows: Vec<_> = lines.iter().filter(|l| l["phase"] == phase).collect();
            let kernels: Vec<&str> = rows.iter().map(|l| l["kernel"].as_str().unwrap()).collect();
            eprintln!("{phase}: {kernels:?}");
            assert!(!rows.is_empty(), "{phase}");
            let share: f64 = rows.iter().map(|l| l["share"].as_f64().unwrap()).sum();
            assert!((share - 1.0).abs() < 1e-9, "{phase}: shares sum to {share}");
            // greedy_decode: the warm-up step and 8 timed ones; a prefill is one step.
            let steps = if phase.starts_with("decode") { 9 } else { 1 };
            assert!(rows.iter().all(|l| l["steps"] == steps), "{phase}");
            let has = |prefix: &str| kernels.iter().any(|k| k.starts_with(prefix));
            assert_eq!(has("attn_decode_"), phase.starts_with("decode"), "{phase}");
            assert_eq!(
                has("attn_prefill_"),
                !phase.starts_with("decode"),
                "{phase}"
            );
        }
        assert!(lines
            .iter()
            .any(|l| l["phase"] == "decode batch 4"
                && l["kernel"].as_str().unwrap().starts_with("mmq_")));
        // Profiling ran launch by launch; decode afterwards is graphed again.
        assert_eq!(b.graph_counts().0, 0);
        greedy_decode(&mut b, vocab, 1, 4, 2).expect("decode");
        assert!(b.graph_counts().0 > 0, "graphs after the profile");
        assert!(b.gpu_mut().take_kernel_times().expect("times").is_empty());
    }
}
