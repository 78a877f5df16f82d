//! End-to-end on `--device cuda` without a GPU: the real `sparkd` binary with the
//! stand-in CUDA driver (`kernels/emu/fake_libcuda.cpp`, the kernel emulator behind the
//! driver API) first on its `LD_LIBRARY_PATH`. What runs is everything a GPU machine
//! runs except the silicon: the device probe, NVRTC compiling every module, module
//! loading, allocation and copies, launches, graph capture and replay, events, the
//! daemon's CUDA backend and its shutdown. The stand-in enforces the driver's rules
//! (current context, asynchronous streams, capture restrictions, launch limits,
//! pointers inside allocations) and explains a breach on stderr as "fake libcuda:".
//!
//! Needs NVRTC (scripts/install-cuda-wheels.sh; `scripts/test-cuda-compile.sh` runs
//! these tests with it) and a C++ compiler. Without them the tests say so and pass,
//! unless SPARKD_REQUIRE_NVRTC=1, as in CI, makes a missing NVRTC a failure.

use std::ffi::OsString;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::OnceLock;
use std::time::{Duration, Instant};

use futures::StreamExt;
use spark_client::protocol::*;
use spark_client::GenerationEvent;
use sparkd_e2e::{
    bin, raw_request, strip_ansi, synth_model, tiny_model, to_full_length, Daemon, TempDir,
};

const FAKE_MARK: &str = "fake libcuda:";

/// `LD_LIBRARY_PATH` with the stand-in driver first, once its prerequisites are known
/// to be present and the kernels for its default sm_90 are in the cache (so that a
/// daemon's start-up is module loading, not minutes of NVRTC); `None` to skip.
fn fake_driver() -> Option<OsString> {
    static SETUP: OnceLock<Result<OsString, String>> = OnceLock::new();
    let setup = SETUP.get_or_init(|| {
        sparkd_kernels::load_nvrtc().map_err(|e| format!("NVRTC: {e}"))?;
        let dir = sparkd_kernels::emu::fake_driver_dir().map_err(|e| e.to_string())?;
        sparkd_kernels::compile("sm_90").map_err(|e| format!("compiling for sm_90: {e}"))?;
        let mut path = OsString::from(dir);
        if let Some(old) = std::env::var_os("LD_LIBRARY_PATH").filter(|p| !p.is_empty()) {
            path.push(":");
            path.push(old);
        }
        Ok(path)
    });
    sparkd_kernels::emu::setup_or_skip(
        setup.clone(),
        "the stand-in CUDA driver needs NVRTC and a C++ compiler",
    )
}

/// Runs sparkd with `args` and `env` (plus the stand-in driver) to its exit, within
/// `limit`: exit code, stdout, stderr without colours.
fn run(
    lib_path: &OsString,
    args: &[&str],
    env: &[(&str, &str)],
    limit: Duration,
) -> (Option<i32>, String, String) {
    let dir = TempDir::new("fake-cuda");
    let (out, err) = (dir.path().join("out"), dir.path().join("err"));
    let mut cmd = Command::new(bin("sparkd"));
    cmd.args(args)
        .env("LD_LIBRARY_PATH", lib_path)
        .env("NO_COLOR", "1")
        .env_remove("SPARKD_SOCKET")
        .stdin(Stdio::null())
        .stdout(std::fs::File::create(&out).expect("stdout file"))
        .stderr(std::fs::File::create(&err).expect("stderr file"));
    for (k, v) in env {
        cmd.env(k, v);
    }
    let mut child = cmd.spawn().expect("spawn sparkd");
    let started = Instant::now();
    let status = loop {
        if let Some(status) = child.try_wait().expect("wait for sparkd") {
            break status;
        }
        if started.elapsed() > limit {
            let _ = child.kill();
            panic!(
                "sparkd {args:?} did not exit within {limit:?}: {}",
                std::fs::read_to_string(&err).unwrap_or_default()
            );
        }
        std::thread::sleep(Duration::from_millis(50));
    };
    let read = |p: &Path| std::fs::read_to_string(p).unwrap_or_default();
    (status.code(), read(&out), strip_ansi(&read(&err)))
}

