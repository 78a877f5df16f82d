//! Builds the router (routes, auth, metrics, limits) and serves it until shutdown.

use std::any::Any;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::{SystemTime, UNIX_EPOCH};

use axum::body::Body;
use axum::extract::{DefaultBodyLimit, MatchedPath, Request, State};
use axum::http::Response as HttpResponse;
use axum::middleware::{self, Next};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::serve::ListenerExt;
use axum::Router;
use tokio::net::TcpListener;
use tokio_util::sync::CancellationToken;
use tower_http::catch_panic::CatchPanicLayer;

use super::auth::{require_api_key, ApiKey};
use super::backend::Backend;
use super::error::{ApiError, ErrorMetric};
use super::metrics::Metrics;
use super::proxy::{self, Proxy};
use super::routes::{self, AppState};

/// Request bodies larger than this are refused with 413 (prompts are text; 4 MiB is a lot).
pub const DEFAULT_MAX_BODY_BYTES: usize = 4 << 20;

/// How the router behaves, independent of where the backend lives.
#[derive(Debug, Clone)]
pub struct RouterOptions {
    pub api_key: Option<String>,
    pub max_body_bytes: usize,
    /// Forwards requests for upstream engines' models (`--upstream`).
    pub proxy: Option<Arc<Proxy>>,
}

impl Default for RouterOptions {
    fn default() -> Self {
        Self {
            api_key: None,
            max_body_bytes: DEFAULT_MAX_BODY_BYTES,
            proxy: None,
        }
    }
}

#[derive(Debug, thiserror::Error)]
pub enum ServeError {
    // The cause is the error's source, which the caller prints after this.
    #[error("cannot listen on {addr}")]
    Bind {
        addr: SocketAddr,
        source: std::io::Error,
    },
    #[error("the HTTP server failed: {0}")]
    Serve(std::io::Error),
    #[error(transparent)]
    Proxy(#[from] super::proxy::ProxyError),
}

/// The whole HTTP API over `backend`. `shutdown` also ends open SSE streams.
pub fn router(
    backend: Arc<dyn Backend>,
    options: RouterOptions,
    shutdown: CancellationToken,
) -> Router {
    let state = AppState {
        backend,
        metrics: Arc::new(Metrics::default()),
        shutdown,
        started_unix: SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map_or(0, |d| d.as_secs()),
        max_body_bytes: options.max_body_bytes,
    };
    let key = ApiKey(options.api_key.map(Arc::from));

    let mut v1 = Router::new()
        .route("/v1/chat/completions", post(routes::chat_completions))
        .route("/v1/completions", post(routes::completions))
        .route("/v1/models", get(routes::models))
        .route("/v1/models/{id}", get(routes::model))
        .route("/v1/jobs", get(routes::jobs))
        .route("/v1/status", get(routes::status));
    // Inside the key check: forwarded requests need the key too.
    if let Some(proxy) = options.proxy {
        proxy.report_to(state.metrics.clone());
        v1 = proxy::mount(v1, proxy);
    }
    let v1 = v1.route_layer(middleware::from_fn_with_state(key, require_api_key));

    Router::new()
        .merge(v1)
        .route("/health", get(routes::health))
        .route("/metrics", get(routes::metrics))
        .merge(super::web::routes())
        .fallback(routes::not_found)
        .method_not_allowed_fallback(routes::method_not_allowed)
        .layer(middleware::from_fn_with_state(state.clone(), count_request))
        .layer(DefaultBodyLimit::max(options.max_body_bytes))
        .layer(CatchPanicLayer::custom(panic_response))
        .with_state(state)
}

/// Counts every answer by route pattern and status, and failed ones by error kind.
async fn count_request(State(state): State<AppState>, request: Request, next: Next) -> Response {
    // Route patterns, never raw paths, so a scanner cannot create unbounded series.
    let endpoint = request
        .extensions()
        .get::<MatchedPath>()
        .map_or_else(|| "other".to_string(), |p| p.as_str().to_string());
    let response = next.run(request).await;
    state
        .metrics
        .record_request(&endpoint, response.status().as_u16());
    if let Some(ErrorMetric(kind)) = response.extensions().get::<ErrorMetric>() {
        state.metrics.record_error(kind);
        // Client mistakes are the client's business; our and the daemon's failures are ours.
        if response.status().is_server_error() {
            tracing::warn!(%endpoint, status = response.status().as_u16(), kind, "request failed");
        }
    }
    response
}

/// A bug must not take the connection down silently: answer 500 in OpenAI's shape.
fn panic_response(panic: Box<dyn Any + Send + 'static>) -> HttpResponse<Body> {
    let detail = panic
        .downcast_ref::<&str>()
        .map(|s| s.to_string())
        .or_else(|| panic.downcast_ref::<String>().cloned())
        .unwrap_or_default();
    tracing::error!(%detail, "a request handler panicked");
    ApiError::internal("internal error in the OpenAI shim").into_response()
}

/// Serves `router` on `listener` until `shutdown` is cancelled, then waits for open
/// connections (streams end at shutdown too, so this is quick).
pub async fn serve(
    listener: TcpListener,
    router: Router,
    shutdown: CancellationToken,
) -> Result<(), ServeError> {
    // Tokens go out one small write at a time: without TCP_NODELAY, Nagle's algorithm
    // holds each behind the client's delayed ACK of the previous one (up to 40 ms).
    let listener = listener.tap_io(|tcp| {
        let _ = tcp.set_nodelay(true);
    });
    axum::serve(listener, router)
        .with_graceful_shutdown(shutdown.cancelled_owned())
        .await
        .map_err(ServeError::Serve)
}

/// Binds `addr`, warning when it is reachable from other hosts without an API key.
pub async fn bind(addr: SocketAddr, api_key: Option<&str>) -> Result<TcpListener, ServeError> {
    let listener = TcpListener::bind(addr)
        .await
        .map_err(|source| ServeError::Bind { addr, source })?;
    if !addr.ip().is_loopback() && api_key.is_none() {
        tracing::warn!(
            %addr,
            "the OpenAI endpoint listens beyond this host without an API key: anyone who can \
             reach it can use the model (set --api-key or SPARKD_API_KEY)"
        );
    }
    Ok(listener)
}
