//! Chat and text completions over HTTP: bodies, streams, usage, logprobs, cancellation.

use std::sync::atomic::Ordering;
use std::time::Duration;

use futures::StreamExt;
use serde_json::{json, Value};

use super::fake::{
    cached_tokens, prompt_tokens, timings_for, Behaviour, TestServer, MODEL, PIECES, REASONING,
    SPLIT_TEXT,
};
use super::{client, sse_chunks, sse_data};
use crate::openai::RouterOptions;
use crate::protocol::PromptInput;

fn full_text() -> String {
    PIECES.concat()
}

async fn post(server: &TestServer, path: &str, body: Value) -> (u16, String) {
    let response = client()
        .post(server.url(path))
        .json(&body)
        .send()
        .await
        .expect("send");
    let status = response.status().as_u16();
    (status, response.text().await.expect("body"))
}

fn chat_body(content: &str) -> Value {
    json!({"model": MODEL, "messages": [{"role": "user", "content": content}]})
}

/// Posts a streamed one-message chat of `content`.
async fn post_chat_stream(server: &TestServer, content: &str) -> reqwest::Response {
    let mut body = chat_body(content);
    body["stream"] = json!(true);
    client()
        .post(server.url("/v1/chat/completions"))
        .json(&body)
        .send()
        .await
        .unwrap()
}

/// The usage object the fake's timings imply for a prompt of `content`.
fn assert_usage_matches(usage: &Value, content: &str, completion: u32) {
    let prompt = prompt_tokens(&PromptInput::Raw {
        text: content.into(),
        special: true,
    });
    let t = timings_for(prompt, completion);
    assert_eq!(usage["prompt_tokens"], prompt, "{usage}");
    assert_eq!(usage["completion_tokens"], completion, "{usage}");
    assert_eq!(usage["total_tokens"], prompt + completion, "{usage}");
    assert_eq!(
        usage["prompt_tokens_details"]["cached_tokens"],
        cached_tokens(prompt),
        "{usage}"
    );
    assert_eq!(usage["ttft_ms"].as_f64(), t.ttft_ms, "{usage}");
    assert_eq!(usage["decode_tps"].as_f64(), t.decode_tps, "{usage}");
    assert_eq!(usage["prefill_tps"].as_f64(), t.prefill_tps, "{usage}");
    assert_eq!(usage["queue_ms"].as_f64(), Some(t.queue_ms), "{usage}");
    assert_eq!(usage["prefill_ms"].as_f64(), Some(t.prefill_ms), "{usage}");
    assert_eq!(usage["decode_ms"].as_f64(), Some(t.decode_ms), "{usage}");
    assert_eq!(
        usage["generation_ms"].as_f64(),
        Some(t.generation_ms),
        "{usage}"
    );
}

#[tokio::test]
async fn chat_completion_has_openai_shape_and_timed_usage() {
    let server = TestServer::start(Behaviour::Reply, RouterOptions::default()).await;
    let (status, body) = post(&server, "/v1/chat/completions", chat_body("hi there")).await;
    assert_eq!(status, 200, "{body}");
    let v: Value = serde_json::from_str(&body).unwrap();
    assert!(v["id"].as_str().unwrap().starts_with("chatcmpl-"));
    assert_eq!(v["object"], "chat.completion");
    assert_eq!(v["model"], MODEL);
    assert!(v["created"].as_u64().unwrap() > 1_600_000_000);
    let choice = &v["choices"][0];
    assert_eq!(choice["index"], 0);
    assert_eq!(choice["message"]["role"], "assistant");
    assert_eq!(choice["message"]["content"], full_text());
    assert_eq!(choice["finish_reason"], "stop");
    assert!(choice["logprobs"].is_null());
    assert_usage_matches(&v["usage"], "hi there", PIECES.len() as u32);
}