/// A one-layer model of `preset` (parity runs every step on the emulator).
fn one_layer_model(dir: &TempDir, preset: &str) -> PathBuf {
    let path = dir.path().join(format!("{preset}-1layer.gguf"));
    synth_model(&path, &["--preset", preset, "--layers", "1"]);
    path
}

/// `sparkd gpu-parity`, the first thing scripts/gpu-check.sh runs on a GPU machine:
/// both of its runs (f32 paths, then tensor cores with graphs) through the driver API,
/// on the tiny model (Q4_1, head size 16) and the small one (Q4_K/Q6_K, head size 64,
/// so the tensor-core prefill attention).
#[test]
fn gpu_parity_passes_through_the_driver_api() {
    let Some(lib) = fake_driver() else { return };
    let dir = TempDir::new("fake-parity");
    // The tiny model under a driver that will not page-lock host memory (a sandbox, a
    // locked-memory limit): the logit rows go to ordinary memory, with a warning, and
    // parity holds all the same. (Pinned rows are what every other test here uses.)
    for (preset, env) in [
        ("tiny", &[("SPARKD_FAKE_CUDA_NO_PINNED", "1")][..]),
        ("small", &[][..]),
    ] {
        let model = one_layer_model(&dir, preset);
        let m = model.to_str().unwrap();
        let (code, stdout, stderr) = run(
            &lib,
            &["gpu-parity", "--model", m, "--steps", "2"],
            env,
            Duration::from_secs(900),
        );
        assert_eq!(code, Some(0), "{preset}: {stdout}\n{stderr}");
        assert!(!stderr.contains(FAKE_MARK), "{preset}: {stderr}");
        assert_eq!(
            stderr.contains("cannot page-lock the host logit rows"),
            !env.is_empty(),
            "{preset}: {stderr}"
        );
        let line = stdout.lines().last().expect("one JSON line");
        let v: serde_json::Value = serde_json::from_str(line).expect("JSON");
        assert_eq!(v["pass"], true, "{preset}: {line}");
        assert_eq!(v["steps"], 2, "{preset}: {line}");
        assert_eq!(v["tc_steps"], 2, "{preset}: {line}");
        let device = v["device"].as_str().unwrap();
        assert!(device.contains("fake GPU"), "{preset}: {line}");
        assert!(
            v["max_rel_err"].as_f64().unwrap() < 1e-2,
            "{preset}: {line}"
        );
        // The f32 paths against the CPU's exact reference: summation order only.
        assert!(
            v["f32_max_rel_err"].as_f64().unwrap() < 1e-4,
            "{preset}: {line}"
        );
    }
}

/// A GB10-like device (compute capability 12.1): the kernels compiled for sm_121 load
/// (the stand-in refuses SASS for another architecture) and serve.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_compute_capability_12_1_device_runs_the_sm_121_build() {
    let Some(lib) = fake_driver() else { return };
    // Compiled here first, so the daemon's start-up reads the cache instead of running
    // NVRTC inside Daemon::start's time limit.
    sparkd_kernels::compile("sm_121").expect("compile for sm_121");
    let lib = lib.to_str().expect("UTF-8 library path").to_string();
    let mut d = Daemon::start_with_env(
        &tiny_model(),
        &["--device", "cuda"],
        &[
            ("LD_LIBRARY_PATH", lib.as_str()),
            ("SPARKD_FAKE_CUDA_CC", "12.1"),
        ],
    );
    let c = d.client().await;
    let status = c.status().await.expect("status");
    assert!(status.device.contains("(sm_121)"), "{}", status.device);
    let (ids, done) = tokens_and_done(&c, greedy(1, "hello", 3)).await;
    assert_eq!((ids.len(), done.finish_reason), (3, FinishReason::Length));
    assert!(d.terminate().success(), "{}", d.log_text());
    assert!(!d.log_text().contains(FAKE_MARK), "{}", d.log_text());
}

