//! The HTTP handlers, one per endpoint. See `README.md` beside this file for the API.

use std::sync::Arc;

use axum::body::Bytes;
use axum::extract::rejection::{BytesRejection, QueryRejection};
use axum::extract::{Path, Query, State};
use axum::http::{header, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::Json;
use futures::stream::{self, StreamExt};
use serde::{Deserialize, Serialize};
use tokio_util::sync::CancellationToken;

use super::backend::{Backend, BackendError};
use super::error::ApiError;
use super::generation::{self, Endpoint, ResponseMeta};
use super::metrics::Metrics;
use super::request::{self, ParsedRequest};
use crate::protocol::{
    CacheReport, ChatFormatReport, JobEntry, JobRecord, ModelInfo, StatusReport,
};

/// Jobs returned by `/v1/jobs` when no `limit` is given, and the most it returns.
const DEFAULT_JOBS_LIMIT: u32 = 100;
const MAX_JOBS_LIMIT: u32 = 1000;

/// What every handler shares.
#[derive(Clone)]
pub struct AppState {
    pub backend: Arc<dyn Backend>,
    pub metrics: Arc<Metrics>,
    /// Ends open streams when the server shuts down.
    pub shutdown: CancellationToken,
    /// Unix seconds when the shim started: the `created` of listed models.
    pub started_unix: u64,
    pub max_body_bytes: usize,
}

pub async fn chat_completions(
    State(state): State<AppState>,
    body: Result<Bytes, BytesRejection>,
) -> Result<Response, ApiError> {
    let body = read_body(body, state.max_body_bytes)?;
    let parsed = request::parse_chat(&body)?;
    generate(&state, parsed, Endpoint::Chat).await
}

pub async fn completions(
    State(state): State<AppState>,
    body: Result<Bytes, BytesRejection>,
) -> Result<Response, ApiError> {
    let body = read_body(body, state.max_body_bytes)?;
    let parsed = request::parse_completion(&body)?;
    generate(&state, parsed, Endpoint::Completion).await
}

fn read_body(body: Result<Bytes, BytesRejection>, limit: usize) -> Result<Bytes, ApiError> {
    body.map_err(|rejection| {
        if rejection.status() == StatusCode::PAYLOAD_TOO_LARGE {
            ApiError::payload_too_large(limit)
        } else {
            ApiError::bad_json(format!("could not read the request body: {rejection}"))
        }
    })
}

async fn generate(
    state: &AppState,
    parsed: ParsedRequest,
    endpoint: Endpoint,
) -> Result<Response, ApiError> {
    let model = match parsed.model {
        Some(model) => model,
        None => loaded_model(state.backend.as_ref()).await?.name,
    };
    let logprobs = parsed.generate.logprobs.is_some();
    let mut events = state
        .backend
        .generate(parsed.generate, parsed.format, parsed.options)
        .await?;
    // Wait for the first event before answering, so that a refusal (busy, unknown model,
    // context overflow) gets its own HTTP status instead of a 200 stream that fails at once.
    // If the client leaves meanwhile, this future is dropped and the generation with it.
    let first = match events.next().await {
        Some(event) => event?,
        None => {
            return Err(BackendError::Unavailable(
                "the daemon closed the generation without an answer".into(),
            )
            .into())
        }
    };
    let events = stream::iter([Ok(first)]).chain(events).boxed();
    let meta = ResponseMeta::new(endpoint, model, parsed.include_usage, logprobs);
    if parsed.stream {
        Ok(generation::stream(
            meta,
            events,
            state.metrics.clone(),
            state.shutdown.clone(),
        ))
    } else {
        generation::collect(meta, events, &state.metrics).await
    }
}

async fn loaded_model(backend: &dyn Backend) -> Result<ModelInfo, ApiError> {
    backend
        .models()
        .await?
        .into_iter()
        .next()
        .ok_or_else(|| ApiError::internal("the daemon has no model loaded"))
}

/// One entry of `/v1/models`: OpenAI's four fields plus a few facts about the file.
#[derive(Debug, Serialize)]
struct ModelObject {
    id: String,
    object: &'static str,
    created: u64,
    owned_by: &'static str,
    architecture: String,
    quantization: String,
    parameters: u64,
    context_length: u32,
}

impl ModelObject {
    fn new(info: ModelInfo, created: u64) -> Self {
        Self {
            id: info.name,
            object: "model",
            created,
            owned_by: "sparkd",
            architecture: info.architecture,
            quantization: info.quantization,
            parameters: info.parameters,
            context_length: info.context_length,
        }
    }
}

#[derive(Debug, Serialize)]
struct List<T> {
    object: &'static str,
    data: Vec<T>,
}

pub async fn models(State(state): State<AppState>) -> Result<Response, ApiError> {
    let data = state
        .backend
        .models()
        .await?
        .into_iter()
        .map(|m| ModelObject::new(m, state.started_unix))
        .collect();
    Ok(Json(List {
        object: "list",
        data,
    })
    .into_response())
}

pub async fn model(
    State(state): State<AppState>,
    Path(id): Path<String>,
) -> Result<Response, ApiError> {
    let info = state
        .backend
        .models()
        .await?
        .into_iter()
        .find(|m| m.name == id)
        .ok_or_else(|| {
            ApiError::from(BackendError::Rejected {
                kind: crate::protocol::ErrorKind::UnknownModel,
                message: format!("the model '{id}' does not exist"),
            })
        })?;
    Ok(Json(ModelObject::new(info, state.started_unix)).into_response())
}

#[derive(Debug, Serialize)]
struct Health {
    status: &'static str,
    #[serde(skip_serializing_if = "Option::is_none")]
    model: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    daemon_version: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    error: Option<String>,
}

/// 200 when the daemon answers a status request, else 503 saying why.
pub async fn health(State(state): State<AppState>) -> Response {
    match state.backend.status().await {
        Ok(status) => Json(Health {
            status: "ok",
            model: Some(status.model.name),
            daemon_version: Some(status.daemon_version),
            error: None,
        })
        .into_response(),
        Err(err) => (
            StatusCode::SERVICE_UNAVAILABLE,
            Json(Health {
                status: "unavailable",
                model: None,
                daemon_version: None,
                error: Some(err.to_string()),
            }),
        )
            .into_response(),
    }
}

pub async fn metrics(State(state): State<AppState>) -> Response {
    let status = state.backend.status().await.ok();
    let cache = match status {
        Some(_) => state.backend.cache_status().await.ok(),
        None => None,
    };
    let text = state.metrics.render(status.as_ref(), cache.as_ref());
    (
        [(
            header::CONTENT_TYPE,
            "text/plain; version=0.0.4; charset=utf-8",
        )],
        text,
    )
        .into_response()
}

/// A job as `/v1/jobs` shows it: the record's fields, and what `JobEntry` adds beside it
/// (`null` when not known). Read back by the proxy, which merges its own jobs in.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct JobJson {
    #[serde(flatten)]
    pub record: JobRecord,
    /// Prompt tokens taken from the daemon's prefix cache.
    #[serde(default)]
    pub cached_tokens: Option<u32>,
}

