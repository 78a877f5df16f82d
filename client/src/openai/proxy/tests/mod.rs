//! The proxy through real HTTP: a scripted upstream on 127.0.0.1 answering with
//! captured llama-server and Ollama bytes, the real router, a fake daemon.

mod harness;

use std::sync::atomic::Ordering;
use std::time::Duration;

use futures::StreamExt;
use serde_json::{json, Value};

use harness::{
    chat_body, http, FakeUpstream, Shim, LLAMA_EMBEDDINGS, LLAMA_ERROR, LLAMA_JSON,
    LLAMA_STREAM_USAGE, OLLAMA_CHAT_STREAM, SPARKD_MODEL, UPSTREAM_MODEL,
};

use super::upstream::MISS_REFRESH_AFTER;
use crate::protocol::{CountSource, DecodeClock, FinishReason};

#[tokio::test]
async fn a_stream_is_forwarded_byte_for_byte_and_recorded_with_the_engines_counts() {
    let upstream = FakeUpstream::start().await;
    upstream.state.chunk_delay_ms.store(5, Ordering::SeqCst);
    let shim = Shim::start(&upstream.url, None).await;
    let body = chat_body(UPSTREAM_MODEL, true);
    let response = http()
        .post(shim.url("/v1/chat/completions"))
        .header("content-type", "application/json")
        .header("x-trace", "t1")
        .body(body.clone())
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), 200);
    assert_eq!(
        response.headers()["content-type"].to_str().unwrap(),
        "text/event-stream"
    );
    let got = response.bytes().await.unwrap();
    assert_eq!(
        &got[..],
        LLAMA_STREAM_USAGE,
        "the stream is the engine's, unchanged"
    );

    let (headers, sent) = upstream.state.last.lock().unwrap().clone().unwrap();
    assert_eq!(sent, body.as_bytes(), "the request body is not changed");
    assert_eq!(headers["x-trace"], "t1");

    let jobs = shim.daemon.wait_recorded(1).await;
    let job = &jobs[0];
    assert_eq!(
        (job.engine.as_str(), job.model.as_str()),
        ("llama", UPSTREAM_MODEL)
    );
    assert_eq!(job.upstream, upstream.url);
    assert_eq!(
        (job.usage.prompt_tokens, job.usage.completion_tokens),
        (33, 12)
    );
    assert_eq!(
        (job.counts, job.decode_clock, job.finish_reason),
        (
            CountSource::Reported,
            DecodeClock::Stream,
            FinishReason::Length
        )
    );
    // The first chunk came after one pause, the rest after many more.
    let ttft = job.timings.ttft_ms.unwrap();
    assert!(ttft >= 4.0, "ttft {ttft}");
    assert!(job.timings.decode_ms > ttft, "{:?}", job.timings);
    assert!(job.timings.decode_tps.unwrap() > 0.0);
    assert_eq!(shim.daemon.generations.load(Ordering::SeqCst), 0);

    // And /metrics counts it under its engine.
    let metrics = shim
        .metrics_once("sparkd_openai_forwarded_requests_total")
        .await;
    for (series, value) in [
        (
            "sparkd_openai_forwarded_requests_total{engine=\"llama\"}",
            1,
        ),
        (
            "sparkd_openai_forwarded_prompt_tokens_total{engine=\"llama\"}",
            33,
        ),
        (
            "sparkd_openai_forwarded_completion_tokens_total{engine=\"llama\"}",
            12,
        ),
        (
            "sparkd_openai_forwarded_ttft_seconds_count{engine=\"llama\"}",
            1,
        ),
        (
            "sparkd_openai_forwarded_decode_tokens_per_second_count{engine=\"llama\"}",
            1,
        ),
    ] {
        let line = format!("{series} {value}");
        assert!(
            metrics.lines().any(|l| l == line),
            "no {line:?} in\n{metrics}"
        );
    }
}