fn greedy(id: u64, text: &str, max_tokens: u32) -> GenerateRequest {
    GenerateRequest {
        sampling: SamplingParams {
            temperature: 0.0,
            ..Default::default()
        },
        ..raw_request(id, text, max_tokens)
    }
}

async fn tokens_and_done(c: &spark_client::Client, req: GenerateRequest) -> (Vec<u32>, DoneEvent) {
    let mut gen = c.generate(req).await.expect("generate accepted");
    let mut ids = Vec::new();
    while let Some(ev) = gen.next().await {
        match ev.expect("stream event") {
            GenerationEvent::Prefilled(_)
            | GenerationEvent::ToolCall(_)
            | GenerationEvent::ToolCallDelta(_)
            | GenerationEvent::Reasoning(_)
            | GenerationEvent::TokenBytes(_) => {}
            GenerationEvent::Token(t) => ids.push(t.token),
            GenerationEvent::Done(done) => return (ids, done),
        }
    }
    panic!("stream ended without Done");
}

/// The daemon on `--device cuda`: status names the device, two concurrent requests
/// share decode steps (a batch of two, on graphs) and each gets its own device-timed
/// final frame, and SIGTERM shuts down cleanly (the backend's teardown included).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_daemon_serves_on_cuda_through_the_driver_api() {
    let Some(lib) = fake_driver() else { return };
    let lib = lib.to_str().expect("UTF-8 library path").to_string();
    let mut d = Daemon::start_with_env(
        &tiny_model(),
        &["--device", "cuda"],
        &[
            ("LD_LIBRARY_PATH", lib.as_str()),
            // The engine's debug lines say how much of each prompt the prefix cache gave.
            ("RUST_LOG", "info,sparkd::engine=debug"),
        ],
    );
    let c = d.client().await;
    let status = c.status().await.expect("status");
    assert_eq!(status.backend, "cuda");
    assert!(status.device.contains("fake GPU"), "{}", status.device);

    let (a, b) = tokio::join!(
        tokens_and_done(&c, greedy(1, "hello there", 4)),
        tokens_and_done(&c, greedy(2, "hello there", 4)),
    );
    for (ids, done) in [&a, &b] {
        assert_eq!(ids.len(), 4);
        assert_eq!(done.finish_reason, FinishReason::Length);
        assert_eq!(done.usage.completion_tokens, 4);
        let t = &done.timings;
        assert!(t.ttft_ms.is_some_and(|ms| ms > 0.0), "{t:?}");
        assert!(t.decode_tps.is_some_and(|tps| tps > 0.0), "{t:?}");
        assert!(t.generation_ms > 0.0, "{t:?}");
    }
    assert_eq!(
        a.0, b.0,
        "one prompt, greedy: the same tokens in either row"
    );
    assert_eq!(
        (a.1.id, b.1.id),
        (1, 2),
        "each final frame is its own request's"
    );

    // Plain greedy rows are picked on the device and their logits stay there; asking
    // for logprobs takes the whole row to the host sampler instead. Both pick the same
    // tokens, in one batch, beside a sampled request (whole rows too).
    let with_logprobs = GenerateRequest {
        logprobs: Some(1),
        ..greedy(4, "hello there", 4)
    };
    let sampled = to_full_length(GenerateRequest {
        sampling: SamplingParams {
            temperature: 0.8,
            seed: Some(7),
            ..Default::default()
        },
        ..raw_request(5, "hello there", 4)
    });
    let (device, host, other) = tokio::join!(
        tokens_and_done(&c, greedy(3, "hello there", 4)),
        tokens_and_done(&c, with_logprobs),
        tokens_and_done(&c, sampled),
    );
    assert_eq!(device.0, a.0, "the device's pick is the host's");
    assert_eq!(host.0, a.0, "the device's pick is the host's");
    assert_eq!(other.0.len(), 4);

    // A logit bias keeps a greedy request's picks on the device, added there before the
    // argmax; with logprobs the host sampler adds it. Banning the unbiased first token
    // and lifting another (twice), both pick the same tokens.
    let lift = if a.0[0] == 5 { 6 } else { 5 };
    let biased = |id: u64, logprobs: Option<u8>| GenerateRequest {
        logprobs,
        sampling: SamplingParams {
            logit_bias: vec![(a.0[0], f32::NEG_INFINITY), (lift, 0.5), (lift, 0.25)],
            ..greedy(id, "hello there", 4).sampling
        },
        ..greedy(id, "hello there", 4)
    };
    let (on_device, on_host) = tokio::join!(
        tokens_and_done(&c, biased(6, None)),
        tokens_and_done(&c, biased(7, Some(1))),
    );
    assert_eq!(
        on_device.0, on_host.0,
        "the device adds the bias as the host"
    );
    assert_eq!(on_device.0.len(), 4);
    assert_ne!(on_device.0[0], a.0[0], "the unbiased first pick is banned");

    // JSON output takes a greedy row to the host, where the mask holds back the `}` a
    // bias makes the model prefer until `{` has opened an object, which it then closes.
    let close_first = GenerateRequest {
        sampling: SamplingParams {
            logit_bias: vec![(u32::from(b'}'), 60.0), (u32::from(b'{'), 30.0)],
            ..greedy(10, "hello there", 4).sampling
        },
        ..greedy(10, "hello there", 4)
    };
    let mut json = c
        .generate_as(close_first, OutputFormat::JsonObject)
        .await
        .expect("generate accepted");
    let (mut text, mut finish) = (String::new(), None);
    while let Some(ev) = json.next().await {
        match ev.expect("stream event") {
            GenerationEvent::Prefilled(_)
            | GenerationEvent::ToolCall(_)
            | GenerationEvent::ToolCallDelta(_)
            | GenerationEvent::Reasoning(_)
            | GenerationEvent::TokenBytes(_) => {}
            GenerationEvent::Token(t) => text.push_str(&t.text),
            GenerationEvent::Done(done) => finish = Some(done.finish_reason),
        }
    }
    assert_eq!((text.as_str(), finish), ("{}", Some(FinishReason::Stop)));

    // A prompt of several KV blocks, twice: the second takes all its whole blocks from
    // the prefix cache in device memory, computes only the rest and answers the same.
    let long = "A prompt long enough to fill a few blocks of the KV cache, asked twice.";
    let first = tokens_and_done(&c, greedy(8, long, 4)).await;
    let again = tokens_and_done(&c, greedy(9, long, 4)).await;
    assert_eq!(first.0, again.0, "a reused prefix changes no token");
    let n_prompt = again.1.usage.prompt_tokens as usize;
    assert!(n_prompt > 48, "a prompt of {n_prompt} tokens");
    let reused = format!("reused_prompt_tokens={}", (n_prompt - 1) / 16 * 16);

    let exit = d.terminate();
    assert!(exit.success(), "exit status {exit}: {}", d.log_text());
    let log = strip_ansi(&d.log_text());
    assert!(log.contains(&reused), "{log}");
    assert!(!log.contains(FAKE_MARK), "{log}");
    assert!(!log.contains("panicked"), "{log}");
}

