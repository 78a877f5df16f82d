//! An OpenAI-compatible HTTP API in front of the sparkd daemon (`spark serve-openai`).
//!
//! The HTTP layer talks to the daemon only through the [`Backend`] trait, so it is tested
//! against a fake; `daemon_backend` adapts the real client. The endpoints and the extra
//! fields sparkd adds are described in `README.md` beside this file.

mod auth;
mod backend;
mod error;
mod generation;
mod metrics;
mod request;
mod response;
mod routes;
mod server;

pub use backend::{Backend, BackendError, BackendEvent, EventStream};
pub use server::{bind, router, serve, RouterOptions, ServeError, DEFAULT_MAX_BODY_BYTES};

#[cfg(test)]
mod tests;