impl From<JobEntry> for JobJson {
    fn from(entry: JobEntry) -> Self {
        JobJson {
            record: entry.record,
            cached_tokens: entry.cached_tokens,
        }
    }
}

impl From<JobJson> for JobEntry {
    fn from(job: JobJson) -> Self {
        JobEntry {
            record: job.record,
            cached_tokens: job.cached_tokens,
        }
    }
}

#[derive(Debug, Deserialize)]
pub struct JobsQuery {
    limit: Option<u32>,
}

pub async fn jobs(
    State(state): State<AppState>,
    query: Result<Query<JobsQuery>, QueryRejection>,
) -> Result<Response, ApiError> {
    let Query(query) = query.map_err(|e| ApiError::invalid("limit".to_string(), e.body_text()))?;
    let limit = query
        .limit
        .unwrap_or(DEFAULT_JOBS_LIMIT)
        .min(MAX_JOBS_LIMIT);
    let data: Vec<JobJson> = state
        .backend
        .jobs(limit)
        .await?
        .into_iter()
        .map(JobJson::from)
        .collect();
    Ok(Json(List {
        object: "list",
        data,
    })
    .into_response())
}

/// `/v1/status`: the daemon's `StatusReport`, plus `prefix_cache` (null from a daemon
/// older than protocol 1.2) and `chat_format` (null before 1.8).
#[derive(Debug, Serialize)]
struct StatusBody {
    #[serde(flatten)]
    status: StatusReport,
    prefix_cache: Option<CacheReport>,
    chat_format: Option<ChatFormatReport>,
}

pub async fn status(State(state): State<AppState>) -> Result<Response, ApiError> {
    let status = state.backend.status().await?;
    let prefix_cache = state.backend.cache_status().await.ok();
    let chat_format = state.backend.chat_format().await.ok();
    Ok(Json(StatusBody {
        status,
        prefix_cache,
        chat_format,
    })
    .into_response())
}

pub async fn not_found() -> ApiError {
    ApiError::not_found("no such endpoint")
}

pub async fn method_not_allowed() -> ApiError {
    ApiError::method_not_allowed()
}
