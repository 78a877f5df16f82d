//! The Unix-socket server: accept loop, per-connection framing, handshake, dispatch to the
//! engine.
//!
//! One request's path: a frame is decoded by the connection task ([`connection`]), handed
//! to the [`Engine`](crate::engine::Engine) with the connection's event sender, and the
//! engine's events come back through that unbounded channel to the same task, which writes
//! them at the client's pace. The engine never waits for a socket.
//!
//! Shutdown: cancel the token given to [`serve`], then shut the engine down so that it
//! ends every running generation with `Done { finish_reason: Shutdown }`. `serve` stops
//! accepting at once and returns when every connection has written its last `Done` (or
//! after [`ServerConfig::shutdown_grace`]).

mod config;
mod connection;
mod error;
mod listener;
mod peercred;
mod serve;
mod stall;

#[cfg(test)]
mod tests;

pub use config::ServerConfig;
pub use error::ServerError;
pub use listener::{bind, Listener};
pub use peercred::Access;
pub use serve::{serve, serve_with_access};