#[tokio::test]
async fn length_limit_reports_length() {
    let server = TestServer::start(Behaviour::Reply, RouterOptions::default()).await;
    let mut body = chat_body("x");
    body["max_tokens"] = json!(2);
    let (status, body) = post(&server, "/v1/chat/completions", body).await;
    assert_eq!(status, 200, "{body}");
    let v: Value = serde_json::from_str(&body).unwrap();
    assert_eq!(v["choices"][0]["finish_reason"], "length");
    assert_eq!(v["choices"][0]["message"]["content"], PIECES[..2].concat());
    assert_eq!(server.fake.last_request().max_tokens, Some(2));
}

#[tokio::test]
async fn missing_model_means_the_loaded_one() {
    let server = TestServer::start(Behaviour::Reply, RouterOptions::default()).await;
    let body = json!({"messages": [{"role": "user", "content": "x"}]});
    let (status, body) = post(&server, "/v1/chat/completions", body).await;
    assert_eq!(status, 200, "{body}");
    let v: Value = serde_json::from_str(&body).unwrap();
    assert_eq!(v["model"], MODEL);
    assert_eq!(server.fake.last_request().model, None);
}

#[tokio::test]
async fn chat_stream_without_include_usage_has_no_usage() {
    let server = TestServer::start(Behaviour::Reply, RouterOptions::default()).await;
    let response = post_chat_stream(&server, "x").await;
    assert_eq!(response.status(), 200);
    let content_type = response.headers()["content-type"]
        .to_str()
        .unwrap()
        .to_string();
    // With the charset, tools that read bodies do not guess windows-1252.
    assert_eq!(content_type, "text/event-stream; charset=utf-8");
    let chunks = sse_chunks(&response.text().await.unwrap());

    let id = chunks[0]["id"].as_str().unwrap();
    assert!(id.starts_with("chatcmpl-"));
    for chunk in &chunks {
        assert_eq!(chunk["object"], "chat.completion.chunk");
        assert_eq!(chunk["id"], id, "one id per stream");
        assert_eq!(chunk["model"], MODEL);
        assert!(
            chunk.get("usage").is_none(),
            "no usage field without include_usage: {chunk}"
        );
    }
    assert_eq!(chunks[0]["choices"][0]["delta"]["role"], "assistant");
    let text: String = chunks
        .iter()
        .filter_map(|c| c["choices"][0]["delta"]["content"].as_str())
        .collect();
    assert_eq!(text, full_text());
    // The empty piece is not sent as its own chunk: role + 4 non-empty pieces + finish.
    assert_eq!(
        chunks.len(),
        1 + PIECES.iter().filter(|p| !p.is_empty()).count() + 1
    );
    let last = chunks.last().unwrap();
    assert_eq!(last["choices"][0]["finish_reason"], "stop");
    assert_eq!(last["choices"][0]["delta"], json!({}));
    assert!(chunks[..chunks.len() - 1]
        .iter()
        .all(|c| c["choices"][0]["finish_reason"].is_null()));
}

#[tokio::test]
async fn chat_stream_with_include_usage_ends_with_a_usage_chunk() {
    let server = TestServer::start(Behaviour::Reply, RouterOptions::default()).await;
    let mut body = chat_body("how are you");
    body["stream"] = json!(true);
    body["stream_options"] = json!({"include_usage": true});
    let (status, text) = post(&server, "/v1/chat/completions", body).await;
    assert_eq!(status, 200);
    let chunks = sse_chunks(&text);
    let (usage_chunk, rest) = chunks.split_last().unwrap();
    assert_eq!(usage_chunk["choices"], json!([]));
    assert_usage_matches(&usage_chunk["usage"], "how are you", PIECES.len() as u32);
    for chunk in rest {
        assert!(
            chunk["usage"].is_null() && chunk.get("usage").is_some(),
            "{chunk}"
        );
    }
    assert_eq!(rest.last().unwrap()["choices"][0]["finish_reason"], "stop");
}

