//! Tool calling over HTTP against the fake backend: answers with `tool_calls`, streamed
//! call chunks, finish reasons, and what reaches the daemon.

use serde_json::{json, Value};

use super::fake::{
    call_id, Behaviour, TestServer, CALL_ARGUMENTS, CALL_ARGUMENT_PIECES, MODEL, PIECES,
};
use super::{client, sse_chunks};
use crate::openai::RouterOptions;
use crate::protocol::{GenerateOption, PromptInput, ToolChoice};

fn tool(name: &str) -> Value {
    json!({"type": "function", "function": {
        "name": name,
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}},
                       "required": ["city"]},
    }})
}

/// A one-question chat offering `tools`, with the other fields of `extra`.
fn body(tools: &[&str], extra: Value) -> Value {
    let mut body = json!({
        "model": MODEL,
        "messages": [{"role": "user", "content": "weather in Oslo?"}],
        "tools": tools.iter().map(|t| tool(t)).collect::<Vec<_>>(),
    });
    body.as_object_mut()
        .unwrap()
        .extend(extra.as_object().unwrap().clone());
    body
}

async fn post(server: &TestServer, body: Value) -> (u16, String) {
    let response = client()
        .post(server.url("/v1/chat/completions"))
        .json(&body)
        .send()
        .await
        .expect("send");
    let status = response.status().as_u16();
    (status, response.text().await.expect("body"))
}

async fn answer(server: &TestServer, body: Value) -> Value {
    let (status, text) = post(server, body).await;
    assert_eq!(status, 200, "{text}");
    serde_json::from_str(&text).unwrap()
}

async fn streamed(server: &TestServer, mut body: Value) -> Vec<Value> {
    body["stream"] = json!(true);
    let (status, text) = post(server, body).await;
    assert_eq!(status, 200, "{text}");
    sse_chunks(&text)
}

/// The call the fake makes as `index` of the generation with daemon id `id`.
fn expected_call(id: u64, index: u32, name: &str) -> Value {
    json!({"id": call_id(id, index), "type": "function",
           "function": {"name": name, "arguments": CALL_ARGUMENTS}})
}

/// Accumulates `delta.tool_calls` the way OpenAI's function-calling guide does: the
/// first piece of an index is kept as the call, and every piece's arguments (the first
/// one's included) are appended to it.
fn accumulate_like_the_guide(chunks: &[Value]) -> Vec<Value> {
    let mut calls: Vec<Value> = Vec::new();
    for chunk in chunks {
        let Some(pieces) = chunk["choices"][0]["delta"]["tool_calls"].as_array() else {
            continue;
        };
        for piece in pieces {
            let index = piece["index"].as_u64().unwrap() as usize;
            if index == calls.len() {
                calls.push(piece.clone());
            }
            let arguments = piece["function"]["arguments"]
                .as_str()
                .expect("every piece has arguments");
            let whole = calls[index]["function"]["arguments"].as_str().unwrap();
            calls[index]["function"]["arguments"] = json!(format!("{whole}{arguments}"));
        }
    }
    for call in &mut calls {
        call.as_object_mut().unwrap().remove("index");
    }
    calls
}

#[tokio::test]
async fn a_required_call_is_the_whole_answer() {
    let server = TestServer::start(Behaviour::Reply, RouterOptions::default()).await;
    let v = answer(
        &server,
        body(&["get_weather"], json!({"tool_choice": "required"})),
    )
    .await;
    let choice = &v["choices"][0];
    assert_eq!(choice["finish_reason"], "tool_calls");
    let message = &choice["message"];
    assert_eq!(message["role"], "assistant");
    assert!(
        message["content"].is_null() && message.get("content").is_some(),
        "{message}"
    );
    let id = server.fake.last_request().id;
    assert_eq!(
        message["tool_calls"],
        json!([expected_call(id, 0, "get_weather")])
    );
    assert_eq!(v["usage"]["completion_tokens"], 1);
    // The daemon was asked for a chat with tools, one call only.
    let PromptInput::ChatWithTools {
        tools,
        choice,
        parallel,
        ..
    } = server.fake.last_request().input
    else {
        panic!("not a chat with tools");
    };
    assert_eq!(tools[0].name, "get_weather");
    assert_eq!((choice, parallel), (ToolChoice::Required, true));
}

