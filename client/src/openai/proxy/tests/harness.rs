//! A scripted upstream engine (real HTTP on 127.0.0.1, answering with the captured
//! fixtures) and a fake daemon, around the real router with the proxy mounted.

use std::convert::Infallible;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::body::{Body, Bytes};
use axum::extract::State;
use axum::http::{header, HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::Router;
use futures::future::BoxFuture;
use futures::stream::{self, StreamExt};
use tokio_util::sync::CancellationToken;

use crate::openai::proxy::{Proxy, ProxySettings, UpstreamSpec};
use crate::openai::{
    bind, router, serve, Backend, BackendError, BackendEvent, EventStream, RouterOptions,
};
use crate::protocol::{
    DoneEvent, ExternalJob, FinishReason, GenerateOption, GenerateRequest, JobEntry, JobRecord,
    ModelInfo, OutputFormat, StatusReport, TokenEvent, Usage,
};

pub fn http() -> reqwest::Client {
    reqwest::Client::builder().no_proxy().build().unwrap()
}

/// A request body with odd spacing and field order, to check it travels unchanged.
pub fn chat_body(model: &str, stream: bool) -> String {
    format!(
        "{{ \"messages\": [{{\"role\":\"user\",\"content\":\"Say hi.\"}}],\n  \"stream\": {stream}, \"model\": \"{model}\", \"max_tokens\":12 }}"
    )
}

pub const UPSTREAM_MODEL: &str = "up-model";
pub const SPARKD_MODEL: &str = "sparkd-model";
pub const LLAMA_STREAM_USAGE: &[u8] = include_bytes!("../fixtures/llama_chat_stream_usage.sse");
pub const LLAMA_JSON: &[u8] = include_bytes!("../fixtures/llama_chat.json");
pub const LLAMA_ERROR: &[u8] = include_bytes!("../fixtures/llama_error_400.json");
pub const LLAMA_EMBEDDINGS: &[u8] = include_bytes!("../fixtures/llama_embeddings.json");
pub const OLLAMA_CHAT_STREAM: &[u8] = include_bytes!("../fixtures/ollama_chat_stream.ndjson");

/// What the scripted upstream saw and how it answers.
#[derive(Default)]
pub struct UpstreamState {
    pub models: Mutex<Vec<String>>,
    /// Headers and body of the last generation request.
    pub last: Mutex<Option<(HeaderMap, Bytes)>>,
    pub model_lists: AtomicU64,
    /// Pause between streamed chunks.
    pub chunk_delay_ms: AtomicU64,
}

pub struct FakeUpstream {
    pub url: String,
    pub state: Arc<UpstreamState>,
    _shutdown: tokio_util::sync::DropGuard,
}

impl FakeUpstream {
    pub async fn start() -> Self {
        let state = Arc::new(UpstreamState::default());
        state.models.lock().unwrap().push(UPSTREAM_MODEL.into());
        let app = Router::new()
            .route("/v1/models", get(list_models))
            .route("/v1/chat/completions", post(chat))
            .route("/v1/embeddings", post(embeddings))
            .route("/api/chat", post(ollama_chat))
            .with_state(state.clone());
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let url = format!("http://{}", listener.local_addr().unwrap());
        let shutdown = CancellationToken::new();
        let stop = shutdown.clone();
        tokio::spawn(async move {
            let _ = axum::serve(listener, app)
                .with_graceful_shutdown(stop.cancelled_owned())
                .await;
        });
        Self {
            url,
            state,
            _shutdown: shutdown.drop_guard(),
        }
    }
}

async fn list_models(State(state): State<Arc<UpstreamState>>) -> Response {
    state.model_lists.fetch_add(1, Ordering::SeqCst);
    let data: Vec<serde_json::Value> = state
        .models
        .lock()
        .unwrap()
        .iter()
        .map(|id| serde_json::json!({"id": id, "object": "model", "owned_by": "llamacpp"}))
        .collect();
    axum::Json(serde_json::json!({"object": "list", "data": data})).into_response()
}

/// `body` in pieces (the SSE events or NDJSON lines, each split once more in the
/// middle so keys straddle chunks), each after the configured pause.
fn chunked(state: &UpstreamState, body: &'static [u8], separator: &'static str) -> Body {
    let delay = Duration::from_millis(state.chunk_delay_ms.load(Ordering::SeqCst));
    let text = std::str::from_utf8(body).expect("utf-8 fixture");
    let pieces: Vec<Bytes> = text
        .split_inclusive(separator)
        .flat_map(|event| {
            let mid = event.len() / 2;
            let mid = (mid..event.len())
                .find(|&i| event.is_char_boundary(i))
                .unwrap_or(event.len());
            [event[..mid].to_string(), event[mid..].to_string()]
        })
        .filter(|p| !p.is_empty())
        .map(Bytes::from)
        .collect();
    Body::from_stream(stream::iter(pieces).then(move |piece| async move {
        tokio::time::sleep(delay).await;
        Ok::<_, Infallible>(piece)
    }))
}

fn remember(state: &UpstreamState, headers: HeaderMap, body: Bytes) -> serde_json::Value {
    let parsed = serde_json::from_slice(&body).unwrap_or_default();
    *state.last.lock().unwrap() = Some((headers, body));
    parsed
}

async fn chat(
    State(state): State<Arc<UpstreamState>>,
    headers: HeaderMap,
    body: Bytes,
) -> Response {
    let request = remember(&state, headers, body);
    if request["messages"].as_str().is_some() {
        return (
            StatusCode::BAD_REQUEST,
            [(header::CONTENT_TYPE, "application/json; charset=utf-8")],
            LLAMA_ERROR,
        )
            .into_response();
    }
    if request["stream"] == true {
        let mut response = chunked(&state, LLAMA_STREAM_USAGE, "\n\n").into_response();
        response
            .headers_mut()
            .insert(header::CONTENT_TYPE, "text/event-stream".parse().unwrap());
        return response;
    }
    (
        [(header::CONTENT_TYPE, "application/json; charset=utf-8")],
        LLAMA_JSON,
    )
        .into_response()
}

async fn embeddings(
    State(state): State<Arc<UpstreamState>>,
    headers: HeaderMap,
    body: Bytes,
) -> Response {
    remember(&state, headers, body);
    (
        [(header::CONTENT_TYPE, "application/json; charset=utf-8")],
        LLAMA_EMBEDDINGS,
    )
        .into_response()
}

async fn ollama_chat(
    State(state): State<Arc<UpstreamState>>,
    headers: HeaderMap,
    body: Bytes,
) -> Response {
    remember(&state, headers, body);
    let mut response = chunked(&state, OLLAMA_CHAT_STREAM, "\n").into_response();
    response.headers_mut().insert(
        header::CONTENT_TYPE,
        "application/x-ndjson".parse().unwrap(),
    );
    response
}

/// A daemon that serves one model, records forwarded jobs and can be "down".
#[derive(Default)]
pub struct FakeDaemon {
    pub down: AtomicBool,
    pub recorded: Mutex<Vec<ExternalJob>>,
    pub generations: AtomicU64,
}

impl FakeDaemon {
    fn unavailable() -> BackendError {
        BackendError::Unavailable("sparkd is not running".into())
    }

    fn is_down(&self) -> bool {
        self.down.load(Ordering::SeqCst)
    }

    /// The jobs recorded so far, waiting up to 5 s for at least `n`.
    pub async fn wait_recorded(&self, n: usize) -> Vec<ExternalJob> {
        for _ in 0..500 {
            let jobs = self.recorded.lock().unwrap().clone();
            if jobs.len() >= n {
                return jobs;
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        panic!("fewer than {n} jobs were recorded");
    }

    fn record(n: usize, job: &ExternalJob) -> JobRecord {
        job.to_record(100 + n as u64, Some(1), Some(2))
    }
}

pub struct SharedDaemon(pub Arc<FakeDaemon>);

impl Backend for SharedDaemon {
    fn generate(
        &self,
        req: GenerateRequest,
        _: OutputFormat,
        _: Vec<GenerateOption>,
    ) -> BoxFuture<'_, Result<EventStream, BackendError>> {
        Box::pin(async move {
            if self.0.is_down() {
                return Err(FakeDaemon::unavailable());
            }
            self.0.generations.fetch_add(1, Ordering::SeqCst);
            let events = vec![
                Ok(BackendEvent::Token(TokenEvent {
                    id: req.id,
                    token: 1,
                    text: "from sparkd".into(),
                    logprobs: None,
                })),
                Ok(BackendEvent::Done(DoneEvent {
                    id: req.id,
                    finish_reason: FinishReason::Stop,
                    usage: Usage {
                        prompt_tokens: 2,
                        completion_tokens: 1,
                    },
                    timings: Default::default(),
                })),
            ];
            Ok(stream::iter(events).boxed())
        })
    }

    fn models(&self) -> BoxFuture<'_, Result<Vec<ModelInfo>, BackendError>> {
        Box::pin(async move {
            if self.0.is_down() {
                return Err(FakeDaemon::unavailable());
            }
            Ok(vec![ModelInfo {
                name: SPARKD_MODEL.into(),
                path: "/m.gguf".into(),
                architecture: "llama".into(),
                quantization: "Q4_1".into(),
                parameters: 1,
                context_length: 2048,
                file_bytes: 1,
            }])
        })
    }

    fn status(&self) -> BoxFuture<'_, Result<StatusReport, BackendError>> {
        Box::pin(async move { Err(FakeDaemon::unavailable()) })
    }

    fn jobs(&self, limit: u32) -> BoxFuture<'_, Result<Vec<JobEntry>, BackendError>> {
        Box::pin(async move {
            if self.0.is_down() {
                return Err(FakeDaemon::unavailable());
            }
            let recorded = self.0.recorded.lock().unwrap();
            Ok(recorded
                .iter()
                .enumerate()
                .rev()
                .take(limit as usize)
                .map(|(n, job)| FakeDaemon::record(n, job).into())
                .collect())
        })
    }

    fn record_job(&self, job: ExternalJob) -> BoxFuture<'_, Result<JobRecord, BackendError>> {
        Box::pin(async move {
            if self.0.is_down() {
                return Err(FakeDaemon::unavailable());
            }
            let mut recorded = self.0.recorded.lock().unwrap();
            let record = FakeDaemon::record(recorded.len(), &job);
            recorded.push(job);
            Ok(record)
        })
    }
}