#[tokio::test]
async fn concurrent_requests_each_get_their_own_timings() {
    let server = TestServer::start(Behaviour::Reply, RouterOptions::default()).await;
    let prompts = ["a", "bbbbbbbb", "cccccccccccccccccccc", "dddd"];
    let runs = prompts.iter().map(|p| {
        let mut body = chat_body(p);
        body["stream"] = json!(true);
        body["stream_options"] = json!({"include_usage": true});
        let server = &server;
        async move { (p, post(server, "/v1/chat/completions", body).await.1) }
    });
    for (prompt, text) in futures::future::join_all(runs).await {
        let chunks = sse_chunks(&text);
        assert_usage_matches(
            &chunks.last().unwrap()["usage"],
            prompt,
            PIECES.len() as u32,
        );
    }
}

#[tokio::test]
async fn text_completion_non_streaming_and_streaming() {
    let server = TestServer::start(Behaviour::Reply, RouterOptions::default()).await;
    let body = json!({"model": MODEL, "prompt": "Once upon"});
    let (status, text) = post(&server, "/v1/completions", body.clone()).await;
    assert_eq!(status, 200, "{text}");
    let v: Value = serde_json::from_str(&text).unwrap();
    assert!(v["id"].as_str().unwrap().starts_with("cmpl-"));
    assert_eq!(v["object"], "text_completion");
    assert_eq!(v["choices"][0]["text"], full_text());
    assert_eq!(v["choices"][0]["finish_reason"], "stop");
    assert!(v["choices"][0]["logprobs"].is_null());
    assert_usage_matches(&v["usage"], "Once upon", PIECES.len() as u32);
    assert_eq!(
        server.fake.last_request().input,
        PromptInput::Raw {
            text: "Once upon".into(),
            special: true
        }
    );

    let mut streaming = body;
    streaming["stream"] = json!(true);
    streaming["stream_options"] = json!({"include_usage": true});
    let (status, text) = post(&server, "/v1/completions", streaming).await;
    assert_eq!(status, 200);
    let chunks = sse_chunks(&text);
    let (usage_chunk, rest) = chunks.split_last().unwrap();
    assert!(rest.iter().all(|c| c["object"] == "text_completion"));
    let streamed: String = rest
        .iter()
        .filter_map(|c| c["choices"][0]["text"].as_str())
        .collect();
    assert_eq!(streamed, full_text());
    assert_eq!(rest.last().unwrap()["choices"][0]["finish_reason"], "stop");
    assert_eq!(usage_chunk["choices"], json!([]));
    assert_usage_matches(&usage_chunk["usage"], "Once upon", PIECES.len() as u32);
}

#[tokio::test]
async fn chat_logprobs_have_openai_shape() {
    let server = TestServer::start(Behaviour::Reply, RouterOptions::default()).await;
    let mut body = chat_body("x");
    body["logprobs"] = json!(true);
    body["top_logprobs"] = json!(2);
    let (status, text) = post(&server, "/v1/chat/completions", body.clone()).await;
    assert_eq!(status, 200, "{text}");
    let v: Value = serde_json::from_str(&text).unwrap();
    let content = v["choices"][0]["logprobs"]["content"].as_array().unwrap();
    assert_eq!(content.len(), PIECES.len());
    assert_eq!(content[0]["token"], PIECES[0]);
    assert_eq!(content[0]["logprob"], -0.25);
    assert_eq!(content[0]["bytes"], json!(PIECES[0].as_bytes()));
    let top = content[0]["top_logprobs"].as_array().unwrap();
    assert_eq!(top.len(), 2);
    assert_eq!(top[1]["token"], "alt1");
    assert_eq!(top[1]["logprob"], -1.25);
    assert_eq!(top[1]["bytes"], json!(b"alt1"));
    assert_eq!(server.fake.last_request().logprobs, Some(2));

    body["stream"] = json!(true);
    let (_, text) = post(&server, "/v1/chat/completions", body).await;
    let chunks = sse_chunks(&text);
    let streamed: Vec<&Value> = chunks
        .iter()
        .filter_map(|c| c["choices"][0]["logprobs"]["content"].as_array())
        .flatten()
        .collect();
    // With logprobs every token is reported, even the one with no text yet.
    assert_eq!(streamed.len(), PIECES.len());
    assert_eq!(streamed[1]["token"], PIECES[1]);
    assert_eq!(streamed[1]["top_logprobs"][0]["token"], "alt0");
}