#[tokio::test]
async fn text_then_calls_keeps_both_and_several_calls_keep_their_order() {
    let server = TestServer::start(Behaviour::Reply, RouterOptions::default()).await;
    // `auto`: the fake says its text, then calls the first tool.
    let v = answer(&server, body(&["get_weather", "get_time"], json!({}))).await;
    let choice = &v["choices"][0];
    assert_eq!(choice["finish_reason"], "tool_calls");
    assert_eq!(choice["message"]["content"], PIECES.concat());
    let id = server.fake.last_request().id;
    assert_eq!(
        choice["message"]["tool_calls"],
        json!([expected_call(id, 0, "get_weather")])
    );

    // `required` with parallel calls: one call per tool, in order.
    let v = answer(
        &server,
        body(
            &["get_weather", "get_time"],
            json!({"tool_choice": "required"}),
        ),
    )
    .await;
    let id = server.fake.last_request().id;
    assert_eq!(
        v["choices"][0]["message"]["tool_calls"],
        json!([
            expected_call(id, 0, "get_weather"),
            expected_call(id, 1, "get_time")
        ])
    );

    // A named function.
    let named = json!({"tool_choice": {"type": "function", "function": {"name": "get_time"}}});
    let v = answer(&server, body(&["get_weather", "get_time"], named)).await;
    let id = server.fake.last_request().id;
    assert_eq!(
        v["choices"][0]["message"]["tool_calls"],
        json!([expected_call(id, 0, "get_time")])
    );
}

#[tokio::test]
async fn no_calls_means_no_tool_calls_field_and_a_cut_answer_stays_length() {
    let server = TestServer::start(Behaviour::Reply, RouterOptions::default()).await;
    let v = answer(
        &server,
        body(&["get_weather"], json!({"tool_choice": "none"})),
    )
    .await;
    let choice = &v["choices"][0];
    assert_eq!(choice["finish_reason"], "stop");
    assert_eq!(choice["message"]["content"], PIECES.concat());
    assert!(choice["message"].get("tool_calls").is_none(), "{v}");

    // Calls made, then the answer was cut short: `length`, as OpenAI says.
    let v = answer(&server, body(&["get_weather"], json!({"max_tokens": 2}))).await;
    let choice = &v["choices"][0];
    assert_eq!(choice["finish_reason"], "length");
    assert_eq!(choice["message"]["tool_calls"].as_array().unwrap().len(), 1);
}

