//! Why the server could not start or stopped.

use std::{io, path::PathBuf};

#[derive(Debug, thiserror::Error)]
pub enum ServerError {
    /// A daemon answers on the socket already; starting a second one would steal it.
    #[error("another sparkd is already listening on {}", path.display())]
    AlreadyRunning { path: PathBuf },
    /// Something other than a socket sits at the socket path; it is not ours to delete.
    #[error("{} exists and is not a socket; refusing to replace it", path.display())]
    NotASocket { path: PathBuf },
    /// The socket's directory belongs to another user, who could swap the socket for
    /// their own (think `/tmp/sparkd-<uid>` created by someone else first).
    #[error("socket directory {} is owned by uid {owner}, not by this user or root", path.display())]
    UnsafeDirectory { path: PathBuf, owner: u32 },
    #[error("cannot {action} {}: {source}", path.display())]
    Io {
        action: &'static str,
        path: PathBuf,
        source: io::Error,
    },
    #[error("cannot use the inherited listener: {0}")]
    Inherited(#[source] io::Error),
}

impl ServerError {
    pub(crate) fn io(
        action: &'static str,
        path: impl Into<PathBuf>,
    ) -> impl FnOnce(io::Error) -> Self {
        let path = path.into();
        move |source| ServerError::Io {
            action,
            path,
            source,
        }
    }
}
