//! Arbitrary JSON bodies through the whole router (auth, limits, parsing, a fake daemon):
//! every answer is an OpenAI-shaped success or a 4xx, never a 5xx or a dropped
//! connection.

use proptest::collection::{btree_map, vec};
use proptest::prelude::*;
use proptest::test_runner::{Config, TestRunner};
use serde_json::{json, Map, Value};

use super::client;
use super::fake::{Behaviour, TestServer};
use crate::openai::RouterOptions;

fn leaf() -> impl Strategy<Value = Value> {
    prop_oneof![
        Just(Value::Null),
        any::<bool>().prop_map(Value::Bool),
        (-3i64..30).prop_map(Value::from),
        any::<i64>().prop_map(Value::from),
        (-1e3f64..1e3).prop_map(|f| json!(f)),
        "\\PC{0,6}".prop_map(Value::String),
        Just(json!("user")),
        Just(json!("fake-model")),
    ]
}

/// Field names the endpoints read, so that random objects often hit real fields.
const FIELDS: &[&str] = &[
    "model",
    "messages",
    "prompt",
    "role",
    "content",
    "max_tokens",
    "temperature",
    "top_p",
    "top_k",
    "stop",
    "logit_bias",
    "n",
    "stream",
    "stream_options",
    "include_usage",
    "logprobs",
    "top_logprobs",
    "seed",
];

/// A valid body for the endpoint with up to three fields set to arbitrary values, or an
/// arbitrary body.
fn body(chat: bool) -> impl Strategy<Value = Value> {
    let valid = if chat {
        json!({"model": "fake-model", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 3})
    } else {
        json!({"prompt": "once", "max_tokens": 3})
    };
    let overrides = vec((proptest::sample::select(FIELDS), value()), 0..3);
    prop_oneof![
        2 => overrides.prop_map(move |fields| {
            let mut body = valid.clone();
            for (field, value) in fields {
                body.as_object_mut().expect("object").insert(field.to_string(), value);
            }
            body
        }),
        1 => arbitrary_body(),
    ]
}

fn value() -> impl Strategy<Value = Value> {
    leaf().prop_recursive(3, 24, 4, |inner| {
        prop_oneof![
            vec(inner.clone(), 0..4).prop_map(Value::Array),
            btree_map("[a-z_]{1,8}", inner, 0..4)
                .prop_map(|m| Value::Object(m.into_iter().collect::<Map<_, _>>())),
        ]
    })
}

fn arbitrary_body() -> impl Strategy<Value = Value> {
    let key = prop_oneof![
        3 => proptest::sample::select(FIELDS).prop_map(str::to_string),
        1 => "[a-z_]{0,5}",
    ];
    // Mostly objects with real field names: those reach furthest into the handlers.
    prop_oneof![
        4 => btree_map(key, value(), 0..6)
            .prop_map(|m| Value::Object(m.into_iter().collect::<Map<_, _>>())),
        1 => value(),
    ]
}

#[test]
fn arbitrary_bodies_never_get_a_server_error() {
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("runtime");
    let server = runtime.block_on(TestServer::start(
        Behaviour::Reply,
        RouterOptions::default(),
    ));
    let http = client();
    let mut runner = TestRunner::new(Config {
        cases: 256,
        failure_persistence: None,
        ..Config::default()
    });
    let answered = std::cell::RefCell::new([0usize; 6]);
    runner
        .run(
            &any::<bool>().prop_flat_map(|chat| (Just(chat), body(chat))),
            |(chat, body)| {
                let path = if chat {
                    "/v1/chat/completions"
                } else {
                    "/v1/completions"
                };
                let (status, text) = runtime.block_on(async {
                    let response = http
                        .post(server.url(path))
                        .header("content-type", "application/json")
                        .body(body.to_string())
                        .send()
                        .await
                        .expect("an answer, not a dropped connection");
                    let status = response.status().as_u16();
                    (status, response.text().await.expect("a whole body"))
                });
                answered.borrow_mut()[usize::from(status / 100).min(5)] += 1;
                prop_assert!(status < 500, "{status} for {body}: {text}");
                if status >= 400 {
                    let error: Value = serde_json::from_str(&text).expect("a JSON error");
                    prop_assert!(error["error"]["message"].as_str().is_some(), "{text}");
                } else if body["stream"] != json!(true) {
                    let ok: Value = serde_json::from_str(&text).expect("a JSON answer");
                    prop_assert!(ok["choices"][0].is_object(), "{text}");
                }
                Ok(())
            },
        )
        .unwrap_or_else(|e| panic!("{e}"));
    // Both kinds of answer were exercised, not only refusals.
    let answered = answered.into_inner();
    println!("answers by status class (0xx..5xx): {answered:?}");
    assert!(answered[2] > 0 && answered[4] > 0, "{answered:?}");
    server.shutdown.cancel();
}