/// The shim with the proxy mounted, in front of `upstream` and a fake daemon.
pub struct Shim {
    pub base: String,
    pub daemon: Arc<FakeDaemon>,
    pub shutdown: CancellationToken,
    _stop_on_drop: tokio_util::sync::DropGuard,
}

impl Shim {
    /// `/metrics` once it has `series` (forwarded jobs are counted just after the daemon
    /// recorded them).
    pub async fn metrics_once(&self, series: &str) -> String {
        for _ in 0..200 {
            let text = http()
                .get(self.url("/metrics"))
                .send()
                .await
                .unwrap()
                .text()
                .await
                .unwrap();
            if text.contains(series) {
                return text;
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        panic!("/metrics never showed {series}");
    }

    /// Posts a one-message chat for `model` to the shim.
    pub async fn post_chat(&self, model: &str, stream: bool) -> reqwest::Response {
        http()
            .post(self.url("/v1/chat/completions"))
            .body(chat_body(model, stream))
            .send()
            .await
            .unwrap()
    }

    pub async fn start(upstream_url: &str, api_key: Option<&str>) -> Self {
        let daemon = Arc::new(FakeDaemon::default());
        let backend: Arc<dyn Backend> = Arc::new(SharedDaemon(daemon.clone()));
        let spec: UpstreamSpec = format!("llama={upstream_url}").parse().unwrap();
        let shutdown = CancellationToken::new();
        let settings = ProxySettings {
            forward_authorization: api_key.is_none(),
            max_body_bytes: 1 << 20,
            shutdown: shutdown.clone(),
        };
        let proxy = Proxy::start(vec![spec], backend.clone(), settings).unwrap();
        proxy.refresh().await;
        let options = RouterOptions {
            api_key: api_key.map(str::to_string),
            max_body_bytes: 1 << 20,
            proxy: Some(proxy),
        };
        let app = router(backend, options, shutdown.clone());
        let listener = bind("127.0.0.1:0".parse().unwrap(), api_key).await.unwrap();
        let base = format!("http://{}", listener.local_addr().unwrap());
        let stop = shutdown.clone();
        tokio::spawn(async move { serve(listener, app, stop).await.unwrap() });
        Self {
            base,
            daemon,
            shutdown: shutdown.clone(),
            _stop_on_drop: shutdown.drop_guard(),
        }
    }

    pub fn url(&self, path: &str) -> String {
        format!("{}{path}", self.base)
    }
}
