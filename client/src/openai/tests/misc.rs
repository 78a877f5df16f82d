//! Errors, auth, limits and the non-generation endpoints over HTTP.

use serde_json::{json, Value};

use super::client;
use super::fake::{cached_tokens, Behaviour, TestServer, MODEL};
use crate::openai::RouterOptions;

async fn send(request: reqwest::RequestBuilder) -> (u16, Value) {
    let response = request.send().await.expect("send");
    let status = response.status().as_u16();
    let text = response.text().await.expect("body");
    let value = serde_json::from_str(&text).unwrap_or_else(|e| panic!("not JSON ({e}): {text}"));
    (status, value)
}

fn assert_openai_error(body: &Value, error_type: &str) {
    let error = &body["error"];
    assert!(
        error["message"].as_str().is_some_and(|m| !m.is_empty()),
        "{body}"
    );
    assert_eq!(error["type"], error_type, "{body}");
    assert!(
        error.get("param").is_some() && error.get("code").is_some(),
        "{body}"
    );
}

fn chat(content: &str) -> Value {
    json!({"model": MODEL, "messages": [{"role": "user", "content": content}]})
}

#[tokio::test]
async fn malformed_bodies_get_openai_shaped_400s() {
    let server = TestServer::start(Behaviour::Reply, RouterOptions::default()).await;
    let url = server.url("/v1/chat/completions");
    let raw_bodies: [&[u8]; 4] = [b"{not json", b"", b"[]", b"\xff\xff"];
    for raw in raw_bodies {
        let (status, body) = send(client().post(&url).body(raw.to_vec())).await;
        assert_eq!(status, 400, "{raw:?}");
        assert_openai_error(&body, "invalid_request_error");
    }
    let typed = [
        (json!({"model": MODEL, "messages": 3}), "messages"),
        (
            json!({"model": MODEL, "messages": [{"role": "user", "content": "x"}], "temperature": "x"}),
            "temperature",
        ),
        (
            json!({"model": MODEL, "messages": [{"role": "user", "content": "x"}], "n": 2}),
            "n",
        ),
    ];
    for (request, param) in typed {
        let (status, body) = send(client().post(&url).json(&request)).await;
        assert_eq!(status, 400, "{request}");
        assert_openai_error(&body, "invalid_request_error");
        assert_eq!(body["error"]["param"], param);
    }
    // Nothing reached the daemon.
    assert!(server.fake.requests.lock().unwrap().is_empty());
}

#[tokio::test]
async fn daemon_errors_map_to_statuses() {
    let server = TestServer::start(Behaviour::Busy, RouterOptions::default()).await;
    let url = server.url("/v1/chat/completions");
    for stream in [false, true] {
        let mut request = chat("x");
        request["stream"] = json!(stream);
        let response = client().post(&url).json(&request).send().await.unwrap();
        assert_eq!(response.status(), 429, "stream={stream}");
        assert_eq!(
            response.headers().get("retry-after").map(|v| v.as_bytes()),
            Some(&b"1"[..]),
            "stream={stream}"
        );
        let body: Value = response.json().await.unwrap();
        assert_eq!(body["error"]["code"], "rate_limit_exceeded");
    }

    server.fake.set(Behaviour::Unavailable);
    let (status, body) = send(client().post(&url).json(&chat("x"))).await;
    assert_eq!(status, 503);
    assert_openai_error(&body, "server_error");
    assert!(body["error"]["message"]
        .as_str()
        .unwrap()
        .contains("not running"));

    server.fake.set(Behaviour::Reply);
    let mut request = chat("x");
    request["model"] = json!("gpt-4o");
    let (status, body) = send(client().post(&url).json(&request)).await;
    assert_eq!(status, 404);
    assert_eq!(body["error"]["code"], "model_not_found");
}

#[tokio::test]
async fn oversized_bodies_get_413() {
    let options = RouterOptions {
        max_body_bytes: 1024,
        ..RouterOptions::default()
    };
    let server = TestServer::start(Behaviour::Reply, options).await;
    let (status, body) = send(
        client()
            .post(server.url("/v1/chat/completions"))
            .json(&chat(&"x".repeat(4096))),
    )
    .await;
    assert_eq!(status, 413);
    assert_openai_error(&body, "invalid_request_error");
    let (status, _) = send(
        client()
            .post(server.url("/v1/chat/completions"))
            .json(&chat("x")),
    )
    .await;
    assert_eq!(status, 200);
}