/// A character written over two tokens: each token's `bytes` are its own (put end to
/// end they are the text), and a token that is not whole UTF-8 shows as OpenAI shows
/// it, `bytes:\xNN...`, in chat, streamed or not, and in completions, whose
/// `top_logprobs` keys then stay apart.
#[tokio::test]
async fn logprobs_carry_each_tokens_own_bytes() {
    let server = TestServer::start(Behaviour::SplitCharacter, RouterOptions::default()).await;
    let mut body = chat_body("x");
    body["logprobs"] = json!(true);
    body["top_logprobs"] = json!(1);
    let (status, text) = post(&server, "/v1/chat/completions", body.clone()).await;
    assert_eq!(status, 200, "{text}");
    let v: Value = serde_json::from_str(&text).unwrap();
    assert_eq!(v["choices"][0]["message"]["content"], SPLIT_TEXT);
    let expected = json!([
        {"token": "Hi ", "logprob": -0.5, "bytes": [72, 105, 32],
         "top_logprobs": [{"token": "bytes:\\xf0\\x9f\\x98", "logprob": -1.0, "bytes": [240, 159, 152]}]},
        {"token": "bytes:\\xf0\\x9f", "logprob": -0.5, "bytes": [240, 159],
         "top_logprobs": [{"token": "bytes:\\xf0\\x9f\\x99", "logprob": -2.0, "bytes": [240, 159, 153]}]},
        {"token": "bytes:\\x98\\x8a", "logprob": -0.5, "bytes": [152, 138],
         "top_logprobs": [{"token": "bytes:\\xf0\\x9f\\x99", "logprob": -3.0, "bytes": [240, 159, 153]}]},
    ]);
    assert_eq!(v["choices"][0]["logprobs"]["content"], expected);
    let joined: Vec<u8> = expected
        .as_array()
        .unwrap()
        .iter()
        .flat_map(|t| t["bytes"].as_array().unwrap().clone())
        .map(|b| b.as_u64().unwrap() as u8)
        .collect();
    assert_eq!(joined, SPLIT_TEXT.as_bytes());

    body["stream"] = json!(true);
    let (_, text) = post(&server, "/v1/chat/completions", body).await;
    let streamed: Vec<Value> = sse_chunks(&text)
        .iter()
        .filter_map(|c| c["choices"][0]["logprobs"]["content"].as_array())
        .flatten()
        .cloned()
        .collect();
    assert_eq!(Value::Array(streamed), expected);

    let body = json!({"prompt": "x", "logprobs": 1});
    let (status, text) = post(&server, "/v1/completions", body).await;
    assert_eq!(status, 200, "{text}");
    let v: Value = serde_json::from_str(&text).unwrap();
    let lp = &v["choices"][0]["logprobs"];
    assert_eq!(
        lp["tokens"],
        json!(["Hi ", "bytes:\\xf0\\x9f", "bytes:\\x98\\x8a"])
    );
    assert_eq!(
        lp["top_logprobs"][2],
        json!({"bytes:\\xf0\\x9f\\x99": -3.0})
    );
    assert_eq!(lp["text_offset"], json!([0, 3, 3]));
}

#[tokio::test]
async fn completion_logprobs_are_parallel_arrays() {
    let server = TestServer::start(Behaviour::Reply, RouterOptions::default()).await;
    let body = json!({"prompt": "x", "logprobs": 1});
    let (status, text) = post(&server, "/v1/completions", body).await;
    assert_eq!(status, 200, "{text}");
    let v: Value = serde_json::from_str(&text).unwrap();
    let lp = &v["choices"][0]["logprobs"];
    assert_eq!(lp["tokens"], json!(PIECES));
    assert_eq!(lp["token_logprobs"][1], -0.5);
    assert_eq!(lp["top_logprobs"][1], json!({"alt0": -0.5}));
    let offsets: Vec<usize> = PIECES
        .iter()
        .scan(0, |at, p| Some(std::mem::replace(at, *at + p.len())))
        .collect();
    assert_eq!(lp["text_offset"], json!(offsets));
}

