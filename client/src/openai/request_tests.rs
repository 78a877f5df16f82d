//! Tests of request parsing and validation.

use super::*;
use crate::protocol::ToolCall;
use serde_json::json;

fn chat(body: Value) -> Result<ParsedRequest, ApiError> {
    parse_chat(body.to_string().as_bytes())
}

fn completion(body: Value) -> Result<ParsedRequest, ApiError> {
    parse_completion(body.to_string().as_bytes())
}

fn user(text: &str) -> Value {
    json!([{"role": "user", "content": text}])
}

fn param_of(result: Result<ParsedRequest, ApiError>) -> Option<String> {
    let err = result.expect_err("expected a validation error");
    assert_eq!(err.status, 400, "{err:?}");
    err.param
}

#[test]
fn minimal_chat_request_uses_daemon_defaults() {
    let parsed = chat(json!({"model": "m", "messages": user("hi")})).unwrap();
    assert_eq!(parsed.model.as_deref(), Some("m"));
    assert!(!parsed.stream && !parsed.include_usage);
    let g = parsed.generate;
    assert_eq!(g.sampling, SamplingParams::default());
    assert_eq!(g.max_tokens, None);
    assert!(g.stop.is_empty());
    assert_eq!(g.logprobs, None);
    assert_eq!(
        g.input,
        PromptInput::Chat {
            messages: vec![ChatMessage::new("user", "hi")]
        }
    );
}

#[test]
fn all_sampling_fields_are_carried_over() {
    let parsed = chat(json!({
        "model": "m", "messages": user("hi"),
        "max_tokens": 9, "temperature": 0.7, "top_p": 0.9, "top_k": 40, "min_p": 0.05,
        "presence_penalty": 0.5, "frequency_penalty": -0.5, "repetition_penalty": 1.1,
        "seed": 42, "stop": ["\n\n", "END"], "logit_bias": {"17": -100, "3": 5.5},
        "n": 1, "user": "someone", "some_future_field": {"x": 1},
    }))
    .unwrap();
    let g = parsed.generate;
    assert_eq!(g.max_tokens, Some(9));
    let s = g.sampling;
    assert_eq!(
        (s.temperature, s.top_p, s.top_k, s.min_p),
        (0.7, 0.9, 40, 0.05)
    );
    assert_eq!(
        (s.presence_penalty, s.frequency_penalty, s.repeat_penalty),
        (0.5, -0.5, 1.1)
    );
    assert_eq!(s.seed, Some(42));
    assert_eq!(s.logit_bias, vec![(3, 5.5), (17, -100.0)]);
    assert_eq!(g.stop, ["\n\n", "END"]);
}

#[test]
fn max_completion_tokens_wins_over_max_tokens() {
    let parsed = chat(json!({"messages": user("hi"), "max_tokens": 5, "max_completion_tokens": 7}));
    assert_eq!(parsed.unwrap().generate.max_tokens, Some(7));
}

#[test]
fn content_parts_are_joined_and_developer_becomes_system() {
    let parsed = chat(json!({"messages": [
        {"role": "developer", "content": "be brief"},
        {"role": "user", "content": [{"type": "text", "text": "a"}, {"type": "text", "text": "b"}]},
        {"role": "assistant", "content": null},
    ]}))
    .unwrap();
    let PromptInput::Chat { messages } = parsed.generate.input else {
        panic!("not chat")
    };
    assert_eq!(
        messages,
        [
            ChatMessage::new("system", "be brief"),
            ChatMessage::new("user", "a\nb"),
            ChatMessage::new("assistant", "")
        ]
    );
}

#[test]
fn stream_options_only_count_when_streaming() {
    let body = |stream| json!({"messages": user("x"), "stream": stream, "stream_options": {"include_usage": true}});
    let streaming = chat(body(true)).unwrap();
    assert!(streaming.stream && streaming.include_usage);
    assert!(!chat(body(false)).unwrap().include_usage);
}