#[tokio::test]
async fn api_key_guards_v1_but_not_health() {
    let options = RouterOptions {
        api_key: Some("s3cret".into()),
        ..RouterOptions::default()
    };
    let server = TestServer::start(Behaviour::Reply, options).await;
    let url = server.url("/v1/chat/completions");
    let (status, body) = send(client().post(&url).json(&chat("x"))).await;
    assert_eq!(status, 401);
    assert_eq!(body["error"]["code"], "invalid_api_key");
    let (status, _) = send(client().post(&url).bearer_auth("wrong").json(&chat("x"))).await;
    assert_eq!(status, 401);
    let (status, _) = send(client().get(server.url("/v1/models")).bearer_auth("s3cre")).await;
    assert_eq!(status, 401);
    let (status, _) = send(client().post(&url).bearer_auth("s3cret").json(&chat("x"))).await;
    assert_eq!(status, 200);
    let (status, _) = send(client().get(server.url("/v1/models")).bearer_auth("s3cret")).await;
    assert_eq!(status, 200);
    let (status, _) = send(client().get(server.url("/health"))).await;
    assert_eq!(status, 200);
}

#[tokio::test]
async fn models_list_and_retrieve() {
    let server = TestServer::start(Behaviour::Reply, RouterOptions::default()).await;
    let (status, body) = send(client().get(server.url("/v1/models"))).await;
    assert_eq!(status, 200);
    assert_eq!(body["object"], "list");
    let model = &body["data"][0];
    assert_eq!(model["id"], MODEL);
    assert_eq!(model["object"], "model");
    assert_eq!(model["owned_by"], "sparkd");
    assert!(model["created"].is_u64());
    assert_eq!(model["context_length"], 2048);
    let (status, body) = send(client().get(server.url(&format!("/v1/models/{MODEL}")))).await;
    assert_eq!((status, &body["id"]), (200, &json!(MODEL)));
    let (status, body) = send(client().get(server.url("/v1/models/nope"))).await;
    assert_eq!(status, 404);
    assert_eq!(body["error"]["code"], "model_not_found");
}

#[tokio::test]
async fn health_follows_the_daemon() {
    let server = TestServer::start(Behaviour::Reply, RouterOptions::default()).await;
    let (status, body) = send(client().get(server.url("/health"))).await;
    assert_eq!(status, 200);
    assert_eq!(body["status"], "ok");
    assert_eq!(body["model"], MODEL);
    server.fake.set(Behaviour::Unavailable);
    let (status, body) = send(client().get(server.url("/health"))).await;
    assert_eq!(status, 503);
    assert_eq!(body["status"], "unavailable");
    assert!(body["error"].as_str().unwrap().contains("not running"));
}

#[tokio::test]
async fn status_and_jobs_pass_the_daemon_json_through() {
    let server = TestServer::start(Behaviour::Reply, RouterOptions::default()).await;
    let (status, body) = send(client().get(server.url("/v1/status"))).await;
    assert_eq!(status, 200);
    assert_eq!(body["running"], 3);
    assert_eq!(body["queued"], 4);
    assert_eq!(body["model"]["name"], MODEL);
    assert_eq!(body["prefix_cache"]["enabled"], true);
    assert_eq!(body["prefix_cache"]["cached_blocks"], 10);
    assert_eq!(body["prefix_cache"]["prompt_tokens_reused"], 13);
    assert_eq!(body["chat_format"]["tools"], "mistral-args");
    assert_eq!(body["chat_format"]["think_open"], "[THINK]");
    assert_eq!(
        body["chat_format"]["variables"],
        serde_json::json!(["enable_thinking", "reasoning_effort"])
    );
    let (status, body) = send(client().get(server.url("/v1/jobs?limit=2"))).await;
    assert_eq!(status, 200);
    assert_eq!(body["object"], "list");
    let jobs = body["data"].as_array().unwrap();
    assert_eq!(jobs.len(), 2);
    assert_eq!(jobs[0]["job"], 1, "newest first");
    assert_eq!(jobs[0]["usage"]["completion_tokens"], 5);
    assert!(jobs[0]["timings"]["ttft_ms"].is_f64());
    assert_eq!(jobs[0]["finish_reason"], "Stop");
    assert_eq!(jobs[0]["cached_tokens"], cached_tokens(3));
    let (status, body) = send(client().get(server.url("/v1/jobs?limit=lots"))).await;
    assert_eq!(status, 400);
    assert_eq!(body["error"]["param"], "limit");
    server.fake.set(Behaviour::Unavailable);
    let (status, _) = send(client().get(server.url("/v1/status"))).await;
    assert_eq!(status, 503);
}

