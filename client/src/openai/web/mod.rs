//! The web page at `/`: chat, recent jobs and node status, served from assets compiled
//! into the binary (no CDN, works offline). The page only calls the shim's own `/v1` API.

use axum::extract::Path;
use axum::http::{header, HeaderValue};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use axum::Router;

use super::error::ApiError;

/// Everything the page loads comes from this server; nothing may frame it, and its forms
/// never submit anywhere (the scripts send the requests, so no message ends up in a URL).
pub const CONTENT_SECURITY_POLICY: &str = "default-src 'self'; base-uri 'none'; \
     form-action 'none'; frame-ancestors 'none'; object-src 'none'";

/// One file of the page, embedded at compile time.
struct Asset {
    name: &'static str,
    content_type: &'static str,
    body: &'static [u8],
}

macro_rules! asset {
    ($name:literal, $content_type:literal) => {
        Asset {
            name: $name,
            content_type: $content_type,
            body: include_bytes!(concat!("assets/", $name)),
        }
    };
}

const INDEX: Asset = asset!("index.html", "text/html; charset=utf-8");

/// What `/assets/{name}` serves. Scripts are ES modules, which browsers only run when
/// served with a JavaScript content type.
const ASSETS: &[Asset] = &[
    asset!("style.css", "text/css; charset=utf-8"),
    asset!("app.js", "text/javascript; charset=utf-8"),
    asset!("api.js", "text/javascript; charset=utf-8"),
    asset!("chat.js", "text/javascript; charset=utf-8"),
    asset!("format.js", "text/javascript; charset=utf-8"),
    asset!("jobs.js", "text/javascript; charset=utf-8"),
    asset!("node.js", "text/javascript; charset=utf-8"),
    asset!("icon.svg", "image/svg+xml"),
];

/// The page's routes, to merge into the shim's router. They need no API key: the page
/// holds no data; it asks for the key before calling `/v1`.
pub fn routes<S: Clone + Send + Sync + 'static>() -> Router<S> {
    Router::new()
        .route("/", get(index))
        .route("/assets/{name}", get(asset))
}

async fn index() -> Response {
    serve(&INDEX)
}

async fn asset(Path(name): Path<String>) -> Response {
    match ASSETS.iter().find(|asset| asset.name == name) {
        Some(asset) => serve(asset),
        None => ApiError::not_found(format!("no such asset: {name}")).into_response(),
    }
}

fn serve(asset: &'static Asset) -> Response {
    (
        [
            (
                header::CONTENT_TYPE,
                HeaderValue::from_static(asset.content_type),
            ),
            (
                header::CONTENT_SECURITY_POLICY,
                HeaderValue::from_static(CONTENT_SECURITY_POLICY),
            ),
            (
                header::X_CONTENT_TYPE_OPTIONS,
                HeaderValue::from_static("nosniff"),
            ),
            (
                header::REFERRER_POLICY,
                HeaderValue::from_static("no-referrer"),
            ),
            // Revalidate every time, so a new binary's page is never mixed with old scripts.
            (header::CACHE_CONTROL, HeaderValue::from_static("no-cache")),
        ],
        asset.body,
    )
        .into_response()
}

#[cfg(test)]
mod tests;
