//! Helpers shared by the end-to-end tests: the built binaries, a synthetic model, and a
//! real `sparkd` process on a temporary socket that is killed when the test ends.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::OnceLock;
use std::time::{Duration, Instant};

/// Folder of the built binaries (`target/<profile>`), found from the test executable
/// (`target/<profile>/deps/<test>`). `scripts/test.sh` builds them before the tests.
pub fn bin_dir() -> PathBuf {
    let exe = std::env::current_exe().expect("test executable path");
    let deps = exe.parent().expect("deps folder");
    deps.parent().expect("profile folder").to_path_buf()
}

pub fn bin(name: &str) -> PathBuf {
    let p = bin_dir().join(name);
    assert!(
        p.is_file(),
        "{} is not built; run `cargo build --workspace --bins` first",
        p.display()
    );
    p
}

/// A fresh folder under the system temp dir, removed when dropped.
pub struct TempDir(PathBuf);

impl TempDir {
    pub fn new(tag: &str) -> Self {
        static N: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(0);
        let n = N.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        // Short paths: Unix socket paths are limited to ~108 bytes.
        let p = std::env::temp_dir().join(format!("sp-{tag}-{}-{n}", std::process::id()));
        let _ = std::fs::remove_dir_all(&p);
        std::fs::create_dir_all(&p).expect("temp dir");
        TempDir(p)
    }

    pub fn path(&self) -> &Path {
        &self.0
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// The tiny synthetic model, written once per test binary with `sparkd synth`.
pub fn tiny_model() -> PathBuf {
    static MODEL: OnceLock<PathBuf> = OnceLock::new();
    MODEL
        .get_or_init(|| {
            let dir = std::env::temp_dir().join(format!("sp-model-{}", std::process::id()));
            std::fs::create_dir_all(&dir).expect("model dir");
            let path = dir.join("tiny.gguf");
            let status = Command::new(bin("sparkd"))
                .args(["synth", "--preset", "tiny", "--out"])
                .arg(&path)
                .stdout(Stdio::null())
                .status()
                .expect("run sparkd synth");
            assert!(status.success(), "sparkd synth failed");
            path
        })
        .clone()
}

/// The real default model, when it has been fetched.
pub fn default_model() -> Option<PathBuf> {
    let p = spark_client::models::models_dir().join("smollm2-135m-instruct.gguf");
    p.is_file().then_some(p)
}

/// A running `sparkd serve` on its own socket.
pub struct Daemon {
    pub child: Child,
    pub socket: PathBuf,
    pub dir: TempDir,
    pub log: PathBuf,
}

impl Daemon {
    /// Starts the daemon on `model` with extra flags and waits until it answers.
    pub fn start(model: &Path, extra: &[&str]) -> Daemon {
        Self::start_with_env(model, extra, &[])
    }

    pub fn start_with_env(model: &Path, extra: &[&str], env: &[(&str, &str)]) -> Daemon {
        let dir = TempDir::new("d");
        let socket = dir.path().join("s.sock");
        let log = dir.path().join("sparkd.log");
        let log_file = std::fs::File::create(&log).expect("log file");
        let mut cmd = Command::new(bin("sparkd"));
        cmd.arg("serve")
            .arg("--model")
            .arg(model)
            .arg("--socket")
            .arg(&socket)
            .args(["--threads", "2", "--kv-tokens", "4096"])
            .args(extra)
            .env_remove("SPARKD_SOCKET")
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(log_file);
        for (k, v) in env {
            cmd.env(k, v);
        }
        let child = cmd.spawn().expect("spawn sparkd");
        let mut d = Daemon {
            child,
            socket,
            dir,
            log,
        };
        d.wait_ready(Duration::from_secs(60));
        d
    }

    fn wait_ready(&mut self, limit: Duration) {
        let start = Instant::now();
        while start.elapsed() < limit {
            if let Ok(Some(status)) = self.child.try_wait() {
                panic!("sparkd exited early with {status}: {}", self.log_text());
            }
            if std::os::unix::net::UnixStream::connect(&self.socket).is_ok() {
                return;
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        panic!(
            "sparkd did not come up within {limit:?}: {}",
            self.log_text()
        );
    }

    pub fn log_text(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    pub async fn client(&self) -> spark_client::Client {
        spark_client::Client::connect(&self.socket)
            .await
            .expect("connect to sparkd")
    }

    pub fn signal(&self, sig: i32) {
        // SAFETY: plain kill(2) on our own child's pid.
        unsafe { libc::kill(self.child.id() as i32, sig) };
    }

    /// Sends SIGTERM and waits for the exit status.
    pub fn terminate(&mut self) -> std::process::ExitStatus {
        self.signal(libc::SIGTERM);
        self.child.wait().expect("wait sparkd")
    }
}

impl Drop for Daemon {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}