#[test]
fn chat_logprobs_need_the_flag_and_a_small_top() {
    let lp = |extra: Value| {
        let mut body = json!({"messages": user("x")});
        body.as_object_mut()
            .unwrap()
            .extend(extra.as_object().unwrap().clone());
        chat(body)
    };
    assert_eq!(
        lp(json!({"logprobs": true})).unwrap().generate.logprobs,
        Some(0)
    );
    assert_eq!(
        lp(json!({"logprobs": true, "top_logprobs": 3}))
            .unwrap()
            .generate
            .logprobs,
        Some(3)
    );
    assert_eq!(
        lp(json!({"logprobs": false})).unwrap().generate.logprobs,
        None
    );
    assert_eq!(
        param_of(lp(json!({"top_logprobs": 3}))).as_deref(),
        Some("top_logprobs")
    );
    assert_eq!(
        param_of(lp(json!({"logprobs": true, "top_logprobs": 21}))).as_deref(),
        Some("top_logprobs")
    );
}

#[test]
fn top_p_zero_means_greedy_via_top_k() {
    let parsed = chat(json!({"messages": user("x"), "top_p": 0, "top_k": 50})).unwrap();
    assert_eq!(
        (
            parsed.generate.sampling.top_p,
            parsed.generate.sampling.top_k
        ),
        (1.0, 1)
    );
    let parsed = chat(json!({"messages": user("x"), "top_k": -1})).unwrap();
    assert_eq!(parsed.generate.sampling.top_k, 0);
}

#[test]
fn wrong_types_name_the_field() {
    let cases = [
        (json!({"messages": "hi"}), "messages"),
        (
            json!({"messages": user("x"), "temperature": "hot"}),
            "temperature",
        ),
        (
            json!({"messages": user("x"), "max_tokens": -3}),
            "max_tokens",
        ),
        (json!({"messages": user("x"), "stream": "yes"}), "stream"),
        (json!({"messages": user("x"), "stop": 5}), "stop"),
        (
            json!({"messages": [{"role": "user", "content": 5}]}),
            "messages[0].content",
        ),
        (json!({"messages": [{"content": "x"}]}), "messages[0].role"),
        // Only an assistant's turn may come without content.
        (
            json!({"messages": [{"role": "user"}]}),
            "messages[0].content",
        ),
        (
            json!({"messages": [{"role": "user", "content": "x"},
                                {"role": "system", "content": null}]}),
            "messages[1].content",
        ),
        (
            json!({"messages": user("x"), "logit_bias": {"1": "a"}}),
            "logit_bias.1",
        ),
    ];
    for (body, param) in cases {
        assert_eq!(
            param_of(chat(body.clone())).as_deref(),
            Some(param),
            "{body}"
        );
    }
}

#[test]
fn out_of_range_values_are_refused() {
    let cases = [
        (json!({"temperature": 2.5}), "temperature"),
        (json!({"temperature": -0.1}), "temperature"),
        (json!({"top_p": 1.5}), "top_p"),
        (json!({"min_p": -1}), "min_p"),
        (json!({"presence_penalty": 3}), "presence_penalty"),
        (json!({"frequency_penalty": -2.5}), "frequency_penalty"),
        (json!({"repetition_penalty": 0}), "repetition_penalty"),
        (json!({"top_k": -2}), "top_k"),
        (json!({"max_tokens": 0}), "max_tokens"),
        (json!({"n": 2}), "n"),
        (json!({"n": 0}), "n"),
        (json!({"logit_bias": {"abc": 1}}), "logit_bias.abc"),
        (json!({"logit_bias": {"5": 101}}), "logit_bias.5"),
        (
            json!({"tools": [{"type": "function"}]}),
            "tools[0].function",
        ),
        (
            json!({"response_format": {"type": "grammar", "grammar": "root ::= x"}}),
            "response_format",
        ),
        (
            json!({"response_format": {"type": "json_schema"}}),
            "response_format.json_schema",
        ),
        (
            json!({"response_format": {"type": "json_schema", "json_schema": {"name": "x", "schema": [1]}}}),
            "response_format.json_schema.schema",
        ),
        (json!({"temperature": 1e39}), "temperature"),
    ];
    for (extra, param) in cases {
        let mut body = json!({"messages": user("x")});
        body.as_object_mut()
            .unwrap()
            .extend(extra.as_object().unwrap().clone());
        assert_eq!(
            param_of(chat(body.clone())).as_deref(),
            Some(param),
            "{body}"
        );
    }
}

