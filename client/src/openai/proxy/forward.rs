//! The middleware in front of the API routes: a request whose `model` an upstream serves
//! is forwarded to it byte for byte, with the tap on the response; anything else goes
//! on to sparkd's own handlers unchanged.

use std::borrow::Cow;
use std::sync::atomic::Ordering;
use std::sync::Arc;

use axum::body::{Body, Bytes};
use axum::extract::{FromRequest, Request, State};
use axum::http::{header, HeaderMap, HeaderName, Method, StatusCode};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use serde::Deserialize;

use super::listing;
use super::measure::{BodyKind, End, Endpoint, JobMeta};
use super::tap::{ReplyHead, Tap, TappedBody};
use super::upstream::Upstream;
use super::Proxy;
use crate::openai::error::ApiError;

/// What the middleware does with a request.
enum Action {
    Forward(Endpoint),
    Models,
    Jobs,
}

fn action(method: &Method, path: &str) -> Option<Action> {
    match (method, path) {
        (
            &Method::POST,
            "/v1/chat/completions" | "/v1/completions" | "/api/chat" | "/api/generate",
        ) => Some(Action::Forward(Endpoint::Generation)),
        (&Method::POST, "/v1/embeddings") => Some(Action::Forward(Endpoint::Embeddings)),
        (&Method::GET, "/v1/models") => Some(Action::Models),
        (&Method::GET, "/v1/jobs") => Some(Action::Jobs),
        _ => None,
    }
}

pub async fn intercept(State(proxy): State<Arc<Proxy>>, request: Request, next: Next) -> Response {
    match action(request.method(), request.uri().path()) {
        Some(Action::Forward(endpoint)) => forward_or_pass(&proxy, endpoint, request, next).await,
        Some(Action::Models) => listing::models(&proxy, request, next).await,
        Some(Action::Jobs) => listing::jobs(&proxy, request, next).await,
        None => next.run(request).await,
    }
}

/// Only the routing key of a request body; everything else is skipped unread.
#[derive(Deserialize)]
struct Probe<'a> {
    #[serde(borrow, default)]
    model: Option<Cow<'a, str>>,
}

fn requested_model(body: &[u8]) -> Option<String> {
    serde_json::from_slice::<Probe>(body)
        .ok()?
        .model
        .map(Cow::into_owned)
}

async fn forward_or_pass(
    proxy: &Proxy,
    endpoint: Endpoint,
    request: Request,
    next: Next,
) -> Response {
    let (parts, body) = request.into_parts();
    // The same extractor as the handlers, so the body limit and its 413 are theirs.
    let bytes = match Bytes::from_request(Request::from_parts(parts.clone(), body), &()).await {
        Ok(bytes) => bytes,
        Err(rejection) if rejection.status() == StatusCode::PAYLOAD_TOO_LARGE => {
            return ApiError::payload_too_large(proxy.max_body_bytes).into_response()
        }
        Err(rejection) => {
            return ApiError::bad_json(format!("could not read the request body: {rejection}"))
                .into_response()
        }
    };
    let target = match requested_model(&bytes) {
        Some(model) => upstream_for(proxy, &model).await.map(|u| (u, model)),
        None => None,
    };
    match target {
        Some((upstream, model)) => forward(proxy, upstream, model, endpoint, parts, bytes).await,
        None => {
            next.run(Request::from_parts(parts, Body::from(bytes)))
                .await
        }
    }
}

/// The upstream serving `model`, if any. A miss may re-read the upstreams' lists, but
/// not for sparkd's own model: its requests must not wait on other engines.
async fn upstream_for<'a>(proxy: &'a Proxy, model: &str) -> Option<&'a Upstream> {
    if let Some(upstream) = proxy.registry.find(model) {
        return Some(upstream);
    }
    if !proxy.registry.miss_refresh_due() {
        return None;
    }
    let sparkds = proxy.backend.models().await.unwrap_or_default();
    if sparkds.iter().any(|m| m.name == model) {
        return None;
    }
    proxy.registry.route(&proxy.http, model).await
}

async fn forward(
    proxy: &Proxy,
    upstream: &Upstream,
    model: String,
    endpoint: Endpoint,
    parts: axum::http::request::Parts,
    body: Bytes,
) -> Response {
    let meta = JobMeta {
        engine: upstream.name.clone(),
        upstream: upstream.url.clone(),
        model,
        request_id: proxy.next_request.fetch_add(1, Ordering::Relaxed),
        endpoint,
    };
    let path = parts
        .uri
        .path_and_query()
        .map_or_else(|| parts.uri.path(), |p| p.as_str());
    let url = format!("{}{path}", upstream.url);
    let headers = request_headers(&parts.headers, proxy.forward_authorization);
    // From here on the job is reported however it ends, the client leaving included.
    let mut tap = Tap::start(meta, proxy.sink.clone());
    let sent = proxy
        .http
        .request(parts.method, url)
        .headers(headers)
        .body(body)
        .send()
        .await;
    let reply = match sent {
        Ok(reply) => reply,
        Err(err) => {
            tap.finish(End::UpstreamFailed);
            return upstream_unreachable(&upstream.name, &err);
        }
    };
    let status = reply.status();
    let headers = response_headers(reply.headers());
    tap.reply(ReplyHead {
        status: status.as_u16(),
        kind: BodyKind::from_content_type(
            headers
                .get(header::CONTENT_TYPE)
                .and_then(|v| v.to_str().ok())
                .unwrap_or_default(),
        ),
        compressed: headers
            .get(header::CONTENT_ENCODING)
            .and_then(|v| v.to_str().ok())
            .is_some_and(|e| !e.trim().eq_ignore_ascii_case("identity")),
        content_length: reply.content_length(),
    });
    let body = TappedBody::new(reply.bytes_stream(), tap, proxy.shutdown.clone());
    let mut response = Response::new(Body::from_stream(body));
    *response.status_mut() = status;
    *response.headers_mut() = headers;
    response
}

