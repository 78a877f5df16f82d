//! What can go wrong talking to the daemon, with the daemon's error kinds mapped onto
//! the few cases a caller handles differently.

use std::{io, path::PathBuf};

use crate::{
    codec::CodecError,
    protocol::{ErrorEvent, ErrorKind},
};

#[derive(Debug, thiserror::Error)]
pub enum ClientError {
    /// Nothing listens on the socket (it is missing, or stale).
    #[error("sparkd is not running (no daemon answers on {})", path.display())]
    DaemonNotRunning { path: PathBuf, source: io::Error },
    /// The socket exists but could not be connected to for another reason, most often
    /// permissions (the system daemon's socket is group `sparkd`).
    #[error("cannot connect to sparkd at {}: {source}", path.display())]
    Connect { path: PathBuf, source: io::Error },
    /// The daemon speaks another major version of the protocol.
    #[error("protocol version mismatch: this client speaks {}.{}; the daemon says: {daemon}", client.0, client.1)]
    VersionMismatch { client: (u16, u16), daemon: String },
    /// The connecting user is not on the daemon's allow-list.
    #[error("not allowed: {0}")]
    NotAllowed(String),
    /// The daemon cannot take the request now (queue full, shutting down); retry later.
    #[error("daemon busy: {0}")]
    Busy(String),
    /// The request was refused as it is: a field out of range, a prompt that does not fit
    /// the context, an unknown model, a request id already in use.
    #[error("invalid request ({}): {message}", kind_name(*kind))]
    InvalidRequest { kind: ErrorKind, message: String },
    /// The engine failed while running the request.
    #[error("engine error: {0}")]
    Engine(String),
    /// The connection to the daemon is gone.
    #[error("disconnected from sparkd")]
    Disconnected,
    /// The peers disagree about the wire format, or the daemon did not follow it.
    #[error("protocol error: {0}")]
    Protocol(String),
    #[error(transparent)]
    Io(#[from] io::Error),
}

impl ClientError {
    /// The daemon's error kind this came from, when it came from an `Error` frame.
    pub fn kind(&self) -> Option<ErrorKind> {
        match self {
            ClientError::InvalidRequest { kind, .. } => Some(*kind),
            ClientError::VersionMismatch { .. } => Some(ErrorKind::VersionMismatch),
            ClientError::NotAllowed(_) => Some(ErrorKind::NotAllowed),
            _ => None,
        }
    }

    /// True when no daemon could be reached at all (as opposed to a refused request).
    pub fn is_unavailable(&self) -> bool {
        matches!(
            self,
            ClientError::DaemonNotRunning { .. }
                | ClientError::Connect { .. }
                | ClientError::Disconnected
                | ClientError::VersionMismatch { .. }
                | ClientError::NotAllowed(_)
                | ClientError::Protocol(_)
                | ClientError::Io(_)
        )
    }
}

impl From<ErrorEvent> for ClientError {
    fn from(event: ErrorEvent) -> Self {
        let ErrorEvent { kind, message, .. } = event;
        match kind {
            ErrorKind::Busy | ErrorKind::ShuttingDown => ClientError::Busy(message),
            ErrorKind::InvalidRequest
            | ErrorKind::ContextOverflow
            | ErrorKind::UnknownModel
            | ErrorKind::DuplicateId => ClientError::InvalidRequest { kind, message },
            ErrorKind::Engine | ErrorKind::Internal => ClientError::Engine(message),
            ErrorKind::NotAllowed => ClientError::NotAllowed(message),
            ErrorKind::VersionMismatch => ClientError::VersionMismatch {
                client: (
                    crate::protocol::PROTOCOL_MAJOR,
                    crate::protocol::PROTOCOL_MINOR,
                ),
                daemon: message,
            },
            ErrorKind::BadFrame | ErrorKind::FrameTooLarge | ErrorKind::Handshake => {
                ClientError::Protocol(message)
            }
        }
    }
}

impl From<CodecError> for ClientError {
    fn from(err: CodecError) -> Self {
        match err {
            CodecError::Io(e) => ClientError::Io(e),
            other => ClientError::Protocol(other.to_string()),
        }
    }
}

/// The kind's wire name in `snake_case`, as used in logs and JSON output.
pub fn kind_name(kind: ErrorKind) -> &'static str {
    match kind {
        ErrorKind::BadFrame => "bad_frame",
        ErrorKind::FrameTooLarge => "frame_too_large",
        ErrorKind::Handshake => "handshake",
        ErrorKind::VersionMismatch => "version_mismatch",
        ErrorKind::Busy => "busy",
        ErrorKind::InvalidRequest => "invalid_request",
        ErrorKind::ContextOverflow => "context_overflow",
        ErrorKind::UnknownModel => "unknown_model",
        ErrorKind::DuplicateId => "duplicate_id",
        ErrorKind::NotAllowed => "not_allowed",
        ErrorKind::Engine => "engine",
        ErrorKind::ShuttingDown => "shutting_down",
        ErrorKind::Internal => "internal",
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn event(kind: ErrorKind) -> ErrorEvent {
        ErrorEvent {
            id: Some(1),
            kind,
            message: "m".into(),
        }
    }

    #[test]
    fn kinds_map_to_the_variant_a_caller_acts_on() {
        assert!(matches!(
            ClientError::from(event(ErrorKind::Busy)),
            ClientError::Busy(_)
        ));
        assert!(matches!(
            ClientError::from(event(ErrorKind::ShuttingDown)),
            ClientError::Busy(_)
        ));
        assert!(matches!(
            ClientError::from(event(ErrorKind::ContextOverflow)),
            ClientError::InvalidRequest {
                kind: ErrorKind::ContextOverflow,
                ..
            }
        ));
        assert!(matches!(
            ClientError::from(event(ErrorKind::Engine)),
            ClientError::Engine(_)
        ));
        assert!(matches!(
            ClientError::from(event(ErrorKind::BadFrame)),
            ClientError::Protocol(_)
        ));
        assert!(matches!(
            ClientError::from(event(ErrorKind::NotAllowed)),
            ClientError::NotAllowed(_)
        ));
    }

    #[test]
    fn refused_requests_are_not_unavailability() {
        assert!(!ClientError::from(event(ErrorKind::Busy)).is_unavailable());
        assert!(!ClientError::from(event(ErrorKind::InvalidRequest)).is_unavailable());
        assert!(ClientError::Disconnected.is_unavailable());
    }
}