#[test]
fn empty_or_unsupported_messages_are_refused() {
    assert_eq!(
        param_of(chat(json!({"messages": []}))).as_deref(),
        Some("messages")
    );
    let image = json!({"messages": [{"role": "user", "content": [{"type": "image_url", "image_url": {"url": "x"}}]}]});
    assert_eq!(
        param_of(chat(image)).as_deref(),
        Some("messages[0].content[0].type")
    );
    assert_eq!(param_of(chat(json!({}))).as_deref(), Some("messages"));
}

#[test]
fn bodies_that_are_not_json_objects_are_refused() {
    for body in [&b"{"[..], b"", b"[1,2]", b"null", b"\xff\xfe"] {
        let err = parse_chat(body).expect_err("should fail");
        assert_eq!(err.status, 400);
        assert_eq!(err.metric, "bad_json");
    }
}

#[test]
fn completion_prompt_is_raw_and_logprobs_is_a_count() {
    let parsed =
        completion(json!({"model": "m", "prompt": "Once", "logprobs": 2, "stop": "."})).unwrap();
    assert_eq!(
        parsed.generate.input,
        PromptInput::Raw {
            text: "Once".into(),
            special: true
        }
    );
    assert_eq!(parsed.generate.logprobs, Some(2));
    assert_eq!(parsed.generate.stop, ["."]);
    let single = completion(json!({"prompt": ["Once"]})).unwrap();
    assert_eq!(
        single.generate.input,
        PromptInput::Raw {
            text: "Once".into(),
            special: true
        }
    );
}

#[test]
fn completion_refuses_what_it_cannot_do() {
    let cases = [
        (json!({"prompt": ["a", "b"]}), Some("prompt")),
        (json!({"prompt": [1, 2, 3]}), Some("prompt")),
        (json!({"prompt": "a", "echo": true}), Some("echo")),
        (json!({"prompt": "a", "suffix": "z"}), Some("suffix")),
        (json!({"prompt": "a", "best_of": 3}), Some("best_of")),
        (json!({"prompt": "a", "logprobs": 50}), Some("logprobs")),
        (json!({"prompt": "a", "logprobs": true}), Some("logprobs")),
        (json!({"model": "m"}), Some("prompt")),
    ];
    for (body, param) in cases {
        assert_eq!(
            param_of(completion(body.clone())).as_deref(),
            param,
            "{body}"
        );
    }
}

#[test]
fn empty_stop_strings_are_dropped_and_too_many_refused() {
    let parsed = chat(json!({"messages": user("x"), "stop": ["", "a"]})).unwrap();
    assert_eq!(parsed.generate.stop, ["a"]);
    let many: Vec<String> = (0..17).map(|i| i.to_string()).collect();
    assert_eq!(
        param_of(chat(json!({"messages": user("x"), "stop": many}))).as_deref(),
        Some("stop")
    );
}

#[test]
fn negative_seeds_map_to_distinct_fixed_values() {
    let seed = |s: i64| {
        chat(json!({"messages": user("x"), "seed": s}))
            .unwrap()
            .generate
            .sampling
            .seed
    };
    assert_eq!(seed(-1), seed(-1));
    assert_ne!(seed(-1), seed(-2));
    assert_eq!(seed(7), Some(7));
}

