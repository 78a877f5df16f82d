//! The conversation of a chat with tools, as a chat template takes it.
//!
//! A template that knows tool calls ([`TemplateTools::Native`], in either syntax) gets
//! the messages as
//! Hugging Face's `apply_chat_template` passes them: assistant messages with
//! `tool_calls` (`{id, type, function: {name, arguments}}`, arguments as a JSON value),
//! `tool` messages with `tool_call_id`, and `tools` as OpenAI-style function objects. Any
//! other template gets plain messages: the tools are described in the system message,
//! earlier calls are written into their assistant messages in the call syntax, and tool
//! results become user messages wrapped in `<tool_response>` tags.

use serde_json::{json, Map, Value};
use spark_client::protocol::{ToolCall, ToolChatMessage, ToolSpec};

use super::{CallSyntax, CALL_CLOSE, CALL_OPEN};

/// How a chat template deals with tools.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TemplateTools {
    /// It renders `tools` and tool calls itself, in this syntax.
    Native(CallSyntax),
    /// It knows nothing of them: they are described in a system message (and calls
    /// written in the Hermes syntax).
    Described,
}

impl TemplateTools {
    /// Reads a template's source: native Hermes when it writes the call tag and takes
    /// `tools`; native Llama when it takes `tools` and writes a call as `"name"` and
    /// `"parameters"` (Llama 3.1 to 3.3, whose results come back as `ipython`).
    pub fn of_template(source: &str) -> Self {
        if !source.contains("tools") {
            TemplateTools::Described
        } else if source.contains(CALL_OPEN) {
            TemplateTools::Native(CallSyntax::Hermes)
        } else if source.contains("\"parameters\": ") && source.contains("ipython") {
            TemplateTools::Native(CallSyntax::LlamaJson)
        } else {
            TemplateTools::Described
        }
    }

    /// Whether `rendered`, a template's rendering of a history that called `name`
    /// with `{"probe": 1}`, wrote that call as the Hermes syntax does: the tag, then
    /// the call as one JSON object with `name` and `arguments`. Templates that write
    /// `<tool_call>` around another syntax (Qwen3-Coder's `<function=...>`, GLM's
    /// `<arg_key>`) fail this, and their models would be held to the wrong one.
    pub fn writes_hermes_calls(rendered: &str, name: &str) -> bool {
        rendered.match_indices(CALL_OPEN).any(|(at, tag)| {
            let rest = rendered[at + tag.len()..].trim_start();
            let Some(Ok(Value::Object(call))) = serde_json::Deserializer::from_str(rest)
                .into_iter::<Value>()
                .next()
            else {
                return false;
            };
            call.get("name").and_then(Value::as_str) == Some(name)
                && call.get("arguments") == Some(&json!({"probe": 1}))
        })
    }

    /// The syntax the model is to write calls in.
    pub fn syntax(self) -> CallSyntax {
        match self {
            TemplateTools::Native(syntax) => syntax,
            TemplateTools::Described => CallSyntax::Hermes,
        }
    }
}

/// The template's inputs: `messages`, and `tools` when it is given them.
#[derive(Debug, Clone, PartialEq)]
pub struct TemplateInputs {
    pub messages: Vec<Value>,
    pub tools: Option<Vec<Value>>,
}

/// The inputs for `messages` with `tools` shown to the model when `show_tools`
/// (`tool_choice: none` hides them; the history's calls are rendered either way).
pub fn template_inputs(
    how: TemplateTools,
    messages: &[ToolChatMessage],
    tools: &[ToolSpec],
    show_tools: bool,
) -> TemplateInputs {
    let shown: Vec<Value> = if show_tools {
        tools.iter().map(function_object).collect()
    } else {
        Vec::new()
    };
    match how {
        TemplateTools::Native(_) => TemplateInputs {
            messages: messages.iter().map(native_message).collect(),
            tools: (!shown.is_empty()).then_some(shown),
        },
        TemplateTools::Described => TemplateInputs {
            messages: described_messages(messages, &shown),
            tools: None,
        },
    }
}