#[tokio::test]
async fn other_models_go_to_sparkd_and_a_non_streaming_reply_is_a_lower_bound() {
    let upstream = FakeUpstream::start().await;
    let shim = Shim::start(&upstream.url, None).await;
    let answer: Value = shim
        .post_chat(SPARKD_MODEL, false)
        .await
        .json()
        .await
        .unwrap();
    assert_eq!(answer["choices"][0]["message"]["content"], "from sparkd");
    assert_eq!(shim.daemon.generations.load(Ordering::SeqCst), 1);
    assert!(upstream.state.last.lock().unwrap().is_none());

    let got = shim
        .post_chat(UPSTREAM_MODEL, false)
        .await
        .bytes()
        .await
        .unwrap();
    assert_eq!(&got[..], LLAMA_JSON);
    let job = shim.daemon.wait_recorded(1).await.remove(0);
    assert_eq!(
        (job.counts, job.decode_clock, job.timings.ttft_ms),
        (CountSource::Reported, DecodeClock::Request, None)
    );
    assert_eq!(job.usage.completion_tokens, 12);
    // The sized body ended normally, whether or not hyper polled past its last byte.
    assert_eq!(job.finish_reason, FinishReason::Length);
    // A whole request's rate is a lower bound: /metrics keeps it out of the histogram.
    let metrics = shim
        .metrics_once("sparkd_openai_forwarded_requests_total")
        .await;
    for line in [
        "sparkd_openai_forwarded_requests_total{engine=\"llama\"} 1",
        "sparkd_openai_forwarded_ttft_seconds_count{engine=\"llama\"} 0",
        "sparkd_openai_forwarded_decode_tokens_per_second_count{engine=\"llama\"} 0",
    ] {
        assert!(
            metrics.lines().any(|l| l == line),
            "no {line:?} in\n{metrics}"
        );
    }
}

#[tokio::test]
async fn ollama_native_chat_is_forwarded_and_uses_its_eval_duration() {
    let upstream = FakeUpstream::start().await;
    let shim = Shim::start(&upstream.url, None).await;
    let response = http()
        .post(shim.url("/api/chat"))
        .body(
            json!({"model": UPSTREAM_MODEL, "messages": [{"role": "user", "content": "Why?"}]})
                .to_string(),
        )
        .send()
        .await
        .unwrap();
    assert_eq!(
        response.headers()["content-type"].to_str().unwrap(),
        "application/x-ndjson"
    );
    assert_eq!(&response.bytes().await.unwrap()[..], OLLAMA_CHAT_STREAM);
    let job = shim.daemon.wait_recorded(1).await.remove(0);
    assert_eq!(
        (job.usage.prompt_tokens, job.usage.completion_tokens),
        (26, 9)
    );
    assert_eq!(job.decode_clock, DecodeClock::Engine);
    assert_eq!(job.timings.decode_ms, 1371.003);

    // No upstream serves this one, and sparkd does not speak Ollama's API.
    let unknown = http()
        .post(shim.url("/api/chat"))
        .body(json!({"model": "nobody-has-it"}).to_string())
        .send()
        .await
        .unwrap();
    assert_eq!(unknown.status(), 404);
    let error: Value = unknown.json().await.unwrap();
    assert_eq!(error["error"]["code"], "model_not_found");
}

#[tokio::test]
async fn embeddings_record_prompt_tokens() {
    let upstream = FakeUpstream::start().await;
    let shim = Shim::start(&upstream.url, None).await;
    let got = http()
        .post(shim.url("/v1/embeddings"))
        .body(json!({"model": UPSTREAM_MODEL, "input": "hello world"}).to_string())
        .send()
        .await
        .unwrap()
        .bytes()
        .await
        .unwrap();
    assert_eq!(&got[..], LLAMA_EMBEDDINGS);
    let job = shim.daemon.wait_recorded(1).await.remove(0);
    assert_eq!(
        (job.usage.prompt_tokens, job.usage.completion_tokens),
        (2, 0)
    );
    assert_eq!(job.counts, CountSource::Reported);
}