#[test]
fn response_format_picks_the_output_format() {
    let parse = |format: Option<Value>| {
        let mut body = json!({"messages": user("x")});
        if let Some(format) = format {
            body["response_format"] = format;
        }
        chat(body).expect("valid").format
    };
    assert_eq!(parse(None), OutputFormat::Text);
    assert_eq!(parse(Some(json!({"type": "text"}))), OutputFormat::Text);
    assert_eq!(
        parse(Some(json!({"type": "json_object"}))),
        OutputFormat::JsonObject
    );
    let schema = json!({"type": "object", "properties": {"a": {"type": "integer"}}});
    assert_eq!(
        parse(Some(json!({"type": "json_schema", "json_schema": {
            "name": "answer", "strict": true, "schema": schema
        }}))),
        OutputFormat::JsonSchema {
            schema: schema.to_string()
        }
    );
    // A json_schema without a schema: any object.
    assert_eq!(
        parse(Some(
            json!({"type": "json_schema", "json_schema": {"name": "any"}})
        )),
        OutputFormat::JsonObject
    );
    // Completions have no response_format.
    let completion = parse_completion(br#"{"prompt": "x"}"#).unwrap();
    assert_eq!(completion.format, OutputFormat::Text);
}

fn weather_tool() -> Value {
    json!({"type": "function", "function": {
        "name": "get_weather",
        "description": "The weather in a city",
        "parameters": {"type": "object",
                       "properties": {"city": {"type": "string"},
                                      "unit": {"enum": ["celsius", "fahrenheit"]}},
                       "required": ["city"]},
        "strict": true,
    }})
}

fn with(extra: Value) -> Value {
    let mut body = json!({"messages": user("weather in Oslo?")});
    body.as_object_mut()
        .unwrap()
        .extend(extra.as_object().unwrap().clone());
    body
}

/// The parts of a `ChatWithTools` input.
fn tools_input(parsed: ParsedRequest) -> (Vec<ToolChatMessage>, Vec<ToolSpec>, ToolChoice, bool) {
    match parsed.generate.input {
        PromptInput::ChatWithTools {
            messages,
            tools,
            choice,
            parallel,
        } => (messages, tools, choice, parallel),
        other => panic!("expected a chat with tools, got {other:?}"),
    }
}

#[test]
fn tools_make_a_chat_with_tools() {
    let parsed = chat(with(json!({
        "tools": [weather_tool(), {"type": "function", "function": {"name": "ping"}}],
    })))
    .unwrap();
    assert_eq!(parsed.format, OutputFormat::Text);
    let (messages, tools, choice, parallel) = tools_input(parsed);
    assert_eq!(messages, [ToolChatMessage::new("user", "weather in Oslo?")]);
    assert_eq!(
        tools[0],
        ToolSpec {
            name: "get_weather".into(),
            description: "The weather in a city".into(),
            // Compact, in the order written.
            parameters: r#"{"type":"object","properties":{"city":{"type":"string"},"unit":{"enum":["celsius","fahrenheit"]}},"required":["city"]}"#.into(),
            strict: true,
        }
    );
    // Only a name: no description, any object, not strict.
    assert_eq!(
        tools[1],
        ToolSpec {
            name: "ping".into(),
            description: String::new(),
            parameters: String::new(),
            strict: false,
        }
    );
    // OpenAI's defaults.
    assert_eq!((choice, parallel), (ToolChoice::Auto, true));
}

#[test]
fn tool_choice_and_parallel_calls_are_carried_over() {
    let cases = [
        (json!("none"), ToolChoice::None),
        (json!("auto"), ToolChoice::Auto),
        (json!("required"), ToolChoice::Required),
        (
            json!({"type": "function", "function": {"name": "get_weather"}}),
            ToolChoice::Function("get_weather".into()),
        ),
        // null is no choice.
        (Value::Null, ToolChoice::Auto),
    ];
    for (tool_choice, expected) in cases {
        let body = with(json!({
            "tools": [weather_tool()], "tool_choice": tool_choice, "parallel_tool_calls": false,
        }));
        let (_, _, choice, parallel) = tools_input(chat(body.clone()).unwrap());
        assert_eq!(choice, expected, "{body}");
        assert!(!parallel);
    }
}

#[test]
fn chats_without_tools_stay_plain_chats() {
    // What older daemons understand: empty tools and a lone parallel_tool_calls change
    // nothing.
    for extra in [
        json!({}),
        json!({"tools": []}),
        json!({"parallel_tool_calls": false}),
        json!({"tools": null, "tool_choice": null}),
    ] {
        let parsed = chat(with(extra.clone())).unwrap();
        assert_eq!(
            parsed.generate.input,
            PromptInput::Chat {
                messages: vec![ChatMessage::new("user", "weather in Oslo?")]
            },
            "{extra}"
        );
    }
}

#[test]
fn earlier_calls_and_their_results_make_a_chat_with_tools() {
    let body = json!({"messages": [
        {"role": "user", "content": "weather in Oslo?"},
        {"role": "assistant", "content": null, "tool_calls": [
            {"id": "call_1", "type": "function",
             "function": {"name": "get_weather", "arguments": "{\"city\": \"Oslo\"}"}},
            // Some clients leave the type out, or write an argument-less call as "".
            {"id": "call_2", "function": {"name": "ping", "arguments": ""}},
        ]},
        {"role": "tool", "tool_call_id": "call_1",
         "content": [{"type": "text", "text": "12"}, {"type": "text", "text": "C"}]},
        {"role": "tool", "tool_call_id": "call_2", "content": "pong"},
    ]});
    let (messages, tools, choice, parallel) = tools_input(chat(body).unwrap());
    // Nothing to call without tools.
    assert!(tools.is_empty());
    assert_eq!((choice, parallel), (ToolChoice::None, true));
    assert_eq!(
        messages[1],
        ToolChatMessage {
            role: "assistant".into(),
            content: None,
            tool_calls: vec![
                ToolCall {
                    id: "call_1".into(),
                    name: "get_weather".into(),
                    arguments: "{\"city\": \"Oslo\"}".into(),
                },
                ToolCall {
                    id: "call_2".into(),
                    name: "ping".into(),
                    arguments: "{}".into(),
                },
            ],
            tool_call_id: None,
        }
    );
    assert_eq!(
        messages[2],
        ToolChatMessage {
            tool_call_id: Some("call_1".into()),
            ..ToolChatMessage::new("tool", "12\nC")
        }
    );
    assert_eq!(messages[3].tool_call_id.as_deref(), Some("call_2"));
    // A tool message alone is enough, and a stray tool_call_id elsewhere is dropped.
    let body = json!({"messages": [
        {"role": "user", "content": "x", "tool_call_id": "call_9"},
        {"role": "tool", "tool_call_id": "call_9", "content": "y"},
    ]});
    let (messages, _, _, _) = tools_input(chat(body).unwrap());
    assert_eq!(messages[0], ToolChatMessage::new("user", "x"));
}

#[test]
fn bad_tools_are_refused_naming_the_param() {
    let tool = |function: Value| json!({"type": "function", "function": function});
    let many: Vec<Value> = (0..129)
        .map(|i| tool(json!({"name": format!("f{i}")})))
        .collect();
    let cases = [
        (
            json!({"tools": [{"type": "custom", "custom": {"name": "x"}}]}),
            "tools[0].type",
        ),
        (
            json!({"tools": [{"function": {"name": "x"}}]}),
            "tools[0].type",
        ),
        (json!({"tools": "get_weather"}), "tools"),
        (
            json!({"tools": [tool(json!({"name": 5}))]}),
            "tools[0].function.name",
        ),
        (
            json!({"tools": [tool(json!({"description": "x"}))]}),
            "tools[0].function.name",
        ),
        (
            json!({"tools": [tool(json!({"name": ""}))]}),
            "tools[0].function.name",
        ),
        (
            json!({"tools": [tool(json!({"name": "get weather"}))]}),
            "tools[0].function.name",
        ),
        (
            json!({"tools": [tool(json!({"name": "a".repeat(65)}))]}),
            "tools[0].function.name",
        ),
        (
            json!({"tools": [weather_tool(), weather_tool()]}),
            "tools[1].function.name",
        ),
        (
            json!({"tools": [tool(json!({"name": "f", "parameters": [1]}))]}),
            "tools[0].function.parameters",
        ),
        (
            json!({"tools": [tool(json!({"name": "f", "parameters": "{}"}))]}),
            "tools[0].function.parameters",
        ),
        (
            json!({"tools": [tool(json!({"name": "f", "strict": "yes"}))]}),
            "tools[0].function.strict",
        ),
        (json!({"tools": many}), "tools"),
        (json!({"tool_choice": "auto"}), "tool_choice"),
        (json!({"tools": [], "tool_choice": "none"}), "tool_choice"),
        (
            json!({"tools": [weather_tool()], "tool_choice": "sometimes"}),
            "tool_choice",
        ),
        (
            json!({"tools": [weather_tool()], "tool_choice": 1}),
            "tool_choice",
        ),
        (
            json!({"tools": [weather_tool()],
                   "tool_choice": {"type": "function", "function": {"name": "get_time"}}}),
            "tool_choice.function.name",
        ),
        (
            json!({"tools": [weather_tool()], "tool_choice": {"type": "function"}}),
            "tool_choice.function.name",
        ),
        (
            json!({"tools": [weather_tool()],
                   "tool_choice": {"type": "allowed_tools", "allowed_tools": {}}}),
            "tool_choice.type",
        ),
        (
            json!({"tools": [weather_tool()], "parallel_tool_calls": "yes"}),
            "parallel_tool_calls",
        ),
        (
            json!({"tools": [weather_tool()], "response_format": {"type": "json_object"}}),
            "response_format",
        ),
    ];
    for (extra, param) in cases {
        let body = with(extra);
        let err = chat(body.clone()).expect_err("should be refused");
        assert_eq!(err.status, 400, "{body}");
        assert_eq!(err.param.as_deref(), Some(param), "{body}: {}", err.message);
    }
}

#[test]
fn bad_tool_history_is_refused_naming_the_param() {
    let assistant = |calls: Value| {
        json!({"messages": [
            {"role": "user", "content": "x"},
            {"role": "assistant", "content": null, "tool_calls": calls},
        ]})
    };
    let call = |function: Value| json!({"id": "c", "type": "function", "function": function});
    let args = |arguments: Value| call(json!({"name": "f", "arguments": arguments}));
    let many: Vec<Value> = (0..129).map(|_| args(json!("{}"))).collect();
    let cases = [
        (
            json!({"messages": [{"role": "tool", "content": "12 C"}]}),
            "messages[0].tool_call_id",
        ),
        (
            json!({"messages": [{"role": "user", "content": "x",
                                  "tool_calls": [args(json!("{}"))]}]}),
            "messages[0].tool_calls",
        ),
        (assistant(json!("calls")), "messages[1].tool_calls"),
        (
            assistant(json!([{"type": "function",
                               "function": {"name": "f", "arguments": "{}"}}])),
            "messages[1].tool_calls[0].id",
        ),
        (
            assistant(json!([{"id": "c", "type": "custom",
                               "function": {"name": "f", "arguments": "{}"}}])),
            "messages[1].tool_calls[0].type",
        ),
        (
            assistant(json!([call(json!({"arguments": "{}"}))])),
            "messages[1].tool_calls[0].function.name",
        ),
        (
            assistant(json!([args(json!({"city": "Oslo"}))])),
            "messages[1].tool_calls[0].function.arguments",
        ),
        (
            assistant(json!([args(json!("{\"city\": "))])),
            "messages[1].tool_calls[0].function.arguments",
        ),
        (
            assistant(json!([args(json!("[1, 2]"))])),
            "messages[1].tool_calls[0].function.arguments",
        ),
        (assistant(json!(many)), "messages[1].tool_calls"),
    ];
    for (body, param) in cases {
        let err = chat(body.clone()).expect_err("should be refused");
        assert_eq!(err.status, 400, "{body}");
        assert_eq!(err.param.as_deref(), Some(param), "{body}: {}", err.message);
    }
    // A conversation with calls answers in text: no JSON output.
    let mut body = assistant(json!([args(json!("{}"))]));
    body["response_format"] = json!({"type": "json_object"});
    assert_eq!(param_of(chat(body)).as_deref(), Some("response_format"));
}

#[test]
fn refusals_of_arguments_do_not_repeat_them() {
    let body = json!({"messages": [
        {"role": "assistant", "tool_calls": [{"id": "c", "type": "function",
         "function": {"name": "f", "arguments": "{\"password\": \"hunter2\""}}]},
    ]});
    let err = chat(body).expect_err("should be refused");
    assert!(!err.message.contains("hunter2"), "{}", err.message);
}

#[test]
fn chat_template_kwargs_become_the_template_variables_option() {
    let with =
        |kwargs: Value| chat(json!({"messages": user("hi"), "chat_template_kwargs": kwargs}));
    let parsed = with(json!({"enable_thinking": false, "effort": {"level": "low"}})).unwrap();
    let [GenerateOption::TemplateVariables(json)] = parsed.options.as_slice() else {
        panic!("{:?}", parsed.options);
    };
    let vars: Value = serde_json::from_str(json).unwrap();
    assert_eq!(
        vars,
        json!({"enable_thinking": false, "effort": {"level": "low"}})
    );
    // The input itself stays a plain chat.
    assert!(matches!(parsed.generate.input, PromptInput::Chat { .. }));
    // Nothing to pass: no option at all (older daemons still take the request).
    for none in [Value::Null, json!({})] {
        assert!(with(none).unwrap().options.is_empty());
    }
    assert!(chat(json!({"messages": user("hi")}))
        .unwrap()
        .options
        .is_empty());
    for bad in [json!(true), json!("enable_thinking"), json!([1])] {
        assert_eq!(param_of(with(bad)).as_deref(), Some("chat_template_kwargs"));
    }
    let huge = json!({"x": "a".repeat(crate::limits::MAX_TEMPLATE_VARIABLES_BYTES)});
    assert_eq!(
        param_of(with(huge)).as_deref(),
        Some("chat_template_kwargs")
    );
}

#[test]
fn reasoning_effort_becomes_the_template_variable_of_that_name() {
    let vars_of = |body: Value| -> Value {
        let parsed = chat(body).unwrap();
        match parsed.options.as_slice() {
            [GenerateOption::TemplateVariables(json)] => serde_json::from_str(json).unwrap(),
            [] => Value::Null,
            other => panic!("{other:?}"),
        }
    };
    assert_eq!(
        vars_of(json!({"messages": user("hi"), "reasoning_effort": "high"})),
        json!({"reasoning_effort": "high"})
    );
    // Beside other variables; the object's own value wins.
    assert_eq!(
        vars_of(json!({"messages": user("hi"), "reasoning_effort": "low",
                       "chat_template_kwargs": {"enable_thinking": true}})),
        json!({"reasoning_effort": "low", "enable_thinking": true})
    );
    assert_eq!(
        vars_of(json!({"messages": user("hi"), "reasoning_effort": "low",
                       "chat_template_kwargs": {"reasoning_effort": "high"}})),
        json!({"reasoning_effort": "high"})
    );
    assert_eq!(
        vars_of(json!({"messages": user("hi"), "reasoning_effort": null})),
        Value::Null
    );
    for bad in [json!("extreme"), json!(3), json!("")] {
        let body = json!({"messages": user("hi"), "reasoning_effort": bad});
        assert_eq!(param_of(chat(body)).as_deref(), Some("reasoning_effort"));
    }
}
