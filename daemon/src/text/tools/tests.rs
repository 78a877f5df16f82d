use serde_json::json;
use spark_client::protocol::{ToolCall, ToolChatMessage, ToolChoice, ToolSpec};

use super::prompt::{template_inputs, TemplateInputs, TemplateTools};
use super::CallSyntax;
use super::*;
use crate::text::constraint::JsonConstraint;

fn tool(name: &str, parameters: serde_json::Value, strict: bool) -> ToolSpec {
    ToolSpec {
        name: name.into(),
        description: format!("the {name} tool"),
        parameters: parameters.to_string(),
        strict,
    }
}

fn accepts(set: &ToolSet, text: &str) -> bool {
    let CallGrammar::Json(schema) = &set.grammar else {
        panic!("the {:?} syntax has no schema for a whole call", set.syntax);
    };
    let mut c = match set.syntax {
        CallSyntax::Mistral => JsonConstraint::array_after_whitespace(schema.clone()),
        _ => JsonConstraint::after_whitespace(schema.clone()),
    };
    c.accept(text.as_bytes()) && c.is_done()
}

#[test]
fn names_follow_openai_rules_and_are_unique() {
    let ok = tool("a-b_9", json!({}), false);
    assert!(ToolSet::prepare(
        std::slice::from_ref(&ok),
        &ToolChoice::Auto,
        true,
        CallSyntax::Hermes
    )
    .is_ok());
    for bad in ["", "has space", "ü", &"x".repeat(65)] {
        let err = ToolSet::prepare(
            &[tool(bad, json!({}), false)],
            &ToolChoice::Auto,
            true,
            CallSyntax::Hermes,
        )
        .unwrap_err();
        assert!(
            matches!(err, ToolError::BadName { index: 0, .. }),
            "{bad}: {err}"
        );
    }
    let err = ToolSet::prepare(
        &[ok.clone(), ok],
        &ToolChoice::Auto,
        true,
        CallSyntax::Hermes,
    )
    .unwrap_err();
    assert_eq!(err.to_string(), "tools[1].name: `a-b_9` is offered twice");
}