#[tokio::test]
async fn client_disconnect_mid_stream_cancels_the_generation() {
    let server = TestServer::start(Behaviour::Hang, RouterOptions::default()).await;
    let response = post_chat_stream(&server, "x").await;
    assert_eq!(response.status(), 200);
    let mut stream = response.bytes_stream();
    let mut seen = String::new();
    while !seen.contains(PIECES[0]) {
        let bytes = stream
            .next()
            .await
            .expect("stream ended early")
            .expect("read");
        seen.push_str(&String::from_utf8_lossy(&bytes));
    }
    assert_eq!(
        server.fake.cancelled.load(Ordering::SeqCst),
        0,
        "still running while read"
    );
    let notified = server.fake.cancelled_notify.notified();
    drop(stream);
    tokio::time::timeout(Duration::from_secs(5), notified)
        .await
        .expect("generation not dropped");
    assert_eq!(server.fake.cancelled.load(Ordering::SeqCst), 1);
}

#[tokio::test]
async fn client_disconnect_before_the_first_token_cancels_too() {
    let server = TestServer::start(Behaviour::HangBeforeFirstToken, RouterOptions::default()).await;
    for stream in [true, false] {
        let mut body = chat_body("x");
        body["stream"] = json!(stream);
        let notified = server.fake.cancelled_notify.notified();
        let request = client()
            .post(server.url("/v1/chat/completions"))
            .json(&body)
            .send();
        // The handler is waiting for the first event; the client gives up.
        let gave_up = tokio::time::timeout(Duration::from_millis(300), request).await;
        assert!(gave_up.is_err(), "no answer was expected yet");
        tokio::time::timeout(Duration::from_secs(5), notified)
            .await
            .unwrap_or_else(|_| panic!("generation not dropped (stream={stream})"));
    }
    assert_eq!(server.fake.cancelled.load(Ordering::SeqCst), 2);
}

#[tokio::test]
async fn shutdown_ends_open_streams() {
    let server = TestServer::start(Behaviour::Hang, RouterOptions::default()).await;
    let response = post_chat_stream(&server, "x").await;
    let mut stream = response.bytes_stream();
    let _first = stream.next().await;
    server.shutdown.cancel();
    tokio::time::timeout(Duration::from_secs(5), async {
        while let Some(Ok(_)) = stream.next().await {}
    })
    .await
    .expect("stream still open after shutdown");
    tokio::time::timeout(Duration::from_secs(5), server.task)
        .await
        .expect("server still running")
        .unwrap();
    assert_eq!(server.fake.cancelled.load(Ordering::SeqCst), 1);
}

#[tokio::test]
async fn engine_error_mid_stream_is_an_error_event() {
    let server = TestServer::start(Behaviour::EngineErrorMidStream, RouterOptions::default()).await;
    let mut body = chat_body("x");
    body["stream"] = json!(true);
    let (status, text) = post(&server, "/v1/chat/completions", body.clone()).await;
    assert_eq!(status, 200, "the stream had started");
    let data = sse_data(&text);
    let last: Value = serde_json::from_str(data.last().unwrap()).unwrap();
    assert_eq!(last["error"]["type"], "server_error");
    assert!(last["error"]["message"]
        .as_str()
        .unwrap()
        .contains("out of memory"));
    assert!(!data.iter().any(|d| d == "[DONE]"));

    body["stream"] = json!(false);
    let (status, text) = post(&server, "/v1/chat/completions", body).await;
    assert_eq!(status, 500);
    let v: Value = serde_json::from_str(&text).unwrap();
    assert!(v["error"]["message"]
        .as_str()
        .unwrap()
        .contains("out of memory"));
}

