//! Privacy: with every log level on, neither the daemon nor the OpenAI shim writes what
//! users send (prompts, stop strings, texts to tokenize, API keys) or what the model
//! writes back.

use std::time::Duration;

use serde_json::{json, Value};
use spark_client::protocol::*;
use sparkd_e2e::{strip_ansi, tiny_model, Daemon, Shim};

const MARKER: &str = "ZEBRA-PROMPT-7731";
const STOP_MARKER: &str = "ZEBRA-STOP-4402";
const API_KEY: &str = "ZEBRA-KEY-5150";
const WRONG_KEY: &str = "ZEBRA-WRONG-KEY-6061";

fn raw(id: u64, text: String, logprobs: Option<u8>) -> GenerateRequest {
    GenerateRequest {
        id,
        model: None,
        input: PromptInput::Raw {
            text,
            special: false,
        },
        sampling: SamplingParams {
            temperature: 0.9,
            seed: Some(id),
            ..Default::default()
        },
        max_tokens: Some(40),
        stop: vec![STOP_MARKER.into()],
        logprobs,
    }
}

/// Every `content`/`text` string anywhere in an OpenAI response or chunk.
fn texts_in(v: &Value, out: &mut Vec<String>) {
    match v {
        Value::Object(map) => {
            for (k, v) in map {
                match (k.as_str(), v) {
                    ("content" | "text", Value::String(s)) => out.push(s.clone()),
                    _ => texts_in(v, out),
                }
            }
        }
        Value::Array(items) => items.iter().for_each(|v| texts_in(v, out)),
        _ => {}
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn trace_logs_hold_no_prompts_no_generated_text_and_no_keys() {
    let trace = [("RUST_LOG", "trace")];
    let d = Daemon::start_with_env(&tiny_model(), &[], &trace);
    let shim = Shim::start(
        &d.socket,
        &[("RUST_LOG", "trace"), ("SPARKD_API_KEY", API_KEY)],
    );
    let mut generated: Vec<String> = Vec::new();

    // Over the socket: raw and chat prompts, logprobs, tokenize.
    let client = d.client().await;
    for (id, logprobs) in [(1, None), (2, Some(3))] {
        let (text, _) = client
            .generate(raw(id, format!("{MARKER} raw prompt {id}"), logprobs))
            .await
            .unwrap()
            .collect_text()
            .await
            .unwrap();
        generated.push(text);
    }
    let chat = GenerateRequest {
        input: PromptInput::Chat {
            messages: vec![
                ChatMessage::new("system", format!("{MARKER} system")),
                ChatMessage::new("user", format!("{MARKER} user")),
            ],
        },
        ..raw(3, String::new(), None)
    };
    generated.push(
        client
            .generate(chat)
            .await
            .unwrap()
            .collect_text()
            .await
            .unwrap()
            .0,
    );
    client
        .tokenize(&format!("{MARKER} to tokenize"), true)
        .await
        .unwrap();
    // Refusals echo the offending value to the client; the logs must not.
    let unknown_model = GenerateRequest {
        model: Some(MARKER.into()),
        ..raw(4, MARKER.into(), None)
    };
    let refused = client
        .generate(unknown_model)
        .await
        .unwrap()
        .collect_text()
        .await
        .expect_err("no such model");
    assert!(refused.to_string().contains(MARKER), "{refused}");

    // Through the shim: both endpoints, streamed and not, and a request with a wrong key.
    let http = reqwest::Client::builder().no_proxy().build().unwrap();
    let bodies = [
        (
            "/v1/chat/completions",
            json!({"messages": [{"role": "user", "content": format!("{MARKER} http chat")}], "stop": [STOP_MARKER], "max_tokens": 40, "temperature": 0.9, "seed": 4}),
        ),
        (
            "/v1/chat/completions",
            json!({"messages": [{"role": "user", "content": format!("{MARKER} http stream")}], "stream": true, "logprobs": true, "top_logprobs": 2, "max_tokens": 40, "temperature": 0.9, "seed": 5}),
        ),
        (
            "/v1/completions",
            json!({"prompt": format!("{MARKER} http completion"), "max_tokens": 40, "temperature": 0.9, "seed": 6, "logprobs": 2}),
        ),
    ];
    for (path, body) in &bodies {
        let response = http
            .post(shim.url(path))
            .bearer_auth(API_KEY)
            .json(body)
            .send()
            .await
            .unwrap();
        assert!(
            response.status().is_success(),
            "{path}: {}",
            response.status()
        );
        let text = response.text().await.unwrap();
        let values: Vec<Value> = if body["stream"] == json!(true) {
            text.lines()
                .filter_map(|l| l.strip_prefix("data: "))
                .filter_map(|d| serde_json::from_str(d).ok())
                .collect()
        } else {
            vec![serde_json::from_str(&text).unwrap()]
        };
        let mut pieces = Vec::new();
        for v in &values {
            texts_in(v, &mut pieces);
        }
        generated.push(pieces.concat());
    }
    let refused = http
        .post(shim.url("/v1/chat/completions"))
        .bearer_auth(WRONG_KEY)
        .json(&bodies[0].1)
        .send()
        .await
        .unwrap();
    assert_eq!(refused.status(), 401);
    for bad in [
        json!({"messages": MARKER}),
        json!({"messages": [{"role": "user", "content": "x"}], "max_tokens": MARKER}),
        json!({"messages": [{"role": "user", "content": "x"}], "model": MARKER}),
    ] {
        let response = http
            .post(shim.url("/v1/chat/completions"))
            .bearer_auth(API_KEY)
            .json(&bad)
            .send()
            .await
            .unwrap();
        assert!(
            response.status().is_client_error(),
            "{bad}: {}",
            response.status()
        );
    }

    // Let both flush their logs, then read them.
    tokio::time::sleep(Duration::from_millis(200)).await;
    let logs = [
        ("daemon", strip_ansi(&d.log_text())),
        ("shim", strip_ansi(&shim.log_text())),
    ];
    for (who, log) in &logs {
        // Verbose logging really was on (nothing in the daemon itself logs at trace:
        // debug lines are the evidence), so a quiet log cannot pass for a private one.
        assert!(
            log.contains("DEBUG") || log.contains("TRACE"),
            "{who} logged nothing below info:\n{log}"
        );
        for secret in [MARKER, STOP_MARKER, API_KEY, WRONG_KEY] {
            assert!(!log.contains(secret), "{who} logged {secret}:\n{log}");
        }
    }
    // Generated text: long enough pieces that finding one by chance is implausible.
    let checked: Vec<&String> = generated
        .iter()
        .filter(|t| t.trim().chars().count() >= 12)
        .collect();
    assert!(
        !checked.is_empty(),
        "no generated text to look for: {generated:?}"
    );
    for text in &checked {
        for (who, log) in &logs {
            assert!(
                !log.contains(text.trim()),
                "{who} logged generated text {text:?}"
            );
        }
    }
    println!(
        "checked {} log lines for 4 secrets and {} generated texts",
        logs.iter().map(|(_, l)| l.lines().count()).sum::<usize>(),
        checked.len()
    );
}