/// A tool as OpenAI's API and Hugging Face templates write it.
fn function_object(tool: &ToolSpec) -> Value {
    let parameters = serde_json::from_str::<Value>(&tool.parameters)
        .ok()
        .filter(Value::is_object)
        .unwrap_or_else(|| json!({"type": "object", "properties": {}}));
    let mut function = Map::new();
    function.insert("name".into(), Value::String(tool.name.clone()));
    // Always there, empty when the caller gave none, as transformers' `get_json_schema`
    // writes it: Hermes' templates concatenate it and fail on a missing one.
    function.insert(
        "description".into(),
        Value::String(tool.description.clone()),
    );
    function.insert("parameters".into(), parameters);
    json!({"type": "function", "function": function})
}

/// A call's arguments as a JSON value (templates write them with `tojson`); text that
/// is not JSON stays a string, which templates write as it is.
fn arguments_value(call: &ToolCall) -> Value {
    serde_json::from_str(&call.arguments).unwrap_or_else(|_| Value::String(call.arguments.clone()))
}

fn native_message(message: &ToolChatMessage) -> Value {
    let mut out = Map::new();
    out.insert("role".into(), Value::String(message.role.clone()));
    // Templates do string operations on `content` (`'</think>' in message.content`):
    // an assistant message that only calls tools gets an empty one, not null.
    out.insert(
        "content".into(),
        Value::String(message.content.clone().unwrap_or_default()),
    );
    if !message.tool_calls.is_empty() {
        let calls = message
            .tool_calls
            .iter()
            .map(|call| {
                json!({
                    "id": call.id,
                    "type": "function",
                    "function": {"name": call.name, "arguments": arguments_value(call)},
                })
            })
            .collect();
        out.insert("tool_calls".into(), Value::Array(calls));
    }
    if let Some(id) = &message.tool_call_id {
        out.insert("tool_call_id".into(), Value::String(id.clone()));
    }
    Value::Object(out)
}

/// Plain `{role, content}` messages: the tools described in the (first) system
/// message, calls written out, tool results as user messages.
fn described_messages(messages: &[ToolChatMessage], tools: &[Value]) -> Vec<Value> {
    let mut out: Vec<(String, String)> = Vec::with_capacity(messages.len() + 1);
    let mut rest = messages;
    if !tools.is_empty() {
        let description = describe_tools(tools);
        match messages.first() {
            Some(first) if first.role == "system" => {
                let own = first.content.as_deref().unwrap_or_default();
                out.push(("system".into(), format!("{own}\n\n{description}")));
                rest = &messages[1..];
            }
            _ => out.push(("system".into(), description)),
        }
    }
    for message in rest {
        let content = message.content.as_deref().unwrap_or_default();
        if message.role == "tool" {
            let response = format!("<tool_response>\n{content}\n</tool_response>");
            // Consecutive results share one user turn, as Hermes templates write them.
            match out.last_mut() {
                Some((role, text)) if role == "user" && text.ends_with("</tool_response>") => {
                    text.push('\n');
                    text.push_str(&response);
                }
                _ => out.push(("user".into(), response)),
            }
            continue;
        }
        let mut text = content.to_string();
        for call in &message.tool_calls {
            if !text.is_empty() {
                text.push('\n');
            }
            text.push_str(&call_text(call));
        }
        out.push((message.role.clone(), text));
    }
    out.into_iter()
        .map(|(role, content)| json!({"role": role, "content": content}))
        .collect()
}

/// A call as the model writes it.
pub fn call_text(call: &ToolCall) -> String {
    let body = json!({"name": call.name, "arguments": arguments_value(call)});
    format!("{CALL_OPEN}\n{body}\n{CALL_CLOSE}")
}

/// The system message's description of the tools and of the call syntax (the wording
/// of Qwen's template, which the Hermes syntax comes from).
fn describe_tools(tools: &[Value]) -> String {
    let mut text = String::from(
        "# Tools\n\nYou may call one or more functions to assist with the user query.\n\n\
         You are provided with function signatures within <tools></tools> XML tags:\n<tools>",
    );
    for tool in tools {
        text.push('\n');
        text.push_str(&tool.to_string());
    }
    text.push_str(
        "\n</tools>\n\nFor each function call, return a json object with function name and \
         arguments within <tool_call></tool_call> XML tags:\n<tool_call>\n\
         {\"name\": <function-name>, \"arguments\": <args-json-object>}\n</tool_call>",
    );
    text
}