#[tokio::test]
async fn sampling_fields_reach_the_daemon() {
    let server = TestServer::start(Behaviour::Reply, RouterOptions::default()).await;
    let mut body = chat_body("x");
    for (k, v) in [
        ("temperature", json!(0.8)),
        ("top_p", json!(0.95)),
        ("top_k", json!(20)),
        ("min_p", json!(0.1)),
        ("seed", json!(1234)),
        ("stop", json!("END")),
        ("repetition_penalty", json!(1.2)),
        ("logit_bias", json!({"42": 3})),
        ("max_completion_tokens", json!(3)),
    ] {
        body[k] = v;
    }
    let (status, _) = post(&server, "/v1/chat/completions", body).await;
    assert_eq!(status, 200);
    let req = server.fake.last_request();
    let s = &req.sampling;
    assert_eq!(
        (s.temperature, s.top_p, s.top_k, s.min_p),
        (0.8, 0.95, 20, 0.1)
    );
    assert_eq!((s.seed, s.repeat_penalty), (Some(1234), 1.2));
    assert_eq!(s.logit_bias, vec![(42, 3.0)]);
    assert_eq!(
        (req.stop, req.max_tokens),
        (vec!["END".to_string()], Some(3))
    );
}

#[tokio::test]
async fn a_thinking_models_reasoning_is_apart_from_its_answer() {
    let server = TestServer::start(Behaviour::Think, RouterOptions::default()).await;
    let (status, text) = post(&server, "/v1/chat/completions", chat_body("hi")).await;
    assert_eq!(status, 200, "{text}");
    let body: Value = serde_json::from_str(&text).unwrap();
    let message = &body["choices"][0]["message"];
    assert_eq!(message["content"], full_text(), "{body}");
    assert_eq!(message["reasoning_content"], REASONING.concat(), "{body}");
    let usage = &body["usage"];
    assert_eq!(
        usage["completion_tokens"],
        REASONING.len() + PIECES.len(),
        "{usage}"
    );
    assert_eq!(
        usage["completion_tokens_details"]["reasoning_tokens"],
        REASONING.len(),
        "{usage}"
    );

    // Streamed: the reasoning's chunks, then the answer's; the usage counts both.
    let mut body = chat_body("hi");
    body["stream"] = json!(true);
    body["stream_options"] = json!({"include_usage": true});
    let (status, text) = post(&server, "/v1/chat/completions", body).await;
    assert_eq!(status, 200, "{text}");
    let chunks = sse_chunks(&text);
    let deltas: Vec<&Value> = chunks
        .iter()
        .filter_map(|c| c["choices"].get(0).map(|choice| &choice["delta"]))
        .collect();
    let field = |name: &str| -> String {
        deltas
            .iter()
            .filter_map(|d| d[name].as_str())
            .collect::<String>()
    };
    assert_eq!(field("reasoning_content"), REASONING.concat());
    assert_eq!(field("content"), full_text());
    let last_reasoning = deltas
        .iter()
        .rposition(|d| d.get("reasoning_content").is_some())
        .unwrap();
    let first_content = deltas
        .iter()
        .position(|d| d["content"].as_str().is_some_and(|c| !c.is_empty()))
        .unwrap();
    assert!(last_reasoning < first_content, "{deltas:?}");
    let usage = &chunks.last().unwrap()["usage"];
    assert_eq!(
        usage["completion_tokens_details"]["reasoning_tokens"],
        REASONING.len(),
        "{usage}"
    );

    // Without reasoning, neither field appears.
    server.fake.set(Behaviour::Reply);
    let (_, text) = post(&server, "/v1/chat/completions", chat_body("hi")).await;
    let body: Value = serde_json::from_str(&text).unwrap();
    assert!(
        body["choices"][0]["message"]
            .get("reasoning_content")
            .is_none(),
        "{body}"
    );
    assert!(
        body["usage"].get("completion_tokens_details").is_none(),
        "{body}"
    );
}
