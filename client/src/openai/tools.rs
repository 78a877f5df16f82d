//! OpenAI function calling: `tools`, `tool_choice` and the `tool_calls` of earlier
//! assistant messages, checked and turned into the protocol's `ToolSpec`, `ToolChoice`
//! and `ToolCall`. Shared by the HTTP shim and `spark run/chat --tools`.

use serde::Deserialize;
use serde_json::Value;

use super::request::failing_field;
use crate::limits::MAX_TOOLS;
use crate::protocol::{ToolCall, ToolChoice, ToolSpec};

/// OpenAI's limit on a function name's length.
const MAX_NAME_CHARS: usize = 64;

/// Tools or a tool choice that cannot be used. `param` is the path to the culprit
/// (`tools[2].function.name`), as in OpenAI's error `param`.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{param}: {message}")]
pub struct ToolError {
    pub param: String,
    pub message: String,
}

impl ToolError {
    fn new(param: impl Into<String>, message: impl Into<String>) -> Self {
        Self {
            param: param.into(),
            message: message.into(),
        }
    }
}

/// One entry of `tools`, as OpenAI writes it.
#[derive(Debug, Deserialize)]
pub(crate) struct ToolIn {
    #[serde(rename = "type")]
    kind: String,
    /// Absent for tool types other than `function`.
    function: Option<FunctionIn>,
}

#[derive(Debug, Deserialize)]
struct FunctionIn {
    name: String,
    description: Option<String>,
    parameters: Option<Value>,
    strict: Option<bool>,
}

/// One entry of an assistant message's `tool_calls`.
#[derive(Debug, Deserialize)]
pub(crate) struct ToolCallIn {
    id: String,
    /// OpenAI always writes `function`; some clients leave it out of the history.
    #[serde(rename = "type")]
    kind: Option<String>,
    function: FunctionCallIn,
}

#[derive(Debug, Deserialize)]
struct FunctionCallIn {
    name: String,
    arguments: String,
}

/// Reads a tools file: a JSON array of OpenAI tool definitions (`spark --tools`).
pub fn tools_from_json(text: &str) -> Result<Vec<ToolSpec>, ToolError> {
    let value: Value = serde_json::from_str(text)
        .map_err(|err| ToolError::new("tools", format!("not JSON: {err}")))?;
    if !value.is_array() {
        return Err(ToolError::new(
            "tools",
            "must be a JSON array of tool definitions",
        ));
    }
    let tools = serde_path_to_error::deserialize(&value).map_err(|err| {
        let (path, message) = failing_field(err);
        // The same paths as the request field's (`tools[1].function.name`).
        let param = match path.strip_prefix('.') {
            Some("") => "tools".to_string(),
            _ => format!("tools{path}"),
        };
        ToolError::new(param, message)
    })?;
    tool_specs(tools)
}

/// Checks a `tools` array: functions only, valid and unique names, object schemas.
pub(crate) fn tool_specs(tools: Vec<ToolIn>) -> Result<Vec<ToolSpec>, ToolError> {
    if tools.len() > MAX_TOOLS {
        return Err(ToolError::new(
            "tools",
            format!("at most {MAX_TOOLS} tools are supported"),
        ));
    }
    let mut specs: Vec<ToolSpec> = Vec::with_capacity(tools.len());
    for (i, tool) in tools.into_iter().enumerate() {
        let spec = tool_spec(i, tool)?;
        if specs.iter().any(|s| s.name == spec.name) {
            return Err(ToolError::new(
                format!("tools[{i}].function.name"),
                format!("the function name '{}' is used twice", spec.name),
            ));
        }
        specs.push(spec);
    }
    Ok(specs)
}

fn tool_spec(i: usize, tool: ToolIn) -> Result<ToolSpec, ToolError> {
    if tool.kind != "function" {
        return Err(ToolError::new(
            format!("tools[{i}].type"),
            format!(
                "tools of type '{}' are not supported (only 'function')",
                tool.kind
            ),
        ));
    }
    let Some(function) = tool.function else {
        return Err(ToolError::new(
            format!("tools[{i}].function"),
            "a tool of type 'function' needs a 'function' object",
        ));
    };
    check_name(&function.name, &format!("tools[{i}].function.name"))?;
    let parameters = match function.parameters {
        None => String::new(),
        Some(schema @ Value::Object(_)) => schema.to_string(),
        Some(_) => {
            return Err(ToolError::new(
                format!("tools[{i}].function.parameters"),
                "parameters must be a JSON Schema object",
            ))
        }
    };
    Ok(ToolSpec {
        name: function.name,
        description: function.description.unwrap_or_default(),
        parameters,
        strict: function.strict.unwrap_or(false),
    })
}