/// What a user sees when the GPU is there but unusable: `--device cuda` stops with the
/// reason, `--device auto` falls back to the CPU and logs why.
#[test]
fn unusable_gpus_are_clear_errors_under_cuda_and_the_cpu_under_auto() {
    let Some(lib) = fake_driver() else { return };
    let model = tiny_model();
    let dir = TempDir::new("fake-errors");
    let socket = dir.path().join("s.sock");
    let serve = |device: &str, env: &[(&str, &str)]| {
        run(
            &lib,
            &[
                "serve",
                "--model",
                model.to_str().unwrap(),
                "--socket",
                socket.to_str().unwrap(),
                "--device",
                device,
            ],
            env,
            Duration::from_secs(120),
        )
    };
    let cases: [(&str, &str, &str); 3] = [
        ("SPARKD_FAKE_CUDA_DEVICES", "0", "CUDA_ERROR_NO_DEVICE"),
        (
            "SPARKD_FAKE_CUDA_CC",
            "7.5",
            "compute capability 7.5) is not supported",
        ),
        ("SPARKD_FAKE_CUDA_MEMORY_MIB", "0", "out of device memory"),
    ];
    for (var, value, says) in cases {
        let (code, _, stderr) = serve("cuda", &[(var, value)]);
        assert_eq!(code, Some(1), "{var}={value}: {stderr}");
        assert!(stderr.contains("--device cuda"), "{var}={value}: {stderr}");
        assert!(stderr.contains(says), "{var}={value}: {stderr}");
        assert!(!stderr.contains("panicked"), "{var}={value}: {stderr}");
        assert!(!socket.exists(), "refused before binding the socket");
    }

    // Under auto the same GPUs are passed over: the daemon comes up on the CPU and the
    // log says why; a usable one is taken.
    let rt = tokio::runtime::Runtime::new().expect("runtime");
    let backend_under_auto = |env: &[(&str, &str)]| {
        let mut env = env.to_vec();
        env.push(("LD_LIBRARY_PATH", lib.to_str().unwrap()));
        let d = Daemon::start_with_env(&model, &["--device", "auto"], &env);
        let status = rt.block_on(async { d.client().await.status().await.expect("status") });
        (status.backend, strip_ansi(&d.log_text()))
    };
    for (var, value, says) in cases {
        let (backend, log) = backend_under_auto(&[(var, value)]);
        assert_eq!(backend, "cpu", "{var}={value}");
        assert!(log.contains(says), "{var}={value}: the log says why: {log}");
    }
    let (backend, log) = backend_under_auto(&[]);
    assert_eq!(backend, "cuda", "{log}");
    assert!(log.contains("programmatic_launch=true"), "{log}");
    // A driver that refuses programmatic dependent launch: the start-up probe turns it
    // off, with a warning, and the GPU still serves.
    let (backend, log) = backend_under_auto(&[("SPARKD_FAKE_CUDA_NO_PDL", "1")]);
    assert_eq!(backend, "cuda", "{log}");
    assert!(
        log.contains("programmatic dependent launch refused")
            && log.contains("programmatic_launch=false"),
        "{log}"
    );
}