fn upstream_unreachable(name: &str, err: &reqwest::Error) -> Response {
    // reqwest's message names the URL and the cause; it never holds the request body.
    ApiError {
        status: StatusCode::BAD_GATEWAY,
        message: format!("the upstream `{name}` did not answer: {err}"),
        error_type: "server_error",
        param: None,
        code: Some("upstream_unavailable"),
        metric: "upstream",
    }
    .into_response()
}

/// Headers that concern one connection, not the message (RFC 9110 section 7.6.1).
const HOP_BY_HOP: [HeaderName; 8] = [
    header::CONNECTION,
    HeaderName::from_static("keep-alive"),
    HeaderName::from_static("proxy-connection"),
    header::PROXY_AUTHENTICATE,
    header::PROXY_AUTHORIZATION,
    header::TE,
    header::TRAILER,
    header::TRANSFER_ENCODING,
];

/// `headers` without the hop-by-hop ones, including those the `Connection` header names.
fn end_to_end(headers: &HeaderMap) -> HeaderMap {
    let named: Vec<String> = headers
        .get_all(header::CONNECTION)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(','))
        .map(|name| name.trim().to_ascii_lowercase())
        .collect();
    let mut out = HeaderMap::with_capacity(headers.len());
    for (name, value) in headers {
        if HOP_BY_HOP.contains(name)
            || name == header::UPGRADE
            || named.iter().any(|n| n == name.as_str())
        {
            continue;
        }
        out.append(name.clone(), value.clone());
    }
    out
}

/// What goes upstream: the client's headers but the connection's own, `Host` and the
/// length (the client sets them again), `Expect` (the body is already here), and the API
/// key when it was this server's.
fn request_headers(incoming: &HeaderMap, forward_authorization: bool) -> HeaderMap {
    let mut headers = end_to_end(incoming);
    headers.remove(header::HOST);
    headers.remove(header::CONTENT_LENGTH);
    headers.remove(header::EXPECT);
    if !forward_authorization {
        headers.remove(header::AUTHORIZATION);
    }
    headers
}

/// What goes back: the upstream's headers but the connection's own. `Content-Length`
/// stays: the body is passed on unchanged.
fn response_headers(incoming: &HeaderMap) -> HeaderMap {
    end_to_end(incoming)
}

#[cfg(test)]
mod tests {
    use super::*;
    use axum::http::HeaderValue;

    #[test]
    fn routing_needs_only_the_model_field() {
        assert_eq!(
            requested_model(br#"{"messages":[{"role":"user","content":"{\"model\":\"x\"}"}],"model":"llama3.2"}"#).as_deref(),
            Some("llama3.2")
        );
        assert_eq!(requested_model(br#"{"messages":[]}"#), None);
        assert_eq!(requested_model(br#"{"model":null}"#), None);
        assert_eq!(requested_model(b"not json"), None);
        assert_eq!(
            requested_model(br#"{"model":"a\u00e9"}"#).as_deref(),
            Some("aé")
        );
    }

    #[test]
    fn actions_by_method_and_path() {
        assert!(matches!(
            action(&Method::POST, "/api/chat"),
            Some(Action::Forward(Endpoint::Generation))
        ));
        assert!(matches!(
            action(&Method::POST, "/v1/embeddings"),
            Some(Action::Forward(Endpoint::Embeddings))
        ));
        assert!(matches!(
            action(&Method::GET, "/v1/jobs"),
            Some(Action::Jobs)
        ));
        assert!(action(&Method::GET, "/v1/chat/completions").is_none());
        assert!(action(&Method::GET, "/v1/status").is_none());
    }

    #[test]
    fn hop_by_hop_headers_and_our_api_key_stay_here() {
        let mut incoming = HeaderMap::new();
        for (name, value) in [
            ("host", "127.0.0.1:8080"),
            ("connection", "keep-alive, x-private"),
            ("x-private", "1"),
            ("keep-alive", "timeout=5"),
            ("content-length", "12"),
            ("expect", "100-continue"),
            ("transfer-encoding", "chunked"),
            ("authorization", "Bearer ours"),
            ("content-type", "application/json"),
            ("accept-encoding", "gzip"),
            ("x-request-id", "abc"),
        ] {
            incoming.append(name, HeaderValue::from_static(value));
        }
        let upstream = request_headers(&incoming, false);
        let mut names: Vec<&str> = upstream.keys().map(|n| n.as_str()).collect();
        names.sort_unstable();
        assert_eq!(names, ["accept-encoding", "content-type", "x-request-id"]);
        assert!(request_headers(&incoming, true).contains_key(header::AUTHORIZATION));
        let back = response_headers(&incoming);
        assert!(back.contains_key(header::CONTENT_LENGTH) && !back.contains_key("x-private"));
    }
}
