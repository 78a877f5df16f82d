//! Fuzzing of request parsing: arbitrary JSON, valid bodies with one field replaced by
//! arbitrary JSON, and arbitrary bytes. Parsing never panics; a refusal is always a 400;
//! an accepted body always yields a request the daemon's own validation would accept.

use proptest::collection::{btree_map, vec};
use proptest::prelude::*;
use serde_json::{json, Map, Number, Value};

use super::*;

/// Field names both endpoints read, so that random objects often hit real fields.
const FIELDS: &[&str] = &[
    "model",
    "messages",
    "prompt",
    "role",
    "content",
    "type",
    "text",
    "max_tokens",
    "max_completion_tokens",
    "temperature",
    "top_p",
    "top_k",
    "min_p",
    "presence_penalty",
    "frequency_penalty",
    "repetition_penalty",
    "seed",
    "stop",
    "logit_bias",
    "n",
    "stream",
    "stream_options",
    "include_usage",
    "logprobs",
    "top_logprobs",
    "tools",
    "tool_choice",
    "parallel_tool_calls",
    "tool_calls",
    "tool_call_id",
    "function",
    "name",
    "arguments",
    "parameters",
    "id",
    "response_format",
    "echo",
    "suffix",
    "best_of",
];

fn number() -> impl Strategy<Value = Value> {
    prop_oneof![
        any::<i64>().prop_map(Value::from),
        any::<u64>().prop_map(Value::from),
        (-3i64..30).prop_map(Value::from),
        // Finite only: JSON has no NaN or infinity.
        any::<f64>().prop_filter_map("finite", |f| Number::from_f64(f).map(Value::Number)),
        // Past f32's range, signed zero, just past a bound, subnormal.
        prop_oneof![Just(1e39), Just(-0.0), Just(2.0000001), Just(1e-45)]
            .prop_map(|f: f64| json!(f)),
    ]
}

fn leaf() -> impl Strategy<Value = Value> {
    prop_oneof![
        Just(Value::Null),
        any::<bool>().prop_map(Value::Bool),
        number(),
        (-3i64..30).prop_map(Value::from),
        "\\PC{0,8}".prop_map(Value::String),
        Just(json!("user")),
        Just(json!("text")),
        Just(json!("")),
    ]
}

fn key() -> impl Strategy<Value = String> {
    prop_oneof![
        3 => proptest::sample::select(FIELDS).prop_map(str::to_string),
        1 => "[a-z0-9_]{0,6}",
    ]
}

fn json_value() -> impl Strategy<Value = Value> {
    leaf().prop_recursive(4, 48, 6, |inner| {
        prop_oneof![
            vec(inner.clone(), 0..6).prop_map(Value::Array),
            btree_map(key(), inner, 0..6)
                .prop_map(|m| Value::Object(m.into_iter().collect::<Map<_, _>>())),
        ]
    })
}

fn valid_chat() -> Value {
    json!({
        "model": "m", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 5,
        "temperature": 0.5, "top_p": 0.9, "stop": ["x"], "logprobs": true,
        "top_logprobs": 2, "logit_bias": {"5": 1.0}, "stream": true,
        "stream_options": {"include_usage": true}, "seed": 3,
    })
}

fn valid_chat_with_tools() -> Value {
    json!({
        "model": "m", "max_tokens": 5, "stream": true,
        "messages": [
            {"role": "user", "content": "weather?"},
            {"role": "assistant", "content": null, "tool_calls": [{"id": "c1", "type": "function",
             "function": {"name": "get_weather", "arguments": "{\"city\":\"Oslo\"}"}}]},
            {"role": "tool", "tool_call_id": "c1", "content": "12 C"},
        ],
        "tools": [{"type": "function", "function": {"name": "get_weather",
                   "parameters": {"type": "object", "properties": {"city": {"type": "string"}}}}}],
        "tool_choice": {"type": "function", "function": {"name": "get_weather"}},
        "parallel_tool_calls": false,
    })
}

fn valid_completion() -> Value {
    json!({"model": "m", "prompt": "once", "max_tokens": 5, "logprobs": 1, "stop": "."})
}

