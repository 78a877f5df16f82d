//! Starting sparkd on demand: the binary next to `spark`, detached into its own session,
//! logging to a file, left resident after this command ends. Its pid goes to
//! `<socket>.pid` so that `spark stop` can end it.

use std::{
    ffi::OsString,
    fs::{self, OpenOptions},
    io,
    os::unix::process::CommandExt,
    path::{Path, PathBuf},
    process::{Child, Command, Stdio},
    time::{Duration, Instant},
};

use anyhow::Context;
use spark_client::{Client, ClientError};

use crate::{exit::Unavailable, output};

/// Loading a large model from a cold page cache takes a while.
const READY_TIMEOUT: Duration = Duration::from_secs(120);
const POLL_INTERVAL: Duration = Duration::from_millis(100);

pub async fn start(socket: &Path, model: Option<&str>) -> anyhow::Result<Client> {
    let sparkd = sparkd_binary()?;
    let log_path = log_path(socket);
    let (mut child, log_start) = spawn(&sparkd, socket, model, &log_path)?;
    let mut spinner = Spinner::new(output::stderr_is_tty());
    let started = Instant::now();
    let log = LogFile {
        path: log_path,
        start: log_start,
    };
    let result = wait_until_ready(socket, &mut child, &log, started, &mut spinner).await;
    spinner.clear();
    result
}

/// `sparkd` from the directory `spark` itself lives in: installed together, they match.
fn sparkd_binary() -> anyhow::Result<PathBuf> {
    let exe = std::env::current_exe().context("cannot locate the spark executable")?;
    let candidate = exe.with_file_name("sparkd");
    if candidate.is_file() {
        Ok(candidate)
    } else {
        Err(Unavailable(format!(
            "sparkd is not running, and there is no sparkd next to spark to start (looked for {})",
            candidate.display()
        ))
        .into())
    }
}

/// `$XDG_STATE_HOME/sparkd/sparkd.log`, else `~/.local/state/sparkd/sparkd.log`, else
/// `sparkd.log` beside the socket.
fn log_path(socket: &Path) -> PathBuf {
    let state_home = std::env::var_os("XDG_STATE_HOME")
        .map(PathBuf::from)
        .filter(|p| p.is_absolute())
        .or_else(|| std::env::var_os("HOME").map(|home| PathBuf::from(home).join(".local/state")));
    match state_home {
        Some(dir) => dir.join("sparkd").join("sparkd.log"),
        None => socket.with_file_name("sparkd.log"),
    }
}

/// The pid file of a daemon `spark` started on `socket`.
pub fn pid_path(socket: &Path) -> PathBuf {
    let mut name = OsString::from(socket.as_os_str());
    name.push(".pid");
    PathBuf::from(name)
}

/// The daemon's log, and where this start's output begins in it (it is appended to).
struct LogFile {
    path: PathBuf,
    start: u64,
}

fn spawn(
    sparkd: &Path,
    socket: &Path,
    model: Option<&str>,
    log_path: &Path,
) -> anyhow::Result<(Child, u64)> {
    if let Some(dir) = log_path.parent() {
        fs::create_dir_all(dir).with_context(|| format!("cannot create {}", dir.display()))?;
    }
    let log = OpenOptions::new()
        .create(true)
        .append(true)
        .open(log_path)
        .with_context(|| format!("cannot open the daemon log {}", log_path.display()))?;
    let start = log.metadata().map_or(0, |meta| meta.len());
    let mut command = Command::new(sparkd);
    command.arg("serve").arg("--socket").arg(socket);
    if let Some(model) = model {
        command.arg("--model").arg(model);
    }
    command
        .stdin(Stdio::null())
        .stdout(log.try_clone()?)
        .stderr(log);
    detach(&mut command);
    let child = command
        .spawn()
        .with_context(|| format!("cannot start {}", sparkd.display()))?;
    Ok((child, start))
}

/// Runs the child in a session of its own, so that the terminal's Ctrl-C and hangup do
/// not reach the resident daemon.
fn detach(command: &mut Command) {
    // SAFETY: the closure runs between fork and exec and calls only setsid(2), which is
    // async-signal-safe, allocates nothing and touches no shared state.
    unsafe {
        command.pre_exec(|| {
            if libc::setsid() == -1 {
                return Err(io::Error::last_os_error());
            }
            Ok(())
        });
    }
}

