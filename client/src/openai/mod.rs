//! An OpenAI-compatible HTTP API in front of the sparkd daemon (`spark serve-openai`).
//!
//! The HTTP layer talks to the daemon only through the [`Backend`] trait, so it is tested
//! against a fake; `daemon_backend` adapts the real client. The endpoints and the extra
//! fields sparkd adds are described in `README.md` beside this file.

mod args;
mod auth;
mod backend;
mod daemon_backend;
mod error;
mod generation;
mod metrics;
mod proxy;
mod request;
mod response;
mod routes;
mod server;
mod tools;
mod web;

pub use args::ServeOpenAiArgs;
pub use backend::{Backend, BackendError, BackendEvent, EventStream};
pub use daemon_backend::DaemonBackend;
pub use proxy::{Proxy, ProxyError, ProxySettings, SpecError, UpstreamSpec};
pub use server::{bind, router, serve, RouterOptions, ServeError, DEFAULT_MAX_BODY_BYTES};
pub use tools::{choice_by_word, tools_from_json, ToolError};

use std::net::{Ipv4Addr, SocketAddr};
use std::path::PathBuf;
use std::sync::Arc;

use tokio_util::sync::CancellationToken;

/// The default `--listen` address: this host only.
pub const DEFAULT_LISTEN: SocketAddr =
    SocketAddr::new(std::net::IpAddr::V4(Ipv4Addr::LOCALHOST), 8080);
/// The environment variable `--api-key` falls back to.
pub const API_KEY_ENV: &str = "SPARKD_API_KEY";

/// Settings of `spark serve-openai`.
#[derive(Clone)]
pub struct OpenAiConfig {
    /// Where the HTTP server listens (`--listen`).
    pub listen: SocketAddr,
    /// The daemon's socket (see `resolve_socket_path`).
    pub socket_path: PathBuf,
    /// When set, every `/v1` request needs `Authorization: Bearer <key>` (`--api-key`).
    pub api_key: Option<String>,
    /// Larger request bodies get 413.
    pub max_body_bytes: usize,
    /// Engines whose models are forwarded to them (`--upstream NAME=URL`).
    pub upstreams: Vec<UpstreamSpec>,
}

impl OpenAiConfig {
    /// Defaults for everything but the daemon's socket.
    pub fn new(socket_path: PathBuf) -> Self {
        Self {
            listen: DEFAULT_LISTEN,
            socket_path,
            api_key: None,
            max_body_bytes: DEFAULT_MAX_BODY_BYTES,
            upstreams: Vec::new(),
        }
    }
}

impl std::fmt::Debug for OpenAiConfig {
    // The API key is a secret: say whether there is one, never what it is.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("OpenAiConfig")
            .field("listen", &self.listen)
            .field("socket_path", &self.socket_path)
            .field("api_key", &self.api_key.as_ref().map(|_| "<set>"))
            .field("max_body_bytes", &self.max_body_bytes)
            .field("upstreams", &self.upstreams)
            .finish()
    }
}

/// Serves the OpenAI API for the daemon at `config.socket_path` until `shutdown` is
/// cancelled. The daemon need not be running yet: it is connected to on first use.
pub async fn serve_openai(
    config: OpenAiConfig,
    shutdown: CancellationToken,
) -> Result<(), ServeError> {
    let listener = bind(config.listen, config.api_key.as_deref()).await?;
    let local = listener.local_addr().map_err(ServeError::Serve)?;
    tracing::info!(listen = %local, socket = %config.socket_path.display(), "serving the OpenAI API");
    let backend: Arc<dyn Backend> = Arc::new(DaemonBackend::new(config.socket_path));
    let proxy = if config.upstreams.is_empty() {
        None
    } else {
        let settings = ProxySettings {
            forward_authorization: config.api_key.is_none(),
            max_body_bytes: config.max_body_bytes,
            shutdown: shutdown.clone(),
        };
        let proxy = Proxy::start(config.upstreams, backend.clone(), settings)?;
        // Know the upstreams' models before the first request (a miss would re-read).
        proxy.refresh().await;
        Some(proxy)
    };
    let options = RouterOptions {
        api_key: config.api_key,
        max_body_bytes: config.max_body_bytes,
        proxy,
    };
    let app = router(backend, options, shutdown.clone());
    serve(listener, app, shutdown).await
}

#[cfg(test)]
mod tests;
