//! The page and its assets over real HTTP, through the shim's whole router.

use std::sync::Arc;

use futures::future::BoxFuture;
use reqwest::header::{CONTENT_SECURITY_POLICY, CONTENT_TYPE, X_CONTENT_TYPE_OPTIONS};
use tokio_util::sync::CancellationToken;

use super::{ASSETS, CONTENT_SECURITY_POLICY as CSP, INDEX};
use crate::openai::{bind, router, serve, Backend, BackendError, EventStream, RouterOptions};
use crate::protocol::{
    GenerateOption, GenerateRequest, JobEntry, ModelInfo, OutputFormat, StatusReport,
};

/// No daemon at all: the page must be served without one.
struct NoDaemon;

fn gone<T>() -> BoxFuture<'static, Result<T, BackendError>> {
    Box::pin(async { Err(BackendError::Unavailable("no daemon in this test".into())) })
}

impl Backend for NoDaemon {
    fn generate(
        &self,
        _: GenerateRequest,
        _: OutputFormat,
        _: Vec<GenerateOption>,
    ) -> BoxFuture<'_, Result<EventStream, BackendError>> {
        gone()
    }
    fn models(&self) -> BoxFuture<'_, Result<Vec<ModelInfo>, BackendError>> {
        gone()
    }
    fn status(&self) -> BoxFuture<'_, Result<StatusReport, BackendError>> {
        gone()
    }
    fn jobs(&self, _: u32) -> BoxFuture<'_, Result<Vec<JobEntry>, BackendError>> {
        gone()
    }
}

/// Serves the shim, with an API key, on a free port; returns its base URL.
async fn start() -> (String, CancellationToken) {
    let shutdown = CancellationToken::new();
    let listener = bind("127.0.0.1:0".parse().expect("addr"), Some("k"))
        .await
        .expect("bind");
    let base = format!("http://{}", listener.local_addr().expect("addr"));
    let options = RouterOptions {
        api_key: Some("k".into()),
        ..RouterOptions::default()
    };
    let app = router(Arc::new(NoDaemon), options, shutdown.clone());
    tokio::spawn({
        let shutdown = shutdown.clone();
        async move { serve(listener, app, shutdown).await.expect("serve") }
    });
    (base, shutdown)
}

async fn get(url: String) -> reqwest::Response {
    reqwest::Client::builder()
        .no_proxy()
        .build()
        .expect("client")
        .get(url)
        .send()
        .await
        .expect("send")
}

fn header(response: &reqwest::Response, name: reqwest::header::HeaderName) -> String {
    response
        .headers()
        .get(&name)
        .and_then(|v| v.to_str().ok())
        .unwrap_or_else(|| panic!("no {name} header"))
        .to_string()
}

/// The content type a browser needs for a file with this name.
fn expected_type(name: &str) -> &'static str {
    match name.rsplit_once('.').map(|(_, ext)| ext) {
        Some("js") => "text/javascript; charset=utf-8",
        Some("css") => "text/css; charset=utf-8",
        Some("svg") => "image/svg+xml",
        Some("html") => "text/html; charset=utf-8",
        other => panic!("no expected content type for {name} ({other:?})"),
    }
}

/// The asset names `text` refers to: `/assets/NAME` in the page, `./NAME` imports in scripts.
fn references(text: &str) -> Vec<String> {
    let mut names = Vec::new();
    for marker in ["\"/assets/", "'./"] {
        for (_, rest) in text
            .match_indices(marker)
            .map(|(i, _)| text.split_at(i + marker.len()))
        {
            if let Some(end) = rest.find(['"', '\'']) {
                names.push(rest[..end].to_string());
            }
        }
    }
    names
}

#[tokio::test]
async fn the_page_is_html_with_a_strict_csp_and_needs_no_key() {
    let (base, shutdown) = start().await;
    let response = get(format!("{base}/")).await;
    assert_eq!(response.status(), 200);
    assert_eq!(header(&response, CONTENT_TYPE), "text/html; charset=utf-8");
    let csp = header(&response, CONTENT_SECURITY_POLICY);
    assert_eq!(csp, CSP);
    assert!(csp.starts_with("default-src 'self';"), "{csp}");
    assert_eq!(header(&response, X_CONTENT_TYPE_OPTIONS), "nosniff");
    let body = response.text().await.expect("body");
    assert!(body.starts_with("<!doctype html>"), "{body}");
    assert!(body.contains(r#"<script type="module" src="/assets/app.js">"#));

    // The data behind the page still needs the key.
    let status = get(format!("{base}/v1/status")).await;
    assert_eq!(status.status(), 401);
    shutdown.cancel();
}

#[tokio::test]
async fn every_asset_the_page_and_its_scripts_load_is_served_with_its_type() {
    let (base, shutdown) = start().await;
    let mut pending = references(std::str::from_utf8(INDEX.body).expect("utf-8 page"));
    let mut seen = Vec::new();
    while let Some(name) = pending.pop() {
        if seen.contains(&name) {
            continue;
        }
        let response = get(format!("{base}/assets/{name}")).await;
        assert_eq!(response.status(), 200, "{name}");
        assert_eq!(
            header(&response, CONTENT_TYPE),
            expected_type(&name),
            "{name}"
        );
        assert_eq!(header(&response, CONTENT_SECURITY_POLICY), CSP, "{name}");
        let body = response.text().await.expect("body");
        assert!(!body.is_empty(), "{name} is empty");
        if name.ends_with(".js") {
            pending.extend(references(&body));
        }
        seen.push(name);
    }
    for expected in [
        "style.css",
        "app.js",
        "chat.js",
        "jobs.js",
        "node.js",
        "icon.svg",
    ] {
        assert!(
            seen.iter().any(|s| s == expected),
            "{expected} not loaded: {seen:?}"
        );
    }
    // Nothing embedded that the page never loads.
    for asset in ASSETS {
        assert!(
            seen.iter().any(|s| s == asset.name),
            "{} is never loaded",
            asset.name
        );
    }
    shutdown.cancel();
}

#[tokio::test]
async fn unknown_assets_are_404() {
    let (base, shutdown) = start().await;
    for path in [
        "/assets/nope.js",
        "/assets/",
        "/assets/..%2Fmod.rs",
        "/assets/app.js.map",
        "/index.html",
    ] {
        let response = get(format!("{base}{path}")).await;
        assert_eq!(response.status(), 404, "{path}");
        assert_eq!(
            header(&response, CONTENT_TYPE),
            "application/json",
            "{path}"
        );
    }
    shutdown.cancel();
}

#[test]
fn references_finds_page_links_and_module_imports() {
    let html = r#"<link href="/assets/a.css"><script src="/assets/b.js"></script>"#;
    assert_eq!(references(html), ["a.css", "b.js"]);
    let js = "import { x } from './c.js';\nimport './d.js';";
    assert_eq!(references(js), ["c.js", "d.js"]);
}
