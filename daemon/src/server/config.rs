//! The server's settings.

use std::{path::PathBuf, time::Duration};

use spark_client::protocol::DEFAULT_MAX_FRAME_BYTES;

#[derive(Debug, Clone, PartialEq)]
pub struct ServerConfig {
    pub socket_path: PathBuf,
    /// The largest frame accepted from a client; larger ones close the connection.
    pub max_frame_bytes: usize,
    /// Connections served at once; further clients wait in the listen backlog.
    pub max_connections: usize,
    /// Permission bits of the socket file. Connecting needs write permission, so `0o660`
    /// admits the owner and the socket's group.
    pub socket_mode: u32,
    /// When either list is set, only these users (or members of these groups) may use
    /// the daemon, besides root and the daemon's own user.
    pub allowed_uids: Option<Vec<u32>>,
    pub allowed_gids: Option<Vec<u32>>,
    /// How long a new connection has to send `Hello`.
    pub handshake_timeout: Duration,
    /// After shutdown is requested, how long connections may keep streaming before they
    /// are dropped.
    pub shutdown_grace: Duration,
    /// A client that takes no bytes for this long while events wait for it is cut off:
    /// its generations are cancelled and the connection closed.
    pub stall_timeout: Duration,
    /// Events waiting for a client whose socket is full, past which it is cut off at
    /// once. Token events are small (one token's text and at most 20 alternatives), so
    /// this bounds what a stalled client holds to a few megabytes.
    pub max_backlog_frames: usize,
}

impl ServerConfig {
    pub const DEFAULT_MAX_CONNECTIONS: usize = 256;
    pub const DEFAULT_SOCKET_MODE: u32 = 0o660;
    pub const DEFAULT_STALL_TIMEOUT: Duration = Duration::from_secs(30);
    pub const DEFAULT_MAX_BACKLOG_FRAMES: usize = 4096;

    /// The defaults for everything but the socket path.
    pub fn new(socket_path: impl Into<PathBuf>) -> Self {
        Self {
            socket_path: socket_path.into(),
            max_frame_bytes: DEFAULT_MAX_FRAME_BYTES,
            max_connections: Self::DEFAULT_MAX_CONNECTIONS,
            socket_mode: Self::DEFAULT_SOCKET_MODE,
            allowed_uids: None,
            allowed_gids: None,
            handshake_timeout: Duration::from_secs(10),
            shutdown_grace: Duration::from_secs(30),
            stall_timeout: Self::DEFAULT_STALL_TIMEOUT,
            max_backlog_frames: Self::DEFAULT_MAX_BACKLOG_FRAMES,
        }
    }
}