/// gpu-check.sh with a time budget already spent: no parity run starts, each model is
/// said as skipped, and the run still ends well (what it skipped is not a failure).
#[test]
fn gpu_check_script_skips_parity_past_its_time_budget() {
    let Some(lib) = fake_driver() else { return };
    let work = TempDir::new("gpu-check-budget");
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("../scripts/gpu-check.sh");
    let out = Command::new("bash")
        .arg(&script)
        .args(["--smoke", "--skip-bench", "--budget", "1", "--work"])
        .arg(work.path())
        .env("SPARKD", bin("sparkd"))
        .env("LD_LIBRARY_PATH", &lib)
        .stdin(Stdio::null())
        .output()
        .expect("run gpu-check.sh");
    let stdout = String::from_utf8_lossy(&out.stdout);
    let all = format!("{stdout}\n{}", String::from_utf8_lossy(&out.stderr));
    assert!(out.status.success(), "{all}");
    assert!(
        stdout
            .lines()
            .any(|l| l.trim_start().starts_with("smoke-llama-1layer")
                && l.ends_with("skipped (time budget)")),
        "{all}"
    );
    assert!(
        stdout.contains("all checks that ran passed; 1 parity model(s) skipped"),
        "{all}"
    );
    let bad = Command::new("bash")
        .arg(&script)
        .args(["--smoke", "--budget", "soon"])
        .env("SPARKD", bin("sparkd"))
        .output()
        .expect("run gpu-check.sh");
    assert_eq!(bad.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&bad.stderr).contains("--budget takes whole seconds"));
}

