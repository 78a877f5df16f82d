//! `spark stop`: end a daemon that `spark` auto-started, found through its pid file.

use std::{
    fs, io,
    path::Path,
    process::ExitCode,
    time::{Duration, Instant},
};

use anyhow::{bail, Context};
use spark_client::{resolve_socket_path, Client};

use crate::{autostart::pid_path, exit, output, Global};

/// sparkd ends its generations and closes its connections first; give it time.
const STOP_TIMEOUT: Duration = Duration::from_secs(30);

pub async fn run(global: &Global) -> anyhow::Result<ExitCode> {
    let socket = resolve_socket_path(global.socket.as_deref());
    let pid_file = pid_path(&socket);
    let pid = match fs::read_to_string(&pid_file) {
        Ok(text) => {
            parse_pid(&text).with_context(|| format!("{} holds no pid", pid_file.display()))?
        }
        Err(err) if err.kind() == io::ErrorKind::NotFound => {
            if Client::connect(&socket).await.is_ok() {
                bail!(
                    "the daemon on {} was not started by spark (no {}); stop it the way it was started, \
                     e.g. `systemctl stop sparkd`",
                    socket.display(),
                    pid_file.display()
                );
            }
            output::error_line("sparkd is not running");
            return Ok(exit::code(exit::OK));
        }
        Err(err) => return Err(err).with_context(|| format!("cannot read {}", pid_file.display())),
    };

    // The pid may have been reused since the file was written: only signal a sparkd.
    if !is_sparkd(pid) {
        let _ = fs::remove_file(&pid_file);
        output::error_line("sparkd is not running (removed a stale pid file)");
        return Ok(exit::code(exit::OK));
    }
    terminate(pid).with_context(|| format!("cannot signal sparkd (pid {pid})"))?;
    let deadline = Instant::now() + STOP_TIMEOUT;
    while is_alive(pid) {
        if Instant::now() > deadline {
            bail!(
                "sparkd (pid {pid}) did not stop within {} s",
                STOP_TIMEOUT.as_secs()
            );
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let _ = fs::remove_file(&pid_file);
    output::error_line(&format!("stopped sparkd (pid {pid})"));
    Ok(exit::code(exit::OK))
}

/// A pid that can be signalled on its own: 0 and negative values address process groups
/// and 1 is init.
fn parse_pid(text: &str) -> Option<i32> {
    text.trim().parse().ok().filter(|pid| *pid > 1)
}

fn is_sparkd(pid: i32) -> bool {
    is_alive(pid)
        && fs::read_to_string(format!("/proc/{pid}/comm"))
            .is_ok_and(|comm| comm.trim_end() == "sparkd")
}

/// Running, as opposed to gone or a zombie waiting for its parent.
fn is_alive(pid: i32) -> bool {
    process_state(Path::new(&format!("/proc/{pid}/stat")))
        .is_some_and(|state| !matches!(state, 'Z' | 'X'))
}

/// The state letter of `/proc/<pid>/stat`, which follows the parenthesised command name
/// (itself free to contain spaces and parentheses).
fn process_state(stat: &Path) -> Option<char> {
    let text = fs::read_to_string(stat).ok()?;
    parse_state(&text)
}

fn parse_state(stat: &str) -> Option<char> {
    let after_name = &stat[stat.rfind(')')? + 1..];
    after_name.trim_start().chars().next()
}

fn terminate(pid: i32) -> io::Result<()> {
    // SAFETY: kill(2) takes plain integers and touches no memory; `pid` is above 1 (see
    // `parse_pid`), so it addresses one process, never a group or every process.
    let rc = unsafe { libc::kill(pid, libc::SIGTERM) };
    if rc == 0 {
        Ok(())
    } else {
        Err(io::Error::last_os_error())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pids_that_address_groups_or_init_are_refused() {
        assert_eq!(parse_pid("1234\n"), Some(1234));
        assert_eq!(parse_pid("0"), None);
        assert_eq!(parse_pid("1"), None);
        assert_eq!(parse_pid("-5"), None);
        assert_eq!(parse_pid("abc"), None);
    }

    #[test]
    fn state_follows_the_last_parenthesis() {
        assert_eq!(parse_state("42 (sparkd) S 1 42 42 0"), Some('S'));
        assert_eq!(parse_state("42 (we(ir)d) name) Z 1"), Some('Z'));
        assert_eq!(parse_state("garbage"), None);
    }

    #[test]
    fn this_process_is_alive_and_not_sparkd() {
        let me = std::process::id() as i32;
        assert!(is_alive(me));
        assert!(!is_sparkd(me));
    }
}