/// What the daemon checks again on arrival (`engine::handle`, `text::sampler`).
fn assert_acceptable(parsed: &ParsedRequest) {
    let g = &parsed.generate;
    let s = &g.sampling;
    assert!(
        s.temperature.is_finite() && (0.0..=2.0).contains(&s.temperature),
        "{s:?}"
    );
    assert!(s.top_p > 0.0 && s.top_p <= 1.0, "{s:?}");
    assert!((0.0..=1.0).contains(&s.min_p), "{s:?}");
    assert!((-2.0..=2.0).contains(&s.presence_penalty), "{s:?}");
    assert!((-2.0..=2.0).contains(&s.frequency_penalty), "{s:?}");
    assert!(
        s.repeat_penalty.is_finite() && s.repeat_penalty > 0.0,
        "{s:?}"
    );
    assert!(
        s.logit_bias
            .iter()
            .all(|(_, b)| (-100.0..=100.0).contains(b)),
        "{s:?}"
    );
    assert!(s.logit_bias.windows(2).all(|w| w[0].0 <= w[1].0), "{s:?}");
    assert!(g.stop.len() <= MAX_STOP_STRINGS && g.stop.iter().all(|s| !s.is_empty()));
    assert!(g.logprobs.is_none_or(|n| u32::from(n) <= MAX_TOP_LOGPROBS));
    assert_ne!(g.max_tokens, Some(0));
    assert!(!parsed.include_usage || parsed.stream);
    match &g.input {
        PromptInput::Chat { messages } => {
            assert!(!messages.is_empty());
            assert!(messages.iter().all(|m| !m.role.is_empty()));
        }
        PromptInput::ChatWithTools {
            messages,
            tools,
            choice,
            ..
        } => {
            assert_acceptable_tools(messages, tools, choice);
            assert_eq!(parsed.format, OutputFormat::Text);
        }
        PromptInput::Raw { .. } => {}
    }
}

/// What the daemon expects of a chat with tools (`PromptInput::ChatWithTools`).
fn assert_acceptable_tools(messages: &[ToolChatMessage], tools: &[ToolSpec], choice: &ToolChoice) {
    let is_object = |text: &str| serde_json::from_str::<Value>(text).is_ok_and(|v| v.is_object());
    assert!(!messages.is_empty());
    assert!(tools.len() <= crate::limits::MAX_TOOLS);
    for (i, tool) in tools.iter().enumerate() {
        assert!((1..=64).contains(&tool.name.len()), "{tool:?}");
        assert!(tool
            .name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'-'));
        assert!(tools[..i].iter().all(|t| t.name != tool.name), "{tools:?}");
        assert!(
            tool.parameters.is_empty() || is_object(&tool.parameters),
            "{tool:?}"
        );
    }
    if let ToolChoice::Function(name) = choice {
        assert!(tools.iter().any(|t| &t.name == name), "{choice:?}");
    }
    for m in messages {
        assert!(!m.role.is_empty());
        assert!(m.tool_calls.len() <= crate::limits::MAX_TOOLS);
        assert!(m.tool_calls.is_empty() || m.role == "assistant", "{m:?}");
        assert!(
            m.tool_calls.iter().all(|c| is_object(&c.arguments)),
            "{m:?}"
        );
        assert_eq!(m.role == "tool", m.tool_call_id.is_some(), "{m:?}");
    }
}

fn check(body: &[u8]) {
    for result in [parse_chat(body), parse_completion(body)] {
        match result {
            Ok(parsed) => assert_acceptable(&parsed),
            Err(err) => {
                assert_eq!(err.status, 400, "{err:?}");
                assert!(!err.message.is_empty());
            }
        }
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 2048, ..ProptestConfig::default() })]

    #[test]
    fn arbitrary_json_is_parsed_or_refused_with_a_400(value in json_value()) {
        check(value.to_string().as_bytes());
    }

    #[test]
    fn valid_bodies_with_one_field_replaced_are_parsed_or_refused(
        kind in 0..3u8,
        field in proptest::sample::select(FIELDS),
        value in json_value(),
    ) {
        let mut body = match kind {
            0 => valid_chat(),
            1 => valid_chat_with_tools(),
            _ => valid_completion(),
        };
        body.as_object_mut().expect("object").insert(field.to_string(), value);
        check(body.to_string().as_bytes());
    }

    #[test]
    fn tool_bodies_with_one_nested_field_replaced_are_parsed_or_refused(
        pointer in proptest::sample::select(&[
            "/messages/1/tool_calls/0",
            "/messages/1/tool_calls/0/function",
            "/messages/1/tool_calls/0/function/arguments",
            "/messages/2",
            "/messages/2/tool_call_id",
            "/tools/0",
            "/tools/0/type",
            "/tools/0/function",
            "/tools/0/function/name",
            "/tools/0/function/parameters",
            "/tool_choice/function",
            "/tool_choice/function/name",
        ][..]),
        value in json_value(),
    ) {
        let mut body = valid_chat_with_tools();
        if let Some(slot) = body.pointer_mut(pointer) {
            *slot = value;
        }
        check(body.to_string().as_bytes());
    }

    #[test]
    fn arbitrary_bytes_are_refused_with_a_400(bytes in vec(any::<u8>(), 0..256)) {
        check(&bytes);
    }
}

#[test]
fn the_valid_bodies_used_above_are_accepted() {
    assert_acceptable(&parse_chat(valid_chat().to_string().as_bytes()).unwrap());
    let with_tools = parse_chat(valid_chat_with_tools().to_string().as_bytes()).unwrap();
    assert!(matches!(
        with_tools.generate.input,
        PromptInput::ChatWithTools { .. }
    ));
    assert_acceptable(&with_tools);
    assert_acceptable(&parse_completion(valid_completion().to_string().as_bytes()).unwrap());
}
