//! HTTP tests: the real router on 127.0.0.1:0, a real HTTP client, a fake daemon.

mod daemon;
mod fake;
mod fuzz;
mod generation;
mod misc;
mod tools;

use serde_json::Value;

/// The `data:` payloads of an SSE body, in order (`[DONE]` kept as a string).
fn sse_data(body: &str) -> Vec<String> {
    body.split("\n\n")
        .filter_map(|event| {
            let data: Vec<&str> = event
                .lines()
                .filter_map(|l| l.strip_prefix("data: ").or(l.strip_prefix("data:")))
                .collect();
            (!data.is_empty()).then(|| data.join("\n"))
        })
        .collect()
}

/// The JSON chunks of an SSE body, checking it ends with `[DONE]`.
fn sse_chunks(body: &str) -> Vec<Value> {
    let data = sse_data(body);
    assert_eq!(
        data.last().map(String::as_str),
        Some("[DONE]"),
        "stream must end with [DONE]: {body}"
    );
    data[..data.len() - 1]
        .iter()
        .map(|d| serde_json::from_str(d).unwrap_or_else(|e| panic!("bad chunk {d}: {e}")))
        .collect()
}

fn client() -> reqwest::Client {
    reqwest::Client::builder()
        .no_proxy()
        .build()
        .expect("client")
}
