//! End-to-end: choosing the compute device. On a machine without a usable GPU,
//! `--device auto` serves from the CPU (and says why in the log), while `--device cuda`,
//! `sparkd gpu-parity` and `sparkd bench --device cuda` stop at once with a clear error
//! and the exit codes scripts/gpu-check.sh relies on. On a machine with a GPU the
//! no-GPU expectations are skipped with a message.

use sparkd_e2e::{run_sparkd_to_exit, strip_ansi, tiny_model, Daemon, TempDir};

/// Whether this machine has an NVIDIA driver at all (then the no-GPU checks do not apply).
fn driver_present() -> bool {
    ["/dev/nvidia0", "/dev/nvidiactl"]
        .iter()
        .any(|p| std::path::Path::new(p).exists())
}

/// Runs sparkd with `args` to completion: exit code and stderr.
fn run(args: &[&str]) -> (Option<i32>, String) {
    let (status, stderr) = run_sparkd_to_exit(args);
    (status.code(), stderr)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn auto_serves_from_the_cpu_without_a_gpu_and_status_says_so() {
    let d = Daemon::start(&tiny_model(), &["--device", "auto"]);
    let status = d.client().await.status().await.expect("status");
    if driver_present() {
        eprintln!(
            "skipped: an NVIDIA driver is present (status: {})",
            status.backend
        );
        return;
    }
    assert_eq!(status.backend, "cpu");
    assert!(status.device.contains("threads"), "{}", status.device);
    let log = strip_ansi(&d.log_text());
    assert!(
        log.contains("compute device: CPU") && log.contains("libcuda"),
        "the log says why auto chose the CPU: {log}"
    );
}

#[test]
fn cuda_without_a_gpu_is_a_clear_error_at_start() {
    if driver_present() {
        eprintln!("skipped: an NVIDIA driver is present");
        return;
    }
    let dir = TempDir::new("cuda");
    let socket = dir.path().join("s.sock");
    let model = tiny_model();
    for device in ["cuda", "cuda:1"] {
        let (code, stderr) = run(&[
            "serve",
            "--model",
            model.to_str().unwrap(),
            "--socket",
            socket.to_str().unwrap(),
            "--device",
            device,
        ]);
        assert_eq!(code, Some(1), "{device}: {stderr}");
        assert!(
            stderr.contains("--device cuda") && stderr.contains("no NVIDIA driver"),
            "{device}: {stderr}"
        );
        assert!(!stderr.contains("panicked"), "{stderr}");
        assert!(!socket.exists(), "refused before binding the socket");
    }
    let (code, stderr) = run(&["serve", "--device", "gpu"]);
    assert_eq!(
        code,
        Some(2),
        "a malformed device is a usage error: {stderr}"
    );
    assert!(
        stderr.contains("expected auto, cpu, cuda or cuda:N"),
        "{stderr}"
    );
}

#[test]
fn gpu_parity_and_cuda_bench_fail_cleanly_without_a_gpu() {
    if driver_present() {
        eprintln!("skipped: an NVIDIA driver is present");
        return;
    }
    let model = tiny_model();
    let m = model.to_str().unwrap();
    // gpu-check.sh: 0 parity, 1 mismatch, anything else an error.
    let (code, stderr) = run(&["gpu-parity", "--model", m, "--steps", "4"]);
    assert_eq!(code, Some(2), "{stderr}");
    assert!(stderr.contains("no CUDA device"), "{stderr}");
    assert!(!stderr.contains("panicked"), "{stderr}");

    let (code, stderr) = run(&[
        "bench",
        "--device",
        "cuda",
        "--model",
        m,
        "--batches",
        "1,8",
        "--prefill",
        "64",
        "--json",
    ]);
    assert_eq!(code, Some(1), "{stderr}");
    assert!(stderr.contains("no CUDA device"), "{stderr}");
    assert!(!stderr.contains("panicked"), "{stderr}");
}