/// OpenAI's rule: 1 to 64 characters of `a-z`, `A-Z`, `0-9`, `_` and `-`.
fn check_name(name: &str, param: &str) -> Result<(), ToolError> {
    let allowed = |b: u8| b.is_ascii_alphanumeric() || b == b'_' || b == b'-';
    if (1..=MAX_NAME_CHARS).contains(&name.len()) && name.bytes().all(allowed) {
        Ok(())
    } else {
        Err(ToolError::new(
            param,
            format!(
                "a function name must be 1 to {MAX_NAME_CHARS} characters of a-z, A-Z, 0-9, '_' and '-'"
            ),
        ))
    }
}

/// `spark --tool-choice`: `none`, `auto`, `required`, or the name of one of `tools`.
pub fn choice_by_word(word: &str, tools: &[ToolSpec]) -> Result<ToolChoice, ToolError> {
    match choice_mode(word) {
        Some(choice) => Ok(choice),
        None => choice_of_function(word, tools, "tool_choice"),
    }
}

/// `none`, `auto` or `required`: OpenAI's words for a `tool_choice` as a string.
fn choice_mode(word: &str) -> Option<ToolChoice> {
    match word {
        "none" => Some(ToolChoice::None),
        "auto" => Some(ToolChoice::Auto),
        "required" => Some(ToolChoice::Required),
        _ => None,
    }
}

/// A choice of one function, which must be among `tools`.
fn choice_of_function(
    name: &str,
    tools: &[ToolSpec],
    param: &str,
) -> Result<ToolChoice, ToolError> {
    if tools.iter().any(|t| t.name == name) {
        Ok(ToolChoice::Function(name.to_string()))
    } else {
        Err(ToolError::new(
            param,
            format!("no tool named '{name}' is among the tools"),
        ))
    }
}

/// OpenAI's `tool_choice`: one of the mode words, or
/// `{"type": "function", "function": {"name": ...}}`. Only meaningful with tools.
pub(crate) fn tool_choice(value: &Value, tools: &[ToolSpec]) -> Result<ToolChoice, ToolError> {
    if tools.is_empty() {
        // OpenAI's own rule: a choice among no tools is a mistake.
        return Err(ToolError::new(
            "tool_choice",
            "tool_choice is only allowed when tools are given",
        ));
    }
    match value {
        Value::String(word) => choice_mode(word).ok_or_else(|| {
            ToolError::new(
                "tool_choice",
                "tool_choice must be 'none', 'auto', 'required' or a function object",
            )
        }),
        Value::Object(object) => {
            let kind = object.get("type").and_then(Value::as_str);
            if kind != Some("function") {
                return Err(ToolError::new(
                    "tool_choice.type",
                    "only a tool_choice of type 'function' is supported",
                ));
            }
            let name = object
                .get("function")
                .and_then(|f| f.get("name"))
                .and_then(Value::as_str)
                .ok_or_else(|| {
                    ToolError::new(
                        "tool_choice.function.name",
                        "a function tool_choice needs 'function.name'",
                    )
                })?;
            choice_of_function(name, tools, "tool_choice.function.name")
        }
        _ => Err(ToolError::new(
            "tool_choice",
            "tool_choice must be a string or an object",
        )),
    }
}

/// The calls of an earlier assistant message (`messages[m].tool_calls`).
pub(crate) fn tool_calls(
    message: usize,
    calls: Vec<ToolCallIn>,
) -> Result<Vec<ToolCall>, ToolError> {
    if calls.len() > MAX_TOOLS {
        return Err(ToolError::new(
            format!("messages[{message}].tool_calls"),
            format!("at most {MAX_TOOLS} tool calls per message are supported"),
        ));
    }
    calls
        .into_iter()
        .enumerate()
        .map(|(c, call)| tool_call(&format!("messages[{message}].tool_calls[{c}]"), call))
        .collect()
}

