//! Helpers shared by the end-to-end tests: the built binaries, a synthetic model, a real
//! `sparkd` process on a temporary socket that is killed when the test ends, a real
//! `spark serve-openai` in front of it, and the load harness (`load`).

pub mod load;

use std::ffi::OsString;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::OnceLock;
use std::time::{Duration, Instant};

/// Folder of the built binaries (`target/<profile>`), found from the running executable:
/// a test (`target/<profile>/deps/<test>`) or a binary of this crate such as the load
/// harness (`target/<profile>/sparkd-load`). `scripts/test.sh` builds them first.
pub fn bin_dir() -> PathBuf {
    let exe = std::env::current_exe().expect("executable path");
    let dir = exe.parent().expect("executable folder");
    if dir.file_name().is_some_and(|n| n == "deps") {
        dir.parent().expect("profile folder").to_path_buf()
    } else {
        dir.to_path_buf()
    }
}

pub fn bin(name: &str) -> PathBuf {
    let p = bin_dir().join(name);
    assert!(
        p.is_file(),
        "{} is not built; run `cargo test --workspace --no-run` first",
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
            synth_model(&path, &["--preset", "tiny"]);
            path
        })
        .clone()
}

/// Writes a synthetic model to `path` with `sparkd synth <args>`.
pub fn synth_model(path: &Path, args: &[&str]) {
    let status = Command::new(bin("sparkd"))
        .arg("synth")
        .args(args)
        .arg("--out")
        .arg(path)
        .stdout(Stdio::null())
        .status()
        .expect("run sparkd synth");
    assert!(status.success(), "sparkd synth {args:?} failed");
}

/// A request for `text` as raw tokens (no chat template), seeded with its id so that
/// sampled runs repeat.
pub fn raw_request(
    id: u64,
    text: &str,
    max_tokens: u32,
) -> spark_client::protocol::GenerateRequest {
    use spark_client::protocol::{GenerateRequest, PromptInput, SamplingParams};
    GenerateRequest {
        id,
        model: None,
        input: PromptInput::Raw {
            text: text.into(),
            special: false,
        },
        sampling: SamplingParams {
            seed: Some(id),
            ..Default::default()
        },
        max_tokens: Some(max_tokens),
        stop: vec![],
        logprobs: None,
    }
}

/// The tiny synthetic model's end-of-generation tokens: `<|endoftext|>` and `<|im_end|>`,
/// two of the three ChatML specials that end its 320-token vocabulary.
pub const TINY_MODEL_EOG: [u32; 2] = [317, 319];

/// `req` with [`TINY_MODEL_EOG`] banned, for a test that needs the stream to run to
/// `max_tokens` (or to be stopped by something else): random weights may otherwise end
/// it at any step.
pub fn to_full_length(
    mut req: spark_client::protocol::GenerateRequest,
) -> spark_client::protocol::GenerateRequest {
    req.sampling
        .logit_bias
        .extend(TINY_MODEL_EOG.map(|id| (id, f32::NEG_INFINITY)));
    req
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
    /// How it was started, for [`Daemon::restart`].
    launch: Launch,
}

