//! The conversation of a chat with tools, as a chat template takes it.
//!
//! A template that knows tool calls ([`TemplateTools::Native`], in either syntax) gets
//! the messages as
//! Hugging Face's `apply_chat_template` passes them: assistant messages with
//! `tool_calls` (`{id, type, function: {name, arguments}}`, arguments as a JSON value),
//! `tool` messages with `tool_call_id`, and `tools` as OpenAI-style function objects (in
//! the Mistral syntax, with every call id as nine letters and digits: Mistral's templates
//! refuse any other, so an id from elsewhere is mapped to one, the same in the call and
//! in its result). Any
//! other template gets plain messages: the tools are described in the system message,
//! earlier calls are written into their assistant messages in the call syntax, and tool
//! results become user messages wrapped in `<tool_response>` tags.

use serde_json::{json, Map, Value};
use spark_client::protocol::{ToolCall, ToolChatMessage, ToolSpec};

use super::header::{ARGS, CALL_ID};
use super::{CallSyntax, CALL_CLOSE, CALL_OPEN, MISTRAL_CALLS, MISTRAL_ID_LEN};

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
    /// `tools`; native Mistral when it writes `[TOOL_CALLS]`, in the `[ARGS]` syntax
    /// when it writes that tag too (with ids when it writes `[CALL_ID]`); native Llama
    /// when it takes `tools` and writes a call as `"name"` and `"parameters"` (Llama 3.1
    /// to 3.3, whose results come back as `ipython`).
    pub fn of_template(source: &str) -> Self {
        if !source.contains("tools") {
            TemplateTools::Described
        } else if source.contains(CALL_OPEN) {
            TemplateTools::Native(CallSyntax::Hermes)
        } else if source.contains(MISTRAL_CALLS) {
            if source.contains(ARGS) {
                TemplateTools::Native(CallSyntax::MistralArgs {
                    call_ids: source.contains(CALL_ID),
                })
            } else {
                TemplateTools::Native(CallSyntax::Mistral)
            }
        } else if source.contains("\"parameters\": ") && source.contains("ipython") {
            TemplateTools::Native(CallSyntax::LlamaJson)
        } else {
            TemplateTools::Described
        }
    }

    /// Whether `rendered`, a template's rendering of a history that called `name`
    /// with `{"probe": 1}`, wrote that call as `syntax` does: the tag, then the call as
    /// one JSON object with `name` and `arguments` (Hermes), an array of such objects
    /// (Mistral), or the name, any id, `[ARGS]` and the arguments (Mistral's `[ARGS]`
    /// syntax). Templates that write `<tool_call>` around another syntax
    /// (Qwen3-Coder's `<function=...>`, GLM's `<arg_key>`) fail this, and their models
    /// would be held to the wrong one. The Llama syntax is not probed.
    pub fn writes_calls(syntax: CallSyntax, rendered: &str, name: &str) -> bool {
        let Some(open) = syntax.open_tag() else {
            return true;
        };
        let is_probe = |call: &Value| {
            call.get("name").and_then(Value::as_str) == Some(name)
                && call.get("arguments") == Some(&json!({"probe": 1}))
        };
        rendered.match_indices(open).any(|(at, tag)| {
            let mut rest = rendered[at + tag.len()..].trim_start();
            if let CallSyntax::MistralArgs { call_ids } = syntax {
                let Some(after_name) = rest.strip_prefix(name) else {
                    return false;
                };
                rest = after_name;
                if call_ids {
                    let Some(id) = rest.strip_prefix(CALL_ID) else {
                        return false;
                    };
                    rest = id.get(MISTRAL_ID_LEN..).unwrap_or_default();
                }
                let Some(arguments) = rest.strip_prefix(ARGS) else {
                    return false;
                };
                rest = arguments;
            }
            let Some(Ok(value)) = serde_json::Deserializer::from_str(rest)
                .into_iter::<Value>()
                .next()
            else {
                return false;
            };
            match (syntax, &value) {
                (CallSyntax::Mistral, Value::Array(calls)) => calls.first().is_some_and(is_probe),
                (CallSyntax::Hermes, Value::Object(_)) => is_probe(&value),
                (CallSyntax::MistralArgs { .. }, _) => value == json!({"probe": 1}),
                _ => false,
            }
        })
    }

    /// How tools reach the model, as `ChatFormatReport::tools` names it.
    pub fn name(self) -> &'static str {
        match self {
            TemplateTools::Native(syntax) => syntax.name(),
            TemplateTools::Described => "described",
        }
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
        TemplateTools::Native(syntax) => TemplateInputs {
            messages: messages.iter().map(|m| native_message(m, syntax)).collect(),
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

fn native_message(message: &ToolChatMessage, syntax: CallSyntax) -> Value {
    let id = |id: &str| {
        if syntax.nine_character_ids() {
            mistral_call_id(id)
        } else {
            id.to_string()
        }
    };
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
                    "id": id(&call.id),
                    "type": "function",
                    "function": {"name": call.name, "arguments": arguments_value(call)},
                })
            })
            .collect();
        out.insert("tool_calls".into(), Value::Array(calls));
    }
    if let Some(call_id) = &message.tool_call_id {
        out.insert("tool_call_id".into(), Value::String(id(call_id)));
    }
    Value::Object(out)
}

/// A call id as Mistral's templates take it: nine ASCII letters and digits. Such an id
/// (sparkd's own for these models) stays as it is; any other becomes nine base-62
/// digits of its FNV-1a hash, so a call and its result still name the same id.
pub fn mistral_call_id(id: &str) -> String {
    if id.len() == MISTRAL_ID_LEN && id.bytes().all(|b| b.is_ascii_alphanumeric()) {
        return id.to_string();
    }
    const DIGITS: &[u8; 62] = b"0123456789ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz";
    let mut hash = id.bytes().fold(0xcbf2_9ce4_8422_2325u64, |h, b| {
        (h ^ u64::from(b)).wrapping_mul(0x0000_0100_0000_01b3)
    });
    (0..MISTRAL_ID_LEN)
        .map(|_| {
            let digit = DIGITS[(hash % 62) as usize];
            hash /= 62;
            char::from(digit)
        })
        .collect()
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
