//! systemd integration: readiness and status notifications, the watchdog, and the
//! listening socket systemd hands over under socket activation. Every function is a
//! no-op when systemd did not start us (no NOTIFY_SOCKET / LISTEN_FDS).

use std::os::fd::FromRawFd;
use std::os::unix::net::UnixListener;
use std::sync::Arc;
use std::time::Duration;

use sd_notify::NotifyState;
use tokio_util::sync::CancellationToken;

use crate::engine::jobs::Load;
use crate::engine::EngineHandle;

fn send(states: &[NotifyState]) {
    if std::env::var_os("NOTIFY_SOCKET").is_none() {
        return;
    }
    if let Err(e) = sd_notify::notify(false, states) {
        tracing::warn!(error = %e, "sd_notify failed");
    }
}

pub fn status(text: &str) {
    send(&[NotifyState::Status(text)]);
}

fn load_line(engine: &EngineHandle) -> String {
    status_line(engine.shared().model_name(), &engine.shared().load())
}

/// `systemctl status`'s line: `serving smollm2: 1 running, 0 queued, 12 served, 64% of
/// prompt tokens from the prefix cache` (the last part once any prompt was reused).
fn status_line(model: &str, load: &Load) -> String {
    let mut line = format!(
        "serving {model}: {} running, {} queued, {} served",
        load.running, load.queued, load.requests_served
    );
    if load.prompt_tokens_reused > 0 && load.prompt_tokens > 0 {
        let percent = load.prompt_tokens_reused as f64 / load.prompt_tokens as f64 * 100.0;
        line.push_str(&format!(
            ", {percent:.0}% of prompt tokens from the prefix cache"
        ));
    }
    line
}

/// READY=1: the model is resident and the socket accepts.
pub fn ready(engine: &EngineHandle) {
    let line = load_line(engine);
    send(&[NotifyState::Ready, NotifyState::Status(&line)]);
}

pub fn reloading() {
    send(&[
        NotifyState::Reloading,
        NotifyState::Status("reloading configuration"),
    ]);
}

pub fn stopping() {
    send(&[NotifyState::Stopping, NotifyState::Status("shutting down")]);
}

/// Sends WATCHDOG=1 at half the watchdog period while the engine loop is alive (its
/// heartbeat is recent), so a wedged engine gets the service restarted; refreshes the
/// STATUS line as well.
pub async fn keep_alive(engine: Arc<EngineHandle>, shutdown: CancellationToken) {
    let watchdog = watchdog_period();
    let period = watchdog.map_or(Duration::from_secs(5), |w| {
        (w / 2).min(Duration::from_secs(5))
    });
    loop {
        tokio::select! {
            _ = shutdown.cancelled() => return,
            _ = tokio::time::sleep(period) => {}
        }
        let line = load_line(&engine);
        match watchdog {
            Some(w) if engine.shared().heartbeat().elapsed() < w => {
                send(&[NotifyState::Watchdog, NotifyState::Status(&line)]);
            }
            Some(_) => tracing::error!("engine loop unresponsive; withholding the watchdog ping"),
            None => send(&[NotifyState::Status(&line)]),
        }
    }
}

/// The listening socket systemd passed us (LISTEN_FDS, for our pid), if any.
pub fn activated_listener() -> std::io::Result<Option<UnixListener>> {
    let mut fds = sd_notify::listen_fds()?;
    match fds.next() {
        // SAFETY: systemd passes us ownership of this open listening socket (fd 3); it is
        // not used anywhere else in the process, and sd_notify checked LISTEN_PID.
        Some(fd) => Ok(Some(unsafe { UnixListener::from_raw_fd(fd) })),
        None => Ok(None),
    }
}

/// The watchdog period systemd asked for, as sd_watchdog_enabled(3) reads it:
/// WATCHDOG_USEC, for this process unless WATCHDOG_PID names another one.
fn watchdog_period() -> Option<Duration> {
    let usec: u64 = std::env::var("WATCHDOG_USEC").ok()?.parse().ok()?;
    if let Ok(pid) = std::env::var("WATCHDOG_PID") {
        if pid.parse::<u32>().ok() != Some(std::process::id()) {
            return None;
        }
    }
    (usec > 0).then(|| Duration::from_micros(usec))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_status_line_tells_the_load_and_the_cache_share_once_there_is_one() {
        let mut load = Load {
            running: 1,
            queued: 2,
            requests_served: 3,
            prompt_tokens: 400,
            ..Load::default()
        };
        assert_eq!(
            status_line("tiny", &load),
            "serving tiny: 1 running, 2 queued, 3 served"
        );
        load.prompt_tokens_reused = 256;
        assert_eq!(
            status_line("tiny", &load),
            "serving tiny: 1 running, 2 queued, 3 served, 64% of prompt tokens from the prefix cache"
        );
    }
}
