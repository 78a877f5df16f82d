//! Exit codes, and turning an error into one (with a message on stderr).

use std::{io, process::ExitCode};

use spark_client::{protocol::ErrorKind, ClientError};

pub const OK: u8 = 0;
pub const FAILURE: u8 = 1;
/// Bad arguments; clap exits with this itself.
pub const USAGE: u8 = 2;
pub const UNAVAILABLE: u8 = 3;
pub const REQUEST_FAILED: u8 = 4;
pub const INTERRUPTED: u8 = 130;

/// No daemon to talk to, for a reason of ours (sparkd not installed, failed to start).
#[derive(Debug, thiserror::Error)]
#[error("{0}")]
pub struct Unavailable(pub String);

/// Arguments that parsed but make no sense (an empty prompt).
#[derive(Debug, thiserror::Error)]
#[error("{0}")]
pub struct Usage(pub String);

pub fn code(code: u8) -> ExitCode {
    ExitCode::from(code)
}

/// Prints `err` (unless stdout was closed under us, which is a quiet exit) and picks
/// the exit code.
pub fn report(err: anyhow::Error) -> ExitCode {
    if is_broken_pipe(&err) {
        return code(OK);
    }
    crate::output::error_line(&format!("spark: {err:#}"));
    if client_error(&err).and_then(ClientError::kind) == Some(ErrorKind::UnknownModel) {
        crate::output::error_line(
            "hint: a daemon serves one model; to switch, stop it (`spark stop` stops one \
             that spark started) and run again with --model",
        );
    }
    code(code_for(&err))
}

fn client_error(err: &anyhow::Error) -> Option<&ClientError> {
    err.downcast_ref::<ClientError>().or_else(|| {
        err.downcast_ref::<crate::connect::Hinted>()
            .map(|hinted| &hinted.error)
    })
}

fn code_for(err: &anyhow::Error) -> u8 {
    if let Some(client) = client_error(err) {
        return if client.is_unavailable() {
            UNAVAILABLE
        } else {
            REQUEST_FAILED
        };
    }
    if err.downcast_ref::<Unavailable>().is_some() {
        return UNAVAILABLE;
    }
    if err.downcast_ref::<Usage>().is_some() {
        return USAGE;
    }
    FAILURE
}

pub fn is_broken_pipe(err: &anyhow::Error) -> bool {
    err.chain().any(|cause| {
        cause
            .downcast_ref::<io::Error>()
            .is_some_and(|e| e.kind() == io::ErrorKind::BrokenPipe)
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use spark_client::protocol::{ErrorEvent, ErrorKind};

    #[test]
    fn errors_map_to_documented_codes() {
        let busy: ClientError = ErrorEvent {
            id: Some(1),
            kind: ErrorKind::Busy,
            message: String::new(),
        }
        .into();
        assert_eq!(code_for(&busy.into()), REQUEST_FAILED);
        assert_eq!(code_for(&ClientError::Disconnected.into()), UNAVAILABLE);
        assert_eq!(code_for(&Unavailable("x".into()).into()), UNAVAILABLE);
        assert_eq!(code_for(&Usage("x".into()).into()), USAGE);
        assert_eq!(code_for(&anyhow::anyhow!("other")), FAILURE);
        let hinted = crate::connect::Hinted {
            error: ClientError::Disconnected,
            hint: "h",
        };
        assert_eq!(code_for(&hinted.into()), UNAVAILABLE);
    }

    #[test]
    fn broken_pipe_is_recognised_through_context() {
        let err =
            anyhow::Error::from(io::Error::from(io::ErrorKind::BrokenPipe)).context("writing");
        assert!(is_broken_pipe(&err));
        assert!(!is_broken_pipe(&anyhow::anyhow!("nope")));
    }
}
