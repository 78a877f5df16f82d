//! `spark serve-openai --upstream NAME=URL`: requests for models another engine serves
//! (llama-server, Ollama, vLLM, another sparkd shim...) are forwarded to it byte for
//! byte, and each one is measured on the way back and booked in the daemon's jobs list.
//!
//! - `upstream`: the upstreams and the models each serves (from its `/v1/models`).
//! - `forward`: the middleware that forwards or passes a request on to sparkd.
//! - `tap`, `tail`, `counter`, `scan`, `measure`: the measuring of a response without
//!   holding or decoding it, and what the measurements mean.
//! - `jobs`, `listing`: reporting jobs to the daemon, and `/v1/models` / `/v1/jobs`
//!   with the upstreams' part merged in.
//!
//! The upstream client speaks plain http only (no TLS in this build).

mod counter;
mod forward;
mod jobs;
mod listing;
mod measure;
mod scan;
mod tail;
mod tap;
mod upstream;

pub use upstream::{SpecError, UpstreamSpec};

use std::sync::atomic::AtomicU64;
use std::sync::{Arc, Weak};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use axum::http::Uri;
use axum::middleware;
use axum::routing::post;
use axum::Router;
use tokio::sync::mpsc::{self, UnboundedSender};
use tokio_util::sync::CancellationToken;

use super::backend::Backend;
use super::error::ApiError;
use crate::protocol::ExternalJob;
use jobs::JobLog;
use upstream::{Registry, REFRESH_EVERY};

/// How long connecting to an upstream may take.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(10);

#[derive(Debug, thiserror::Error)]
pub enum ProxyError {
    #[error("two upstreams are called `{0}`")]
    DuplicateName(String),
    #[error("cannot set up the upstream HTTP client: {0}")]
    Client(#[from] reqwest::Error),
}

/// The forwarding side of the shim, shared by every request.
pub struct Proxy {
    registry: Registry,
    http: reqwest::Client,
    /// The daemon: where jobs are reported, and whose models need no upstream.
    backend: Arc<dyn Backend>,
    jobs: Arc<JobLog>,
    /// Where taps report finished jobs (to the recorder task).
    sink: UnboundedSender<ExternalJob>,
    next_request: AtomicU64,
    /// Pass the client's `Authorization` on: only when it was not meant for this server.
    forward_authorization: bool,
    /// For the 413 message; the limit itself is the router's.
    max_body_bytes: usize,
    /// `created` of the upstream models in `/v1/models`.
    started_unix: u64,
    /// Ends forwarded streams when the server shuts down.
    shutdown: CancellationToken,
}

impl std::fmt::Debug for Proxy {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let names: Vec<&str> = self
            .registry
            .upstreams()
            .iter()
            .map(|u| u.name.as_str())
            .collect();
        f.debug_struct("Proxy")
            .field("upstreams", &names)
            .finish_non_exhaustive()
    }
}

/// How the proxy treats requests, from the server's settings.
#[derive(Debug, Clone)]
pub struct ProxySettings {
    /// When the server has its own API key, the client's `Authorization` header is that
    /// key and must not travel on.
    pub forward_authorization: bool,
    pub max_body_bytes: usize,
    /// The server's shutdown: open forwarded streams end with it.
    pub shutdown: CancellationToken,
}

impl Proxy {
    /// Sets up the upstreams and starts, on the current tokio runtime, the task that
    /// reports jobs through `backend` and the one that re-reads the upstreams' model
    /// lists every 30 s. Call [`Proxy::refresh`] for the first read before serving.
    pub fn start(
        upstreams: Vec<UpstreamSpec>,
        backend: Arc<dyn Backend>,
        settings: ProxySettings,
    ) -> Result<Arc<Self>, ProxyError> {
        for (i, spec) in upstreams.iter().enumerate() {
            if upstreams[..i].iter().any(|other| other.name == spec.name) {
                return Err(ProxyError::DuplicateName(spec.name.clone()));
            }
        }
        let http = reqwest::Client::builder()
            // Local engines: no environment proxy, redirects passed back as they are.
            .no_proxy()
            .redirect(reqwest::redirect::Policy::none())
            .connect_timeout(CONNECT_TIMEOUT)
            .tcp_nodelay(true)
            .build()?;
        let (sink, jobs_rx) = mpsc::unbounded_channel();
        let jobs = Arc::new(JobLog::default());
        tokio::spawn(jobs::record_jobs(jobs_rx, backend.clone(), jobs.clone()));
        let proxy = Arc::new(Self {
            registry: Registry::new(upstreams),
            http,
            backend,
            jobs,
            sink,
            next_request: AtomicU64::new(1),
            forward_authorization: settings.forward_authorization,
            max_body_bytes: settings.max_body_bytes,
            started_unix: SystemTime::now()
                .duration_since(UNIX_EPOCH)
                .map_or(0, |d| d.as_secs()),
            shutdown: settings.shutdown,
        });
        tokio::spawn(refresh_periodically(Arc::downgrade(&proxy)));
        Ok(proxy)
    }

    /// Counts every forwarded job in the HTTP server's `/metrics` from now on.
    pub fn report_to(&self, metrics: Arc<super::metrics::Metrics>) {
        self.jobs.report_to(metrics);
    }

    /// Reads every upstream's model list now.
    pub async fn refresh(&self) {
        self.registry.refresh(&self.http).await;
    }
}

async fn refresh_periodically(proxy: Weak<Proxy>) {
    // The first read is the caller's (`Proxy::refresh`), before serving.
    let first = tokio::time::Instant::now() + REFRESH_EVERY;
    let mut tick = tokio::time::interval_at(first, REFRESH_EVERY);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tick.tick().await;
        // The server is gone: so is the reason to keep reading.
        let Some(proxy) = proxy.upgrade() else {
            return;
        };
        proxy.refresh().await;
    }
}

/// Adds the forwarding to the API routes of `router`: call before the API-key layer,
/// so that the key is checked first. Routes sparkd does not serve itself (embeddings,
/// Ollama's `/api/chat` and `/api/generate`) answer 404 unless an upstream takes them.
pub fn mount<S>(router: Router<S>, proxy: Arc<Proxy>) -> Router<S>
where
    S: Clone + Send + Sync + 'static,
{
    router
        .route("/v1/embeddings", post(unrouted))
        .route("/api/chat", post(unrouted))
        .route("/api/generate", post(unrouted))
        .route_layer(middleware::from_fn_with_state(proxy, forward::intercept))
}

async fn unrouted(uri: Uri) -> ApiError {
    ApiError {
        code: Some("model_not_found"),
        metric: "unknown_model",
        ..ApiError::not_found(format!(
            "no upstream serves the requested model on {} (sparkd itself serves \
             /v1/chat/completions and /v1/completions)",
            uri.path()
        ))
    }
}

#[cfg(test)]
mod fixture_tests;
#[cfg(test)]
mod tests;
