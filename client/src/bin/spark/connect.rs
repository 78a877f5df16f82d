//! Connecting to the daemon, starting it first when allowed and needed.

use std::io;

use spark_client::{resolve_socket_path, Client, ClientError};

use crate::{autostart, Global};

/// Environment variable that turns auto-start off (`1`, `true` or `yes`).
pub const NO_AUTOSTART_ENV: &str = "SPARKD_NO_AUTOSTART";

/// Whether a missing daemon should be started (for `run` and `chat`) or reported.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Autostart {
    Allowed,
    Never,
}

pub async fn connect(global: &Global, autostart: Autostart) -> anyhow::Result<Client> {
    let path = resolve_socket_path(global.socket.as_deref());
    match Client::connect(&path).await {
        Ok(client) => Ok(client),
        Err(ClientError::DaemonNotRunning { .. })
            if autostart == Autostart::Allowed && autostart_enabled(global) =>
        {
            autostart::start(&path, global.model.as_deref()).await
        }
        Err(err) => match hint(&err, autostart, global) {
            Some(hint) => Err(Hinted { error: err, hint }.into()),
            None => Err(err.into()),
        },
    }
}

/// A connection failure with advice on what to do about it.
#[derive(Debug, thiserror::Error)]
#[error("{error}\nhint: {hint}")]
pub struct Hinted {
    pub error: ClientError,
    pub hint: &'static str,
}

fn autostart_enabled(global: &Global) -> bool {
    !global.no_start && !env_says_no(std::env::var(NO_AUTOSTART_ENV).ok().as_deref())
}

fn env_says_no(value: Option<&str>) -> bool {
    value.is_some_and(|v| matches!(v.trim().to_ascii_lowercase().as_str(), "1" | "true" | "yes"))
}

fn hint(err: &ClientError, autostart: Autostart, global: &Global) -> Option<&'static str> {
    match err {
        ClientError::DaemonNotRunning { .. } if autostart == Autostart::Never => {
            Some("`spark run` starts it, or start it yourself with `sparkd serve`")
        }
        ClientError::DaemonNotRunning { .. } if !autostart_enabled(global) => Some(
            "auto-start is off (--no-start or SPARKD_NO_AUTOSTART); start it with `sparkd serve`",
        ),
        ClientError::Connect { source, .. } if source.kind() == io::ErrorKind::PermissionDenied => {
            Some("the system daemon admits members of the `sparkd` group")
        }
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn opt_out_values() {
        assert!(env_says_no(Some("1")));
        assert!(env_says_no(Some("TRUE")));
        assert!(env_says_no(Some(" yes ")));
        assert!(!env_says_no(Some("0")));
        assert!(!env_says_no(Some("")));
        assert!(!env_says_no(None));
    }
}