#[test]
fn choices_decide_whether_and_what_may_be_called() {
    let tools = [
        tool("a", json!({"type": "object"}), false),
        tool("b", json!({"type": "object"}), false),
    ];
    assert!(
        ToolSet::prepare(&tools, &ToolChoice::None, true, CallSyntax::Hermes)
            .unwrap()
            .is_none()
    );
    assert!(
        ToolSet::prepare(&[], &ToolChoice::Auto, true, CallSyntax::Hermes)
            .unwrap()
            .is_none()
    );
    assert_eq!(
        ToolSet::prepare(&[], &ToolChoice::Required, true, CallSyntax::Hermes).unwrap_err(),
        ToolError::NothingToCall
    );
    assert_eq!(
        ToolSet::prepare(
            &tools,
            &ToolChoice::Function("c".into()),
            true,
            CallSyntax::Hermes
        )
        .unwrap_err(),
        ToolError::UnknownChoice("c".into())
    );
    let auto = ToolSet::prepare(&tools, &ToolChoice::Auto, true, CallSyntax::Hermes)
        .unwrap()
        .unwrap();
    assert_eq!(auto.mode, CallMode::Auto);
    assert!(accepts(&auto, r#"{"name": "a", "arguments": {}}"#));
    assert!(accepts(&auto, r#"{"name": "b", "arguments": {"x": 1}}"#));
    assert!(!accepts(&auto, r#"{"name": "c", "arguments": {}}"#));
    let named = ToolSet::prepare(
        &tools,
        &ToolChoice::Function("b".into()),
        false,
        CallSyntax::Hermes,
    )
    .unwrap()
    .unwrap();
    assert_eq!(named.mode, CallMode::Forced);
    assert!(!named.parallel);
    assert!(accepts(&named, r#"{"name": "b", "arguments": {}}"#));
    assert!(!accepts(&named, r#"{"name": "a", "arguments": {}}"#));
}

#[test]
fn arguments_follow_each_tools_schema_refs_included() {
    // A Pydantic-style schema: its `$ref`s point into its own `$defs`.
    let order = json!({
        "type": "object",
        "$defs": {"Size": {"enum": ["S", "M", "L"]}},
        "properties": {"size": {"$ref": "#/$defs/Size"}, "count": {"type": "integer", "minimum": 1}},
        "required": ["size", "count"],
        "additionalProperties": false,
    });
    let tools = [
        tool("order", order, true),
        tool("ping", json!({"type": "object", "properties": {}}), false),
    ];
    let set = ToolSet::prepare(&tools, &ToolChoice::Auto, true, CallSyntax::Hermes)
        .unwrap()
        .unwrap();
    assert!(accepts(
        &set,
        r#"{"name": "order", "arguments": {"size": "M", "count": 2}}"#
    ));
    assert!(!accepts(
        &set,
        r#"{"name": "order", "arguments": {"size": "XL", "count": 2}}"#
    ));
    assert!(!accepts(
        &set,
        r#"{"name": "order", "arguments": {"size": "M", "count": 0}}"#
    ));
    assert!(accepts(&set, r#"{"name": "ping", "arguments": {}}"#));
    assert!(
        accepts(&set, "\n  {\"name\": \"ping\", \"arguments\": {}}"),
        "a newline after the tag"
    );
}

#[test]
fn an_unenforceable_schema_is_refused_only_for_strict_tools() {
    let pattern = json!({"type": "object", "properties": {"zip": {"type": "string", "not": {"const": "00000"}}}});
    let err = ToolSet::prepare(
        &[tool("f", pattern.clone(), true)],
        &ToolChoice::Auto,
        true,
        CallSyntax::Hermes,
    )
    .unwrap_err();
    let message = err.to_string();
    assert!(
        message.starts_with("tools[0] (`f`).parameters: JSON schema at #/properties/zip"),
        "{message}"
    );
    assert!(message.contains("`not`"), "{message}");
    // Not strict: any object, as OpenAI does not hold such tools to their schemas.
    let loose = ToolSet::prepare(
        &[tool("f", pattern, false)],
        &ToolChoice::Auto,
        true,
        CallSyntax::Hermes,
    )
    .unwrap()
    .unwrap();
    assert!(accepts(
        &loose,
        r#"{"name": "f", "arguments": {"zip": "abc", "n": [1]}}"#
    ));
    assert!(!accepts(&loose, r#"{"name": "f", "arguments": 3}"#));
    for bad in ["[1]", "{not json"] {
        let spec = ToolSpec {
            parameters: bad.into(),
            ..tool("f", json!({}), false)
        };
        assert!(matches!(
            ToolSet::prepare(&[spec], &ToolChoice::Auto, true, CallSyntax::Hermes),
            Err(ToolError::BadParameters { .. })
        ));
    }
}

fn history() -> Vec<ToolChatMessage> {
    vec![
        ToolChatMessage::new("system", "Be brief."),
        ToolChatMessage::new("user", "Weather in Oslo?"),
        ToolChatMessage {
            role: "assistant".into(),
            content: None,
            tool_calls: vec![ToolCall {
                id: "call_1".into(),
                name: "get_weather".into(),
                arguments: r#"{"city":"Oslo"}"#.into(),
            }],
            tool_call_id: None,
        },
        ToolChatMessage {
            tool_call_id: Some("call_1".into()),
            ..ToolChatMessage::new("tool", "4 °C, rain")
        },
        ToolChatMessage {
            tool_call_id: Some("call_2".into()),
            ..ToolChatMessage::new("tool", "wind 5 m/s")
        },
    ]
}

#[test]
fn native_templates_get_tools_and_calls_as_data() {
    let tools = [tool("get_weather", json!({"type": "object"}), false)];
    let TemplateInputs { messages, tools } = template_inputs(
        TemplateTools::Native(CallSyntax::Hermes),
        &history(),
        &tools,
        true,
    );
    assert_eq!(
        tools.unwrap()[0],
        json!({"type": "function", "function": {"name": "get_weather", "description": "the get_weather tool", "parameters": {"type": "object"}}})
    );
    assert_eq!(
        messages[2],
        json!({"role": "assistant", "content": "", "tool_calls": [{"id": "call_1", "type": "function", "function": {"name": "get_weather", "arguments": {"city": "Oslo"}}}]})
    );
    assert_eq!(
        messages[3],
        json!({"role": "tool", "content": "4 °C, rain", "tool_call_id": "call_1"})
    );
}

#[test]
fn other_templates_get_the_tools_described_and_calls_written_out() {
    let tools = [tool("get_weather", json!({"type": "object"}), false)];
    let TemplateInputs {
        messages,
        tools: none,
    } = template_inputs(TemplateTools::Described, &history(), &tools, true);
    assert!(none.is_none());
    let system = messages[0]["content"].as_str().unwrap();
    assert!(system.starts_with("Be brief.\n\n# Tools"), "{system}");
    assert!(system.contains(r#"{"type":"function","function":{"name":"get_weather""#));
    assert!(system.contains("<tool_call>\n{\"name\": <function-name>"));
    assert_eq!(
        messages[2],
        json!({"role": "assistant", "content": "<tool_call>\n{\"name\":\"get_weather\",\"arguments\":{\"city\":\"Oslo\"}}\n</tool_call>"})
    );
    assert_eq!(
        messages[3],
        json!({"role": "user", "content": "<tool_response>\n4 °C, rain\n</tool_response>\n<tool_response>\nwind 5 m/s\n</tool_response>"})
    );
    assert_eq!(messages.len(), 4);
    // Hidden tools (`tool_choice: none`): no description, the history still written.
    let hidden = template_inputs(TemplateTools::Described, &history(), &tools, false);
    assert_eq!(
        hidden.messages[0],
        json!({"role": "system", "content": "Be brief."})
    );
    assert_eq!(hidden.messages[2], messages[2]);
}

#[test]
fn templates_are_told_apart_by_their_call_syntax() {
    assert_eq!(
        TemplateTools::of_template("{% if tools %}<tool_call>{% endif %}"),
        TemplateTools::Native(CallSyntax::Hermes)
    );
    assert_eq!(
        TemplateTools::of_template("{% for m in messages %}{{ m.content }}{% endfor %}"),
        TemplateTools::Described
    );
    // Llama 3.1 to 3.3: calls as `{"name": ..., "parameters": ...}`, results as
    // `ipython` turns.
    let llama = r#"{% if tools is not none %}Respond in the format {"name": function name, "parameters": dictionary of argument name and its value}.{% endif %}{% if message.role == "ipython" %}{% endif %}"#;
    assert_eq!(
        TemplateTools::of_template(llama),
        TemplateTools::Native(CallSyntax::LlamaJson)
    );
    assert_eq!(
        TemplateTools::Native(CallSyntax::LlamaJson).syntax(),
        CallSyntax::LlamaJson
    );
    assert_eq!(TemplateTools::Described.syntax(), CallSyntax::Hermes);
}

#[test]
fn the_llama_syntax_writes_parameters_and_makes_one_call_an_answer() {
    let tools = [tool(
        "f",
        json!({"type": "object", "properties": {"x": {"type": "integer"}}}),
        true,
    )];
    let set = ToolSet::prepare(&tools, &ToolChoice::Auto, true, CallSyntax::LlamaJson)
        .unwrap()
        .unwrap();
    assert!(
        !set.parallel,
        "Llama templates refuse several calls in one turn"
    );
    assert!(accepts(&set, r#"{"name": "f", "parameters": {"x": 3}}"#));
    assert!(!accepts(&set, r#"{"name": "f", "arguments": {"x": 3}}"#));
}

#[test]
fn the_mistral_syntax_is_one_array_of_calls() {
    let tools = [
        tool(
            "f",
            json!({"type": "object", "properties": {"x": {"type": "integer"}}}),
            true,
        ),
        tool("g", json!({}), false),
    ];
    let one = ToolSet::prepare(&tools, &ToolChoice::Auto, false, CallSyntax::Mistral)
        .unwrap()
        .unwrap();
    assert!(accepts(&one, r#"[{"name": "f", "arguments": {"x": 3}}]"#));
    assert!(!accepts(&one, r#"[]"#), "at least one call");
    assert!(!accepts(&one, r#"{"name": "f", "arguments": {"x": 3}}"#));
    assert!(!accepts(
        &one,
        r#"[{"name": "f", "arguments": {"x": "3"}}]"#
    ));
    assert!(
        !accepts(
            &one,
            r#"[{"name": "f", "arguments": {}}, {"name": "g", "arguments": {}}]"#
        ),
        "one call unless parallel calls are allowed"
    );
    let many = ToolSet::prepare(&tools, &ToolChoice::Auto, true, CallSyntax::Mistral)
        .unwrap()
        .unwrap();
    assert!(many.parallel);
    assert!(accepts(
        &many,
        r#"[{"name": "f", "arguments": {}}, {"name": "g", "arguments": {"y": 1}}]"#
    ));
    let named = ToolSet::prepare(
        &tools,
        &ToolChoice::Function("g".into()),
        true,
        CallSyntax::Mistral,
    )
    .unwrap()
    .unwrap();
    assert!(!accepts(&named, r#"[{"name": "f", "arguments": {}}]"#));
    assert!(accepts(&named, r#"[{"name": "g", "arguments": {}}]"#));
}

#[test]
fn mistral_templates_get_nine_character_call_ids() {
    use super::prompt::mistral_call_id;
    assert_eq!(mistral_call_id("a1B2c3D4e"), "a1B2c3D4e");
    let mapped = mistral_call_id("call_1");
    assert_eq!(mapped.len(), 9);
    assert!(
        mapped.bytes().all(|b| b.is_ascii_alphanumeric()),
        "{mapped}"
    );
    assert_eq!(
        mistral_call_id("call_1"),
        mapped,
        "the same id maps the same way"
    );
    assert_ne!(mistral_call_id("call_2"), mapped);
    // Nine characters that are not all letters and digits are mapped too.
    assert_ne!(mistral_call_id("call-1234"), "call-1234");
    for _ in 0..20 {
        let own = CallSyntax::Mistral.new_call_id();
        assert_eq!(
            mistral_call_id(&own),
            own,
            "sparkd's own ids pass unchanged"
        );
    }
    assert!(CallSyntax::Hermes.new_call_id().starts_with("call_"));

    let tools = [tool("get_weather", json!({"type": "object"}), false)];
    let TemplateInputs { messages, .. } = template_inputs(
        TemplateTools::Native(CallSyntax::Mistral),
        &history(),
        &tools,
        true,
    );
    assert_eq!(messages[2]["tool_calls"][0]["id"], json!(mapped));
    assert_eq!(messages[3]["tool_call_id"], json!(mapped));
    assert_eq!(
        messages[4]["tool_call_id"],
        json!(mistral_call_id("call_2"))
    );
}

#[test]
fn mistral_templates_are_told_apart_by_their_tags() {
    let nemo = r#"{% if tools %}[AVAILABLE_TOOLS]{{ tools|tojson }}[/AVAILABLE_TOOLS]{% endif %}{{ "[TOOL_CALLS][" }}"#;
    assert_eq!(
        TemplateTools::of_template(nemo),
        TemplateTools::Native(CallSyntax::Mistral)
    );
    let devstral = r#"{% if tools %}{% endif %}{{ '[TOOL_CALLS]' + name + '[ARGS]' + args }}"#;
    assert_eq!(
        TemplateTools::of_template(devstral),
        TemplateTools::Native(CallSyntax::MistralArgs { call_ids: false })
    );
    let small = r#"{% if tools %}{% endif %}{{ '[TOOL_CALLS]' + name + '[CALL_ID]' + id + '[ARGS]' + args }}"#;
    assert_eq!(
        TemplateTools::of_template(small),
        TemplateTools::Native(CallSyntax::MistralArgs { call_ids: true })
    );
}

#[test]
fn the_args_syntax_holds_each_tools_arguments_to_its_own_schema() {
    let tools = [
        tool(
            "f",
            json!({"type": "object", "properties": {"x": {"type": "integer"}}, "required": ["x"]}),
            true,
        ),
        tool("g", json!({}), false),
    ];
    let syntax = CallSyntax::MistralArgs { call_ids: false };
    let set = ToolSet::prepare(&tools, &ToolChoice::Auto, true, syntax)
        .unwrap()
        .unwrap();
    let headed = |set: &ToolSet| match &set.grammar {
        CallGrammar::Headed { names, arguments } => (names.clone(), arguments.clone()),
        CallGrammar::Json(_) => panic!("the [ARGS] syntax is held by its header"),
    };
    let (names, arguments) = headed(&set);
    assert_eq!(&*names, ["f".to_string(), "g".to_string()]);
    let args = |i: usize, text: &str| {
        let mut c = JsonConstraint::after_whitespace(arguments[i].clone());
        c.accept(text.as_bytes()) && c.is_done()
    };
    assert!(args(0, r#"{"x": 1}"#));
    assert!(!args(0, r#"{}"#));
    assert!(args(1, r#"{"y": "z"}"#));
    let named = ToolSet::prepare(&tools, &ToolChoice::Function("g".into()), true, syntax)
        .unwrap()
        .unwrap();
    let (names, arguments) = headed(&named);
    assert_eq!(&*names, ["g".to_string()]);
    assert_eq!(arguments.len(), 1);
    assert_eq!(syntax.forced_prefix().as_deref(), Some("[TOOL_CALLS]"));
    assert!(syntax.nine_character_ids());
}
