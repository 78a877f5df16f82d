//! `/v1/models` and `/v1/jobs` with the upstreams in them: sparkd's answer, completed
//! with the upstreams' models and the forwarded jobs. While the daemon is down, the
//! upstreams' part is still served.

use axum::extract::{Query, Request};
use axum::http::StatusCode;
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use axum::Json;
use serde::de::DeserializeOwned;
use serde::{Deserialize, Serialize};
use serde_json::{json, Value};

use super::Proxy;
use crate::openai::error::ApiError;
use crate::openai::routes::JobJson;

/// As the `/v1/jobs` handler: the default number of jobs and the most it returns.
const DEFAULT_JOBS_LIMIT: usize = 100;
const MAX_JOBS_LIMIT: usize = 1000;
/// Lists from our own handlers are small; this only bounds a bug.
const MAX_LIST_BYTES: usize = 64 << 20;

#[derive(Debug, Serialize, Deserialize)]
struct List<T> {
    object: String,
    data: Vec<T>,
}

fn list<T: Serialize>(data: Vec<T>) -> Response {
    Json(List {
        object: "list".into(),
        data,
    })
    .into_response()
}

/// What the sparkd handler answered: its list, "the daemon is down", or something to
/// pass on as it is.
enum Daemon<T> {
    Listed(Vec<T>),
    Down(Response),
    Other(Response),
}

async fn daemon_list<T: DeserializeOwned>(response: Response) -> Daemon<T> {
    match response.status() {
        StatusCode::OK => {}
        StatusCode::SERVICE_UNAVAILABLE => return Daemon::Down(response),
        _ => return Daemon::Other(response),
    }
    let parsed = axum::body::to_bytes(response.into_body(), MAX_LIST_BYTES)
        .await
        .ok()
        .and_then(|bytes| serde_json::from_slice::<List<T>>(&bytes).ok());
    match parsed {
        Some(list) => Daemon::Listed(list.data),
        None => Daemon::Other(
            ApiError::internal("could not read the daemon's list to merge the upstreams in")
                .into_response(),
        ),
    }
}

pub async fn models(proxy: &Proxy, request: Request, next: Next) -> Response {
    let mut data: Vec<Value> = match daemon_list(next.run(request).await).await {
        Daemon::Listed(models) => models,
        Daemon::Down(response)
            if proxy
                .registry
                .upstreams()
                .iter()
                .all(|u| u.models().is_empty()) =>
        {
            return response
        }
        Daemon::Down(_) => Vec::new(),
        Daemon::Other(response) => return response,
    };
    for upstream in proxy.registry.upstreams() {
        for id in upstream.models() {
            if data
                .iter()
                .any(|m| m.get("id").and_then(Value::as_str) == Some(&id))
            {
                continue;
            }
            data.push(json!({
                "id": id,
                "object": "model",
                "created": proxy.started_unix,
                "owned_by": upstream.name,
            }));
        }
    }
    list(data)
}

#[derive(Debug, Deserialize)]
struct JobsQuery {
    limit: Option<u32>,
}

pub async fn jobs(proxy: &Proxy, request: Request, next: Next) -> Response {
    // A bad query is the handler's to refuse.
    let Ok(Query(query)) = Query::<JobsQuery>::try_from_uri(request.uri()) else {
        return next.run(request).await;
    };
    let limit = query
        .limit
        .map_or(DEFAULT_JOBS_LIMIT, |l| l as usize)
        .min(MAX_JOBS_LIMIT);
    let daemon = match daemon_list::<JobJson>(next.run(request).await).await {
        Daemon::Listed(jobs) => Some(jobs.into_iter().map(Into::into).collect()),
        Daemon::Down(_) => None,
        Daemon::Other(response) => return response,
    };
    list(proxy.jobs.merge(daemon, limit))
}