#[tokio::test]
async fn unknown_routes_and_methods_get_openai_errors() {
    let server = TestServer::start(Behaviour::Reply, RouterOptions::default()).await;
    let (status, body) = send(client().get(server.url("/v1/engines"))).await;
    assert_eq!(status, 404);
    assert_openai_error(&body, "invalid_request_error");
    let (status, body) = send(client().get(server.url("/v1/chat/completions"))).await;
    assert_eq!(status, 405);
    assert_openai_error(&body, "invalid_request_error");
}

fn metric(text: &str, series: &str) -> f64 {
    text.lines()
        .find_map(|l| {
            l.strip_prefix(series)
                .and_then(|rest| rest.trim().parse().ok())
        })
        .unwrap_or_else(|| panic!("{series} missing in:\n{text}"))
}

#[tokio::test]
async fn metrics_count_requests_tokens_and_errors() {
    let server = TestServer::start(Behaviour::Reply, RouterOptions::default()).await;
    let url = server.url("/v1/chat/completions");
    for _ in 0..2 {
        send(client().post(&url).json(&chat("abc"))).await;
    }
    send(client().post(&url).body("{")).await;
    server.fake.set(Behaviour::Busy);
    send(client().post(&url).json(&chat("x"))).await;
    server.fake.set(Behaviour::Reply);

    let response = client().get(server.url("/metrics")).send().await.unwrap();
    assert_eq!(response.status(), 200);
    assert!(response.headers()["content-type"]
        .to_str()
        .unwrap()
        .starts_with("text/plain"));
    let text = response.text().await.unwrap();
    let requests = "sparkd_openai_requests_total{endpoint=\"/v1/chat/completions\",status=";
    assert_eq!(metric(&text, &format!("{requests}\"200\"}}")), 2.0);
    assert_eq!(metric(&text, &format!("{requests}\"400\"}}")), 1.0);
    assert_eq!(metric(&text, &format!("{requests}\"429\"}}")), 1.0);
    assert_eq!(
        metric(&text, "sparkd_openai_errors_total{kind=\"bad_json\"}"),
        1.0
    );
    assert_eq!(
        metric(&text, "sparkd_openai_errors_total{kind=\"busy\"}"),
        1.0
    );
    assert_eq!(metric(&text, "sparkd_openai_prompt_tokens_total"), 6.0);
    // The fake "took half of each prompt from its cache".
    assert_eq!(
        metric(&text, "sparkd_openai_prompt_tokens_cached_total"),
        2.0
    );
    assert_eq!(metric(&text, "sparkd_openai_completion_tokens_total"), 10.0);
    assert_eq!(metric(&text, "sparkd_openai_ttft_seconds_count"), 2.0);
    assert_eq!(
        metric(&text, "sparkd_openai_decode_tokens_per_second_count"),
        2.0
    );
    assert_eq!(metric(&text, "sparkd_up"), 1.0);
    assert_eq!(metric(&text, "sparkd_running_requests"), 3.0);
    assert_eq!(metric(&text, "sparkd_queued_requests"), 4.0);
    assert_eq!(metric(&text, "sparkd_prompt_tokens_total"), 9.0);
    assert_eq!(metric(&text, "sparkd_generated_tokens_total"), 8.0);
    assert_eq!(metric(&text, "sparkd_prefix_cache_blocks"), 10.0);
    assert_eq!(metric(&text, "sparkd_prefix_cache_idle_blocks"), 11.0);
    assert_eq!(
        metric(&text, "sparkd_prefix_cache_evicted_blocks_total"),
        12.0
    );
    assert_eq!(metric(&text, "sparkd_prompt_tokens_reused_total"), 13.0);
}

/// Serves the fake daemon for the Python SDK test (`tests/openai_sdk/run.sh`):
/// `SPARK_OPENAI_FAKE_ADDR=127.0.0.1:8099 cargo test -p spark-client --lib serve_fake_backend -- --ignored --nocapture`
#[tokio::test]
#[ignore = "serves forever; run by hand"]
async fn serve_fake_backend() {
    let addr = std::env::var("SPARK_OPENAI_FAKE_ADDR").unwrap_or_else(|_| "127.0.0.1:8099".into());
    let server = TestServer::start_on(
        addr.parse().expect("address"),
        Behaviour::Reply,
        RouterOptions::default(),
    )
    .await;
    eprintln!("fake OpenAI shim on {}", server.base);
    server.task.await.expect("server");
}