#[tokio::test]
async fn upstream_errors_pass_through_and_are_recorded_as_errors() {
    let upstream = FakeUpstream::start().await;
    let shim = Shim::start(&upstream.url, None).await;
    let response = http()
        .post(shim.url("/v1/chat/completions"))
        .body(json!({"model": UPSTREAM_MODEL, "messages": "oops"}).to_string())
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), 400);
    assert_eq!(&response.bytes().await.unwrap()[..], LLAMA_ERROR);
    let job = shim.daemon.wait_recorded(1).await.remove(0);
    assert_eq!(
        (job.finish_reason, job.http_status),
        (FinishReason::Error, 400)
    );
    assert_eq!(job.usage.completion_tokens, 0);

    // The upstream goes away: 502, and the job says so.
    let url = upstream.url.clone();
    drop(upstream);
    tokio::time::sleep(Duration::from_millis(50)).await;
    let response = shim.post_chat(UPSTREAM_MODEL, true).await;
    assert_eq!(response.status(), 502, "{url}");
    let error: Value = response.json().await.unwrap();
    assert_eq!(error["error"]["code"], "upstream_unavailable");
    let job = shim.daemon.wait_recorded(2).await.remove(1);
    assert_eq!(
        (job.finish_reason, job.http_status),
        (FinishReason::Error, 0)
    );
}

#[tokio::test]
async fn a_client_leaving_mid_stream_is_recorded_as_disconnected() {
    let upstream = FakeUpstream::start().await;
    upstream.state.chunk_delay_ms.store(200, Ordering::SeqCst);
    let shim = Shim::start(&upstream.url, None).await;
    let response = shim.post_chat(UPSTREAM_MODEL, true).await;
    let mut body = response.bytes_stream();
    let first = body.next().await.unwrap().unwrap();
    assert!(LLAMA_STREAM_USAGE.starts_with(&first));
    drop(body);
    let job = shim.daemon.wait_recorded(1).await.remove(0);
    assert_eq!(job.finish_reason, FinishReason::Disconnected);
    assert_eq!(job.counts, CountSource::Estimated);
}

#[tokio::test]
async fn shutdown_ends_forwarded_streams() {
    let upstream = FakeUpstream::start().await;
    upstream.state.chunk_delay_ms.store(200, Ordering::SeqCst);
    let shim = Shim::start(&upstream.url, None).await;
    let response = shim.post_chat(UPSTREAM_MODEL, true).await;
    let mut body = response.bytes_stream();
    body.next().await.unwrap().unwrap();
    shim.shutdown.cancel();
    let rest = tokio::time::timeout(Duration::from_secs(2), async {
        let mut n = 0;
        while let Some(Ok(chunk)) = body.next().await {
            n += chunk.len();
        }
        n
    })
    .await
    .expect("the stream ends at shutdown, not with the engine");
    assert!(rest < LLAMA_STREAM_USAGE.len());
    let job = shim.daemon.wait_recorded(1).await.remove(0);
    assert_eq!(job.finish_reason, FinishReason::Shutdown);
}

#[tokio::test]
async fn the_api_key_guards_forwarded_routes_and_stays_here() {
    let upstream = FakeUpstream::start().await;
    let shim = Shim::start(&upstream.url, Some("k3y")).await;
    let refused = http()
        .post(shim.url("/api/chat"))
        .body(json!({"model": UPSTREAM_MODEL}).to_string())
        .send()
        .await
        .unwrap();
    assert_eq!(refused.status(), 401);
    assert!(upstream.state.last.lock().unwrap().is_none());

    let ok = http()
        .post(shim.url("/v1/chat/completions"))
        .bearer_auth("k3y")
        .body(chat_body(UPSTREAM_MODEL, false))
        .send()
        .await
        .unwrap();
    assert_eq!(ok.status(), 200);
    let (headers, _) = upstream.state.last.lock().unwrap().clone().unwrap();
    assert!(
        headers.get("authorization").is_none(),
        "our key went upstream"
    );
}