#[tokio::test]
async fn whole_calls_stream_as_an_opening_chunk_then_the_arguments() {
    // A daemon older than 1.9 sends each call whole, whatever the shim asked for.
    let server = TestServer::start(Behaviour::WholeCalls, RouterOptions::default()).await;
    let chunks = streamed(
        &server,
        body(
            &["get_weather", "get_time"],
            json!({"tool_choice": "required", "stream_options": {"include_usage": true}}),
        ),
    )
    .await;
    let id = server.fake.last_request().id;
    // Role chunk, two chunks per call, the finish chunk, the usage chunk.
    assert_eq!(chunks.len(), 1 + 2 * 2 + 1 + 1, "{chunks:?}");
    assert_eq!(chunks[0]["choices"][0]["delta"]["role"], "assistant");
    let delta = |i: usize| chunks[i]["choices"][0]["delta"].clone();
    assert_eq!(
        delta(1),
        json!({"tool_calls": [{"index": 0, "id": call_id(id, 0), "type": "function",
                               "function": {"name": "get_weather", "arguments": ""}}]})
    );
    assert_eq!(
        delta(2),
        json!({"tool_calls": [{"index": 0, "function": {"arguments": CALL_ARGUMENTS}}]})
    );
    assert_eq!(delta(3)["tool_calls"][0]["index"], 1);
    assert_eq!(delta(3)["tool_calls"][0]["function"]["name"], "get_time");
    for chunk in &chunks[..5] {
        assert!(chunk["choices"][0]["finish_reason"].is_null(), "{chunk}");
        assert!(chunk["usage"].is_null(), "{chunk}");
    }
    assert_eq!(chunks[5]["choices"][0]["finish_reason"], "tool_calls");
    assert_eq!(chunks[5]["choices"][0]["delta"], json!({}));
    assert_eq!(chunks[6]["choices"], json!([]));
    assert_eq!(chunks[6]["usage"]["completion_tokens"], 2);
    // A client written after OpenAI's guide gets each call once, arguments whole.
    assert_eq!(
        accumulate_like_the_guide(&chunks),
        [
            expected_call(id, 0, "get_weather"),
            expected_call(id, 1, "get_time")
        ]
    );
}

#[tokio::test]
async fn calls_stream_piece_by_piece_as_the_daemon_writes_them() {
    let server = TestServer::start(Behaviour::Reply, RouterOptions::default()).await;
    let chunks = streamed(
        &server,
        body(
            &["get_weather", "get_time"],
            json!({"tool_choice": "required", "stream_options": {"include_usage": true}}),
        ),
    )
    .await;
    let id = server.fake.last_request().id;
    // The shim asked for the calls in pieces.
    let options = server.fake.options.lock().unwrap().last().cloned().unwrap();
    assert_eq!(options, [GenerateOption::StreamToolCalls]);
    // Role chunk; per call its opening, then one chunk per piece of the arguments (the
    // daemon's first piece came with the opening); the finish chunk, the usage chunk.
    let per_call = 1 + CALL_ARGUMENT_PIECES.len();
    assert_eq!(chunks.len(), 1 + 2 * per_call + 1 + 1, "{chunks:?}");
    let delta = |i: usize| chunks[i]["choices"][0]["delta"].clone();
    assert_eq!(
        delta(1),
        json!({"tool_calls": [{"index": 0, "id": call_id(id, 0), "type": "function",
                               "function": {"name": "get_weather", "arguments": ""}}]})
    );
    for (i, piece) in CALL_ARGUMENT_PIECES.iter().enumerate() {
        assert_eq!(
            delta(2 + i),
            json!({"tool_calls": [{"index": 0, "function": {"arguments": piece}}]})
        );
    }
    assert_eq!(delta(1 + per_call)["tool_calls"][0]["index"], 1);
    assert_eq!(
        delta(1 + per_call)["tool_calls"][0]["function"]["name"],
        "get_time"
    );
    let last = chunks.len() - 2;
    assert_eq!(chunks[last]["choices"][0]["finish_reason"], "tool_calls");
    assert_eq!(chunks[last + 1]["usage"]["completion_tokens"], 2);
    // The whole `ToolCall` that followed each call's pieces added nothing: a client
    // written after OpenAI's guide gets each call once, arguments whole.
    assert_eq!(
        accumulate_like_the_guide(&chunks),
        [
            expected_call(id, 0, "get_weather"),
            expected_call(id, 1, "get_time")
        ]
    );
}

#[tokio::test]
async fn a_streamed_call_cut_short_ends_in_its_pieces_with_length() {
    let server = TestServer::start(Behaviour::Reply, RouterOptions::default()).await;
    let chunks = streamed(&server, body(&["get_weather"], json!({"max_tokens": 2}))).await;
    let id = server.fake.last_request().id;
    let mut cut = expected_call(id, 0, "get_weather");
    cut["function"]["arguments"] = json!(CALL_ARGUMENT_PIECES[0]);
    assert_eq!(accumulate_like_the_guide(&chunks), [cut]);
    let last = &chunks.last().unwrap()["choices"][0];
    assert_eq!(last["finish_reason"], "length");
}