/// scripts/gpu-check.sh, the one run a GPU machine gets, rehearsed end to end: its
/// `--smoke` mode (tiny models) through the stand-in, so that what it parses from
/// sparkd and what it prints are tested before the first real card runs it.
#[test]
fn gpu_check_script_rehearses_through_the_stand_in() {
    let Some(lib) = fake_driver() else { return };
    let work = TempDir::new("gpu-check");
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("../scripts/gpu-check.sh");
    let mut cmd = Command::new("bash");
    let results = work.path().join("results");
    cmd.arg(&script)
        .args(["--smoke", "--work"])
        .arg(work.path().join("work"))
        .arg("--results")
        .arg(&results)
        .env("SPARKD", bin("sparkd"))
        .env("LD_LIBRARY_PATH", &lib)
        .env("NO_COLOR", "1")
        .stdin(Stdio::null());
    // The kernels fake_driver() compiled, not a cold compile in the script's work dir.
    let cache_root =
        sparkd_kernels::KernelCache::default_dir().and_then(|d| d.parent().map(Path::to_path_buf));
    if let Some(root) = cache_root {
        cmd.env(sparkd_kernels::CACHE_ENV, root);
    }
    let out = cmd.output().expect("run gpu-check.sh");
    let stdout = String::from_utf8_lossy(&out.stdout);
    let log = std::fs::read_to_string(results.join("gpu-check.log")).unwrap_or_default();
    let all = format!(
        "{stdout}\n{}\nlog:\n{log}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(out.status.success(), "{all}");
    assert!(!log.contains(FAKE_MARK), "{all}");
    // --results holds what it printed and measured, not the models.
    let printed = std::fs::read_to_string(results.join("gpu-check.txt")).unwrap_or_default();
    assert_eq!(printed, stdout, "gpu-check.txt is the output");
    let bench = std::fs::read_to_string(results.join("bench.jsonl")).unwrap_or_default();
    assert!(bench.lines().count() > 5, "bench.jsonl: {bench}");
    let kept: Vec<_> = std::fs::read_dir(&results)
        .expect("results dir")
        .map(|e| e.expect("entry").file_name().into_string().expect("UTF-8"))
        .collect();
    assert!(kept.iter().all(|f| !f.ends_with(".gguf")), "{kept:?}");
    // The parity row: each run's error in scientific notation and 2 of 2 steps.
    let row = stdout
        .lines()
        .find(|l| l.trim_start().starts_with("smoke-llama-1layer"))
        .unwrap_or_else(|| panic!("no parity row: {all}"));
    let cols: Vec<&str> = row.split_whitespace().collect();
    assert_eq!(cols.len(), 6, "{row}");
    assert!(cols[1].contains("e-") && cols[3].contains("e-"), "{row}");
    assert_eq!(
        (cols[2], cols[4], cols[5]),
        ("2+0/2", "2+0/2", "ok"),
        "{row}"
    );
    for expected in [
        "where the time goes",
        "decode batch 1 (9 steps)",
        "decode batch 32 (9 steps)",
        "prefill 128 (1 steps)",
        "device   sparkd fake GPU (CPU emulator) (sm_90)",
        "device copy",
        "decode batch 1, no graphs",
        "decode batch 1, no PDL",
        "decode batch 32, mat-vec",
        "prefill 64",
        "decode batch 32 / batch 1",
        "prefill 2048 tokens            not measured",
        "gpu-check: all checks passed",
    ] {
        assert!(stdout.contains(expected), "{expected:?} missing: {all}");
    }
    // The serving loop's figures under each batch's default line, both numbers.
    let served: Vec<&str> = stdout
        .lines()
        .filter(|l| l.contains("served (host clock)"))
        .collect();
    assert_eq!(served.len(), 2, "batches 1 and 32: {all}");
    for line in served {
        let whole = line
            .split(", ")
            .nth(1)
            .and_then(|t| t.split_whitespace().next());
        assert!(
            whole.is_some_and(|v| v.parse::<f64>().is_ok_and(|v| v > 0.0)),
            "{line}"
        );
    }
    // Every measured figure is a number, not an empty field.
    for line in stdout.lines().filter(|l| l.contains("tok/s")) {
        let figure = line
            .split("tok/s")
            .next()
            .and_then(|head| head.split_whitespace().last())
            .unwrap_or("");
        assert!(figure.parse::<f64>().is_ok_and(|v| v > 0.0), "{line}");
    }
}