#[tokio::test]
async fn models_and_jobs_lists_include_the_upstreams_even_without_the_daemon() {
    let upstream = FakeUpstream::start().await;
    let shim = Shim::start(&upstream.url, None).await;
    let models: Value = http()
        .get(shim.url("/v1/models"))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    let ids: Vec<(&str, &str)> = models["data"]
        .as_array()
        .unwrap()
        .iter()
        .map(|m| (m["id"].as_str().unwrap(), m["owned_by"].as_str().unwrap()))
        .collect();
    assert_eq!(ids, [(SPARKD_MODEL, "sparkd"), (UPSTREAM_MODEL, "llama")]);

    let forward = || async {
        shim.post_chat(UPSTREAM_MODEL, true)
            .await
            .bytes()
            .await
            .unwrap()
    };
    forward().await;
    shim.daemon.wait_recorded(1).await;
    let jobs: Value = http()
        .get(shim.url("/v1/jobs"))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    let first = &jobs["data"][0];
    assert_eq!(
        (first["engine"].as_str(), first["job"].as_u64()),
        (Some("llama"), Some(100))
    );
    assert_eq!(first["upstream"], upstream.url.as_str());
    assert_eq!(first["decode_clock"], "Stream");
    assert_eq!(first["recorded_by_daemon"], true);

    // The daemon goes down: forwarding goes on and the proxy remembers the job.
    shim.daemon.down.store(true, Ordering::SeqCst);
    forward().await;
    let mut listed = Value::Null;
    for _ in 0..200 {
        listed = http()
            .get(shim.url("/v1/jobs?limit=10"))
            .send()
            .await
            .unwrap()
            .json()
            .await
            .unwrap();
        if listed["data"].as_array().unwrap().len() == 2 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let data = listed["data"].as_array().unwrap();
    assert_eq!(data.len(), 2, "{listed}");
    assert_eq!(data[0]["recorded_by_daemon"], false);
    assert_eq!(data[0]["usage"]["completion_tokens"], 12);
    let models: Value = http()
        .get(shim.url("/v1/models"))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(models["data"][0]["id"], UPSTREAM_MODEL);
}

#[tokio::test]
async fn a_model_new_upstream_is_found_by_rereading_its_list_on_a_miss() {
    let upstream = FakeUpstream::start().await;
    let shim = Shim::start(&upstream.url, None).await;
    upstream
        .state
        .models
        .lock()
        .unwrap()
        .push("loaded-later".into());
    let lists = upstream.state.model_lists.load(Ordering::SeqCst);
    // A miss within the re-read interval goes to sparkd without asking.
    let early = shim.post_chat("loaded-later", false).await;
    assert_eq!(early.status(), 200);
    assert_eq!(shim.daemon.generations.load(Ordering::SeqCst), 1);
    assert_eq!(upstream.state.model_lists.load(Ordering::SeqCst), lists);

    tokio::time::sleep(MISS_REFRESH_AFTER + Duration::from_millis(100)).await;
    // sparkd's own model never waits for the upstreams' lists.
    let own = shim.post_chat(SPARKD_MODEL, false).await;
    assert_eq!(own.status(), 200);
    assert_eq!(upstream.state.model_lists.load(Ordering::SeqCst), lists);
    assert_eq!(shim.daemon.generations.load(Ordering::SeqCst), 2);

    let later = shim.post_chat("loaded-later", false).await;
    assert_eq!(&later.bytes().await.unwrap()[..], LLAMA_JSON);
    assert_eq!(upstream.state.model_lists.load(Ordering::SeqCst), lists + 1);
    assert_eq!(shim.daemon.generations.load(Ordering::SeqCst), 2);
    let job = shim.daemon.wait_recorded(1).await.remove(0);
    assert_eq!(job.model, "loaded-later");
}