async fn wait_until_ready(
    socket: &Path,
    child: &mut Child,
    log: &LogFile,
    started: Instant,
    spinner: &mut Spinner,
) -> anyhow::Result<Client> {
    loop {
        match Client::connect(socket).await {
            Ok(client) => {
                // Only a daemon of ours that is still running gets a pid file: if ours
                // exited, another spark won a start race and owns the socket.
                if matches!(child.try_wait(), Ok(None)) {
                    let pid_file = pid_path(socket);
                    if let Err(err) = fs::write(&pid_file, format!("{}\n", child.id())) {
                        output::error_line(&format!(
                            "spark: cannot write {}: {err}",
                            pid_file.display()
                        ));
                    }
                }
                return Ok(client);
            }
            Err(ClientError::DaemonNotRunning { .. }) => {}
            Err(err) => return Err(err.into()),
        }
        if let Some(status) = child.try_wait()? {
            // Perhaps a concurrent start won; then its daemon answers now.
            if let Ok(client) = Client::connect(socket).await {
                return Ok(client);
            }
            return Err(Unavailable(format!(
                "sparkd exited ({status}) before it was ready; its log {} ends with:\n{}",
                log.path.display(),
                log_tail(&log.path, log.start, 10)
            ))
            .into());
        }
        if started.elapsed() > READY_TIMEOUT {
            return Err(Unavailable(format!(
                "sparkd did not become ready within {} s (it is still starting; see {})",
                READY_TIMEOUT.as_secs(),
                log.path.display()
            ))
            .into());
        }
        spinner.tick(started.elapsed());
        tokio::time::sleep(POLL_INTERVAL).await;
    }
}

/// The last `lines` lines written at or after byte `start`.
fn log_tail(path: &Path, start: u64, lines: usize) -> String {
    let bytes = fs::read(path).unwrap_or_default();
    let from = usize::try_from(start)
        .unwrap_or(usize::MAX)
        .min(bytes.len());
    let text = String::from_utf8_lossy(&bytes[from..]);
    let all: Vec<&str> = text.lines().collect();
    let tail = &all[all.len().saturating_sub(lines)..];
    tail.iter()
        .map(|line| format!("  {line}"))
        .collect::<Vec<_>>()
        .join("\n")
}

/// "loading model…" with a spinner on a terminal; nothing otherwise.
struct Spinner {
    enabled: bool,
    frame: usize,
    shown: bool,
}

impl Spinner {
    const FRAMES: [char; 10] = ['⠋', '⠙', '⠹', '⠸', '⠼', '⠴', '⠦', '⠧', '⠇', '⠏'];

    fn new(enabled: bool) -> Self {
        Self {
            enabled,
            frame: 0,
            shown: false,
        }
    }

    fn tick(&mut self, elapsed: Duration) {
        if !self.enabled {
            return;
        }
        let glyph = Self::FRAMES[self.frame % Self::FRAMES.len()];
        self.frame += 1;
        output::err_text(&format!("\r{glyph} loading model… {}s", elapsed.as_secs()));
        self.shown = true;
    }

    fn clear(&mut self) {
        if self.shown {
            output::err_text("\r\x1b[2K");
            self.shown = false;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pid_file_sits_next_to_the_socket() {
        assert_eq!(
            pid_path(Path::new("/run/user/1/sparkd/sparkd.sock")),
            Path::new("/run/user/1/sparkd/sparkd.sock.pid")
        );
    }

    #[test]
    fn log_tail_keeps_the_last_lines() {
        let dir = std::env::temp_dir().join(format!("spark-tail-{}", std::process::id()));
        fs::create_dir_all(&dir).unwrap();
        let log = dir.join("log");
        fs::write(&log, "old\na\nb\nc\nd\n").unwrap();
        assert_eq!(log_tail(&log, 0, 2), "  c\n  d");
        // Only what this start wrote: lines before `start` are an earlier run's.
        assert_eq!(log_tail(&log, 4, 10), "  a\n  b\n  c\n  d");
        assert_eq!(log_tail(&log, 1000, 10), "");
        assert_eq!(log_tail(&dir.join("missing"), 0, 2), "");
        fs::remove_dir_all(&dir).unwrap();
    }
}