struct Launch {
    model: PathBuf,
    extra: Vec<OsString>,
    env: Vec<(OsString, OsString)>,
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
        let launch = Launch {
            model: model.to_path_buf(),
            extra: extra.iter().map(OsString::from).collect(),
            env: env
                .iter()
                .map(|(k, v)| (OsString::from(k), OsString::from(v)))
                .collect(),
        };
        let child = spawn_sparkd(&launch, &socket, &log);
        let mut d = Daemon {
            child,
            socket,
            dir,
            log,
            launch,
        };
        d.wait_ready(Duration::from_secs(60));
        d
    }

    /// Starts a new daemon with the same flags on the same socket path (after this one
    /// ended, e.g. was killed) and waits until it answers. Its log goes on in `log`.
    pub fn restart(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        self.child = spawn_sparkd(&self.launch, &self.socket, &self.log);
        self.wait_ready(Duration::from_secs(60));
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

fn spawn_sparkd(launch: &Launch, socket: &Path, log: &Path) -> Child {
    let log_file = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(log)
        .expect("log file");
    let mut cmd = Command::new(bin("sparkd"));
    cmd.arg("serve")
        .arg("--model")
        .arg(&launch.model)
        .arg("--socket")
        .arg(socket)
        // A KV cache small enough that a load test's warm-up fills it: the prefix cache
        // keeps the blocks of finished prompts, so the cache's pages are touched until
        // all are, which a memory check must not take for a leak.
        .args(["--threads", "2", "--kv-tokens", "4096"])
        .args(&launch.extra)
        .env_remove("SPARKD_SOCKET")
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(log_file);
    for (k, v) in &launch.env {
        cmd.env(k, v);
    }
    cmd.spawn().expect("spawn sparkd")
}

impl Drop for Daemon {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// A running `spark serve-openai` on an ephemeral loopback port, in front of a daemon.
pub struct Shim {
    pub child: Child,
    pub addr: SocketAddr,
    pub log: PathBuf,
    _dir: TempDir,
}

impl Shim {
    /// Starts the shim for the daemon on `socket` and waits until it listens.
    pub fn start(socket: &Path, env: &[(&str, &str)]) -> Shim {
        let dir = TempDir::new("shim");
        let log = dir.path().join("shim.log");
        let log_file = std::fs::File::create(&log).expect("shim log file");
        let mut cmd = Command::new(bin("spark"));
        cmd.arg("--socket")
            .arg(socket)
            .args(["serve-openai", "--listen", "127.0.0.1:0"])
            .env_remove("SPARKD_API_KEY")
            .env("SPARKD_NO_AUTOSTART", "1")
            // Plain log lines, so the listen address can be read from them.
            .env("NO_COLOR", "1")
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(log_file);
        for (k, v) in env {
            cmd.env(k, v);
        }
        let mut child = cmd.spawn().expect("spawn spark serve-openai");
        let start = Instant::now();
        let addr = loop {
            let text = std::fs::read_to_string(&log).unwrap_or_default();
            if let Some(addr) = listen_address(&text) {
                break addr;
            }
            if let Ok(Some(status)) = child.try_wait() {
                panic!("spark serve-openai exited early with {status}: {text}");
            }
            assert!(
                start.elapsed() < Duration::from_secs(30),
                "spark serve-openai did not report its address: {text}"
            );
            std::thread::sleep(Duration::from_millis(20));
        };
        Shim {
            child,
            addr,
            log,
            _dir: dir,
        }
    }

    /// `http://127.0.0.1:<port><path>`.
    pub fn url(&self, path: &str) -> String {
        format!("http://{}{path}", self.addr)
    }

    pub fn log_text(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }
}

impl Drop for Shim {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// The address in the shim's `serving the OpenAI API listen=<addr>` line, with any
/// terminal colour codes stripped.
fn listen_address(log: &str) -> Option<SocketAddr> {
    let line = log.lines().find(|l| l.contains("serving the OpenAI API"))?;
    let plain = strip_ansi(line);
    let rest = &plain[plain.find("listen=")? + "listen=".len()..];
    rest.split_whitespace().next()?.parse().ok()
}

/// `s` without terminal colour codes (the daemon colours its log even into a file).
/// Runs `sparkd` with `args` until it exits (at most a minute; a panic otherwise):
/// its exit status and its stderr, colours stripped.
pub fn run_sparkd_to_exit<S: AsRef<std::ffi::OsStr>>(
    args: &[S],
) -> (std::process::ExitStatus, String) {
    let dir = TempDir::new("run");
    let log = dir.path().join("err.log");
    let mut child = Command::new(bin("sparkd"))
        .args(args)
        .env_remove("SPARKD_SOCKET")
        .env("NO_COLOR", "1")
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(std::fs::File::create(&log).expect("log file"))
        .spawn()
        .expect("spawn sparkd");
    let started = std::time::Instant::now();
    let status = loop {
        if let Some(status) = child.try_wait().expect("wait for sparkd") {
            break status;
        }
        if started.elapsed() > Duration::from_secs(60) {
            let _ = child.kill();
            panic!("sparkd did not exit within a minute");
        }
        std::thread::sleep(Duration::from_millis(20));
    };
    let stderr = strip_ansi(&std::fs::read_to_string(&log).unwrap_or_default());
    (status, stderr)
}

pub fn strip_ansi(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    let mut chars = s.chars();
    while let Some(c) = chars.next() {
        if c == '\u{1b}' {
            // CSI: ESC '[' parameters, ending with a letter.
            for c in chars.by_ref() {
                if c.is_ascii_alphabetic() {
                    break;
                }
            }
        } else {
            out.push(c);
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn listen_address_is_read_with_or_without_colours() {
        let plain = "2025-01-01T00:00:00Z  INFO spark_client::openai: serving the OpenAI API listen=127.0.0.1:4321 socket=/tmp/s";
        assert_eq!(
            listen_address(plain),
            Some("127.0.0.1:4321".parse().unwrap())
        );
        let coloured = "\u{1b}[32m INFO\u{1b}[0m serving the OpenAI API \u{1b}[3mlisten\u{1b}[0m\u{1b}[2m=\u{1b}[0m127.0.0.1:99 x";
        assert_eq!(
            listen_address(coloured),
            Some("127.0.0.1:99".parse().unwrap())
        );
        assert_eq!(listen_address("nothing here"), None);
    }
}