fn tool_call(param: &str, call: ToolCallIn) -> Result<ToolCall, ToolError> {
    if let Some(kind) = call.kind.as_deref().filter(|k| *k != "function") {
        return Err(ToolError::new(
            format!("{param}.type"),
            format!("tool calls of type '{kind}' are not supported (only 'function')"),
        ));
    }
    Ok(ToolCall {
        id: call.id,
        name: call.function.name,
        arguments: arguments(
            call.function.arguments,
            &format!("{param}.function.arguments"),
        )?,
    })
}

/// A call's arguments: the text of one JSON object, which the daemon hands to the chat
/// template. Some clients write an argument-less call as `""`; that is `{}`.
fn arguments(text: String, param: &str) -> Result<String, ToolError> {
    if text.trim().is_empty() {
        return Ok("{}".to_string());
    }
    // The parse error's position is enough; the text itself is the caller's and is not
    // repeated back.
    match serde_json::from_str::<Value>(&text) {
        Ok(Value::Object(_)) => Ok(text),
        Ok(_) => Err(ToolError::new(param, "the arguments must be a JSON object")),
        Err(err) => Err(ToolError::new(
            param,
            format!("the arguments are not JSON ({err})"),
        )),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn a_tools_file_is_read_as_the_request_field() {
        let text = json!([{"type": "function", "function": {
            "name": "get_weather", "description": "Weather now",
            "parameters": {"type": "object", "properties": {"city": {"type": "string"}}},
            "strict": true,
        }}, {"type": "function", "function": {"name": "ping"}}])
        .to_string();
        let tools = tools_from_json(&text).unwrap();
        assert_eq!(tools.len(), 2);
        assert_eq!(tools[0].name, "get_weather");
        assert_eq!(tools[0].description, "Weather now");
        assert_eq!(
            tools[0].parameters,
            r#"{"type":"object","properties":{"city":{"type":"string"}}}"#
        );
        assert!(tools[0].strict);
        assert_eq!(
            tools[1],
            ToolSpec {
                name: "ping".into(),
                description: String::new(),
                parameters: String::new(),
                strict: false
            }
        );
    }

    #[test]
    fn bad_tools_files_name_what_is_wrong() {
        let param = |text: &str| tools_from_json(text).unwrap_err().param;
        assert_eq!(param("[{"), "tools");
        assert_eq!(param(r#"{"type": "function"}"#), "tools");
        assert_eq!(
            param(r#"[{"type": "function", "function": {"name": 5}}]"#),
            "tools[0].function.name"
        );
        assert_eq!(param(r#"[{"function": {"name": "x"}}]"#), "tools[0].type");
        assert_eq!(
            param(r#"[{"type": "function", "function": {"name": "a b"}}]"#),
            "tools[0].function.name"
        );
    }

    #[test]
    fn tool_choice_words_and_function_names() {
        let tools =
            tools_from_json(r#"[{"type": "function", "function": {"name": "f"}}]"#).unwrap();
        assert_eq!(choice_by_word("required", &tools), Ok(ToolChoice::Required));
        assert_eq!(choice_by_word("none", &tools), Ok(ToolChoice::None));
        assert_eq!(choice_by_word("auto", &tools), Ok(ToolChoice::Auto));
        assert_eq!(
            choice_by_word("f", &tools),
            Ok(ToolChoice::Function("f".into()))
        );
        assert_eq!(
            choice_by_word("g", &tools).unwrap_err().param,
            "tool_choice"
        );
    }

    #[test]
    fn names_follow_openais_rule() {
        let ok = |name: &str| check_name(name, "p").is_ok();
        assert!(ok("get_weather-2"));
        assert!(ok(&"a".repeat(64)));
        assert!(!ok(""));
        assert!(!ok(&"a".repeat(65)));
        assert!(!ok("get.weather"));
        assert!(!ok("météo"));
    }

    #[test]
    fn arguments_must_be_an_object() {
        assert_eq!(arguments(r#"{"a": 1}"#.into(), "p").unwrap(), r#"{"a": 1}"#);
        assert_eq!(arguments("  ".into(), "p").unwrap(), "{}");
        assert!(arguments("[1]".into(), "p").is_err());
        let err = arguments(r#"{"secret": "#.into(), "p").unwrap_err();
        assert!(!err.message.contains("secret"), "{err}");
    }
}