#[tokio::test]
async fn whole_answers_gather_the_pieces_and_keep_a_call_cut_short_as_a_call() {
    let server = TestServer::start(Behaviour::Reply, RouterOptions::default()).await;
    let v = answer(
        &server,
        body(&["get_weather"], json!({"tool_choice": "required"})),
    )
    .await;
    let id = server.fake.last_request().id;
    // The pieces came, then the whole call: the call once.
    assert_eq!(
        v["choices"][0]["message"]["tool_calls"],
        json!([expected_call(id, 0, "get_weather")])
    );
    let options = server.fake.options.lock().unwrap().last().cloned().unwrap();
    assert_eq!(options, [GenerateOption::StreamToolCalls]);

    // Cut short by max_tokens: a call with the arguments written so far, and `length`,
    // as the stream says it (not the call's JSON as text).
    let v = answer(&server, body(&["get_weather"], json!({"max_tokens": 2}))).await;
    let id = server.fake.last_request().id;
    let mut cut = expected_call(id, 0, "get_weather");
    cut["function"]["arguments"] = json!(CALL_ARGUMENT_PIECES[0]);
    let choice = &v["choices"][0];
    assert_eq!(choice["message"]["tool_calls"], json!([cut]));
    assert_eq!(choice["finish_reason"], "length");

    // An answer without tools has no calls to ask for.
    let plain = json!({"model": MODEL, "messages": [{"role": "user", "content": "hi"}]});
    let (status, _) = post(&server, plain).await;
    assert_eq!(status, 200);
    let options = server.fake.options.lock().unwrap().last().cloned().unwrap();
    assert!(options.is_empty(), "{options:?}");
}

#[tokio::test]
async fn streamed_text_then_a_call_and_a_cut_stream() {
    let server = TestServer::start(Behaviour::Reply, RouterOptions::default()).await;
    let chunks = streamed(&server, body(&["get_weather"], json!({}))).await;
    let text: String = chunks
        .iter()
        .filter_map(|c| c["choices"][0]["delta"]["content"].as_str())
        .collect();
    assert_eq!(text, PIECES.concat());
    let id = server.fake.last_request().id;
    assert_eq!(
        accumulate_like_the_guide(&chunks),
        [expected_call(id, 0, "get_weather")]
    );
    let last = &chunks.last().unwrap()["choices"][0];
    assert_eq!(last["finish_reason"], "tool_calls");

    let chunks = streamed(&server, body(&["get_weather"], json!({"max_tokens": 2}))).await;
    assert_eq!(accumulate_like_the_guide(&chunks).len(), 1);
    let last = &chunks.last().unwrap()["choices"][0];
    assert_eq!(last["finish_reason"], "length");
}

#[tokio::test]
async fn bad_tools_are_a_400_before_the_daemon_is_asked() {
    let server = TestServer::start(Behaviour::Reply, RouterOptions::default()).await;
    let (status, text) = post(&server, body(&["get weather"], json!({}))).await;
    assert_eq!(status, 400, "{text}");
    let v: Value = serde_json::from_str(&text).unwrap();
    assert_eq!(v["error"]["param"], "tools[0].function.name");
    assert_eq!(v["error"]["type"], "invalid_request_error");
    assert!(server.fake.requests.lock().unwrap().is_empty());
}

#[tokio::test]
async fn completions_ignore_tools_as_before() {
    let server = TestServer::start(Behaviour::Reply, RouterOptions::default()).await;
    let body = json!({"model": MODEL, "prompt": "Once", "tools": [tool("get_weather")]});
    let response = client()
        .post(server.url("/v1/completions"))
        .json(&body)
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), 200);
    assert!(matches!(
        server.fake.last_request().input,
        PromptInput::Raw { .. }
    ));
}
