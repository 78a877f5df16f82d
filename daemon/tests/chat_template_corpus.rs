//! Every chat template llama.cpp tests its own Jinja against (70 models' templates:
//! Llama, Mistral, Gemma, Qwen, DeepSeek, Granite, Phi, GPT-OSS...), compiled and
//! rendered the way the daemon renders a request: a plain question, a conversation with
//! a system prompt, and a chat with tools and a tool result. What the caller wrote must
//! reach the prompt. `scripts/fetch-template-corpus.sh` fetches the templates (they are
//! the models' own and are not committed); without them the test says so and passes.

#[allow(dead_code)] // Only the corpus folder is needed here.
mod support;

use spark_client::protocol::{ToolCall, ToolChatMessage, ToolSpec};
use sparkd::text::ChatTemplate;

/// Templates that cannot render on their own, and why. Each needs what only its model's
/// own server gives it; the daemon reports the template's error to the caller.
const NEEDS_CALLER_VARIABLES: &[(&str, &str)] =
    &[("fireworks-ai-llama-3-firefunction-v2.jinja", "`functions`")];

const SYSTEM: &str = "Answer in one word.";
const QUESTION: &str = "Which city is the capital of Norway?";
const ANSWER: &str = "Oslo.";
const FOLLOW_UP: &str = "And of Sweden?";
const TOOL_RESULT: &str = "4 C, light rain";

fn message(role: &str, content: &str) -> ToolChatMessage {
    ToolChatMessage::new(role, content)
}

fn weather_tool() -> ToolSpec {
    ToolSpec {
        name: "get_weather".into(),
        description: "The weather in a city".into(),
        parameters:
            r#"{"type":"object","properties":{"city":{"type":"string"}},"required":["city"]}"#
                .into(),
        strict: false,
    }
}

/// A conversation, whether tools are offered, and the texts its prompt must hold.
struct Case {
    name: &'static str,
    messages: Vec<ToolChatMessage>,
    show_tools: bool,
    must_hold: Vec<&'static str>,
}

fn cases() -> Vec<Case> {
    let call = ToolCall {
        id: "call_Xk29mPq81LzT0aBcDeFgHiJk".into(),
        name: "get_weather".into(),
        arguments: r#"{"city": "Bergen"}"#.into(),
    };
    let calling = ToolChatMessage {
        role: "assistant".into(),
        content: None,
        tool_calls: vec![call.clone()],
        tool_call_id: None,
    };
    let result = ToolChatMessage {
        tool_call_id: Some(call.id.clone()),
        ..message("tool", TOOL_RESULT)
    };
    vec![
        Case {
            name: "one question",
            messages: vec![message("user", QUESTION)],
            show_tools: false,
            must_hold: vec![QUESTION],
        },
        Case {
            name: "a conversation with a system prompt",
            messages: vec![
                message("system", SYSTEM),
                message("user", QUESTION),
                message("assistant", ANSWER),
                message("user", FOLLOW_UP),
            ],
            show_tools: false,
            must_hold: vec![SYSTEM, QUESTION, ANSWER, FOLLOW_UP],
        },
        Case {
            name: "tools offered",
            messages: vec![
                message("system", SYSTEM),
                message("user", "Weather in Bergen?"),
            ],
            show_tools: true,
            must_hold: vec![
                SYSTEM,
                "Weather in Bergen?",
                "get_weather",
                "The weather in a city",
            ],
        },
        Case {
            name: "a call and its result",
            messages: vec![message("user", "Weather in Bergen?"), calling, result],
            show_tools: true,
            must_hold: vec!["Weather in Bergen?", "get_weather", "Bergen", TOOL_RESULT],
        },
    ]
}

#[test]
fn every_real_template_renders_what_the_caller_wrote() {
    let Some(dir) = support::template_corpus_dir() else {
        eprintln!(
            "skipping: no chat-template corpus (scripts/fetch-template-corpus.sh fetches it)"
        );
        return;
    };
    let mut paths: Vec<_> = std::fs::read_dir(&dir)
        .unwrap_or_else(|e| panic!("{}: {e}", dir.display()))
        .map(|entry| entry.expect("a folder entry").path())
        .filter(|p| p.extension().is_some_and(|e| e == "jinja"))
        .collect();
    paths.sort();
    assert!(
        paths.len() >= 50,
        "only {} templates in {}",
        paths.len(),
        dir.display()
    );
    let tools = [weather_tool()];
    let mut failures = Vec::new();
    for path in &paths {
        let file = path.file_name().unwrap().to_string_lossy().into_owned();
        let source = std::fs::read_to_string(path).expect("a template");
        let template = match ChatTemplate::new(&source) {
            Ok(t) => t,
            Err(e) => {
                failures.push(format!("{file}: {e}"));
                continue;
            }
        };
        let expected_failure = NEEDS_CALLER_VARIABLES.iter().find(|(f, _)| *f == file);
        for case in cases() {
            let rendered = template.render_tools(
                &case.messages,
                &tools,
                case.show_tools,
                true,
                ("<s>", "</s>"),
            );
            match (rendered, expected_failure) {
                (Err(e), Some((_, variable))) => assert!(
                    e.to_string().contains("undefined"),
                    "{file} ({}): expected to fail for want of {variable}, failed with {e}",
                    case.name
                ),
                (Ok(_), Some(_)) => failures.push(format!(
                    "{file} ({}): renders now; take it off NEEDS_CALLER_VARIABLES",
                    case.name
                )),
                (Err(e), None) => failures.push(format!("{file} ({}): {e}", case.name)),
                (Ok(text), None) => {
                    for wanted in &case.must_hold {
                        if !text.contains(wanted) {
                            failures.push(format!(
                                "{file} ({}): {wanted:?} is missing from\n{text}",
                                case.name
                            ));
                        }
                    }
                }
            }
        }
    }
    eprintln!("{} templates, {} cases each", paths.len(), cases().len());
    assert!(
        failures.is_empty(),
        "{} of {} templates failed:\n{}",
        failures.len(),
        paths.len(),
        failures.join("\n")
    );
}
