//! Tool (function) calling: the tools a chat request offers, shown to the model, and
//! the calls it writes, found in its text and held to each tool's parameter schema.
//!
//! Calls use the Hermes syntax that Qwen 2.5/3, Hermes and SmolLM3 were trained on:
//!
//! ```text
//! <tool_call>
//! {"name": "get_weather", "arguments": {"city": "Oslo"}}
//! </tool_call>
//! ```
//!
//! A template that writes this syntax itself is given the tools and the history's calls
//! as data ([`prompt`]); any other template renders the conversation without them, and
//! the tools and the syntax are described in a system message instead, so every model
//! can call tools. While the model writes, [`watch::CallWatcher`] passes text through
//! until an opening tag appears, then holds the call's JSON to the schema of
//! [`ToolSet::grammar`] token by token (lazily, as llama.cpp's grammar triggers do), so a
//! call always names an offered tool and its arguments always match that tool's schema.
//! `tool_choice: required` (or a named function) puts the opening tag at the end of the
//! prompt and holds the answer to a call from its first token.
//!
//! Llama 3.1 to 3.3 were trained on another syntax ([`CallSyntax::LlamaJson`]): the
//! whole answer is one call, `{"name": ..., "parameters": {...}}`, with no tags. Their
//! templates render the tools and the history's calls themselves, and the watcher takes
//! an answer whose first byte (after whitespace) is `{` for a call.
//!
//! Mistral 7B v0.3 and Mistral Nemo write [`CallSyntax::Mistral`]: the control token
//! `[TOOL_CALLS]`, then every call of the turn in one JSON array,
//! `[{"name": ..., "arguments": {...}}, ...]`, held to the schema of that array. Their
//! templates insist on call ids of nine letters and digits, which sparkd gives its own
//! calls and maps any other id to (`prompt`).
//!
//! Mistral Small 3.2, Devstral, Ministral and Magistral write
//! [`CallSyntax::MistralArgs`]: each call as `[TOOL_CALLS]name[ARGS]{...}` (Small 3.2
//! puts `[CALL_ID]` and the call's id between the name and `[ARGS]`). The name and id
//! are held to the offered tools by [`header::CallHeader`], then the arguments to that
//! tool's own schema.

pub mod header;
pub mod prompt;
pub mod scan;
pub mod watch;

use std::sync::Arc;

use serde_json::{json, Map, Value};
use spark_client::protocol::{ToolChoice, ToolSpec};
use thiserror::Error;

use super::schema::{Schema, SchemaError};

/// The tag that opens a call.
pub const CALL_OPEN: &str = "<tool_call>";
/// The tag that closes a call.
pub const CALL_CLOSE: &str = "</tool_call>";
/// The control token before a Mistral model's calls.
pub const MISTRAL_CALLS: &str = "[TOOL_CALLS]";

/// A request's tools that are wrong, or cannot be enforced.
#[derive(Debug, Error, Clone, PartialEq, Eq)]
pub enum ToolError {
    #[error(
        "tools[{index}].name: `{name}` must be 1 to 64 characters of a-z, A-Z, 0-9, `_` and `-`"
    )]
    BadName { index: usize, name: String },
    #[error("tools[{index}].name: `{name}` is offered twice")]
    DuplicateName { index: usize, name: String },
    #[error("tools[{index}] (`{name}`).parameters: {message}")]
    BadParameters {
        index: usize,
        name: String,
        message: String,
    },
    #[error("tool_choice: the function `{0}` is not among the tools")]
    UnknownChoice(String),
    #[error("tool_choice: a call is required but no tools are offered")]
    NothingToCall,
    #[error("tool calls: {0}")]
    Schema(String),
}

/// How a model writes a call.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CallSyntax {
    /// `<tool_call>` + `{"name": ..., "arguments": {...}}` + `</tool_call>`, anywhere
    /// in the answer, several in a row (Qwen 2.5/3, Hermes, SmolLM3, and the tools
    /// described to any other model).
    Hermes,
    /// The whole answer is `{"name": ..., "parameters": {...}}`: Llama 3.1 to 3.3,
    /// one call per answer.
    LlamaJson,
    /// `[TOOL_CALLS]` + `[{"name": ..., "arguments": {...}}, ...]`, every call of the
    /// turn in one array (Mistral 7B v0.3, Mistral Nemo).
    Mistral,
    /// `[TOOL_CALLS]` + name + `[ARGS]` + the arguments' object, once per call; with
    /// `call_ids`, `[CALL_ID]` and nine letters and digits before `[ARGS]` (Mistral
    /// Small 3.2; Devstral, Ministral and Magistral write none).
    MistralArgs { call_ids: bool },
}

impl CallSyntax {
    /// The call object's key for the arguments.
    pub fn arguments_key(self) -> &'static str {
        match self {
            CallSyntax::Hermes | CallSyntax::Mistral | CallSyntax::MistralArgs { .. } => {
                "arguments"
            }
            CallSyntax::LlamaJson => "parameters",
        }
    }

    /// The syntax's name in `ChatFormatReport::tools`.
    pub fn name(self) -> &'static str {
        match self {
            CallSyntax::Hermes => "hermes",
            CallSyntax::LlamaJson => "llama",
            CallSyntax::Mistral => "mistral",
            CallSyntax::MistralArgs { call_ids: false } => "mistral-args",
            CallSyntax::MistralArgs { call_ids: true } => "mistral-args-ids",
        }
    }

    /// What opens the calls (the Llama syntax has nothing: its answer is the call).
    pub fn open_tag(self) -> Option<&'static str> {
        match self {
            CallSyntax::Hermes => Some(CALL_OPEN),
            CallSyntax::Mistral | CallSyntax::MistralArgs { .. } => Some(MISTRAL_CALLS),
            CallSyntax::LlamaJson => None,
        }
    }

    /// Whether the syntax is one of Mistral's, whose templates take call ids of nine
    /// letters and digits only.
    pub fn nine_character_ids(self) -> bool {
        matches!(self, CallSyntax::Mistral | CallSyntax::MistralArgs { .. })
    }

    /// Whether `bytes`, a control token's, are one of this syntax's tags: the watcher
    /// reads those, where the text stream drops control tokens.
    pub fn is_tag(self, bytes: &[u8]) -> bool {
        let tag = |t: &str| bytes == t.as_bytes();
        match self {
            CallSyntax::Hermes => tag(CALL_OPEN) || tag(CALL_CLOSE),
            CallSyntax::Mistral => tag(MISTRAL_CALLS),
            CallSyntax::MistralArgs { .. } => {
                tag(MISTRAL_CALLS) || tag(header::ARGS) || tag(header::CALL_ID)
            }
            CallSyntax::LlamaJson => false,
        }
    }

    /// What ends a prompt whose answer must be a call: the opening tag, as the model
    /// writes it.
    pub fn forced_prefix(self) -> Option<String> {
        match self {
            CallSyntax::Hermes => Some(format!("{CALL_OPEN}\n")),
            CallSyntax::Mistral | CallSyntax::MistralArgs { .. } => Some(MISTRAL_CALLS.to_string()),
            CallSyntax::LlamaJson => None,
        }
    }

    /// A new call's id: OpenAI's shape (`call_` and 24 letters and digits), or the nine
    /// letters and digits Mistral's templates require.
    pub fn new_call_id(self) -> String {
        use rand::distributions::{Alphanumeric, DistString};
        let mut rng = rand::thread_rng();
        if self.nine_character_ids() {
            Alphanumeric.sample_string(&mut rng, MISTRAL_ID_LEN)
        } else {
            format!("call_{}", Alphanumeric.sample_string(&mut rng, 24))
        }
    }
}

/// The length of a Mistral call id.
pub const MISTRAL_ID_LEN: usize = 9;

/// How the answer begins.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CallMode {
    /// Text or calls, as the model decides.
    Auto,
    /// A call from the first token (in the Hermes syntax, the prompt ends with the
    /// opening tag).
    Forced,
}

/// What a call is held to as it is written, by syntax.
#[derive(Debug, Clone)]
pub enum CallGrammar {
    /// The call's JSON: one object `{"name": <an offered tool>, "arguments": <its
    /// parameters>}` (`"parameters"` in the Llama syntax); in the Mistral syntax, the
    /// array of them.
    Json(Arc<Schema>),
    /// The `[ARGS]` syntax: a header naming one of `names` (see [`header`]), then that
    /// tool's arguments, held to `arguments` at the same index.
    Headed {
        names: Arc<[String]>,
        arguments: Vec<Arc<Schema>>,
    },
}

/// The tools of one request, ready for generation.
#[derive(Debug, Clone)]
pub struct ToolSet {
    pub grammar: CallGrammar,
    pub mode: CallMode,
    /// Whether more calls may follow the first.
    pub parallel: bool,
    pub syntax: CallSyntax,
}

impl ToolSet {
    /// Checks `tools` and `choice`; `None` when the model may not call anything
    /// (`ToolChoice::None`, or no tools offered).
    pub fn prepare(
        tools: &[ToolSpec],
        choice: &ToolChoice,
        parallel: bool,
        syntax: CallSyntax,
    ) -> Result<Option<ToolSet>, ToolError> {
        check_names(tools)?;
        let (mode, callable): (CallMode, Vec<&ToolSpec>) = match choice {
            ToolChoice::None => return Ok(None),
            ToolChoice::Auto if tools.is_empty() => return Ok(None),
            ToolChoice::Auto => (CallMode::Auto, tools.iter().collect()),
            ToolChoice::Required if tools.is_empty() => return Err(ToolError::NothingToCall),
            ToolChoice::Required => (CallMode::Forced, tools.iter().collect()),
            ToolChoice::Function(name) => {
                let tool = tools
                    .iter()
                    .find(|t| t.name == *name)
                    .ok_or_else(|| ToolError::UnknownChoice(name.clone()))?;
                (CallMode::Forced, vec![tool])
            }
        };
        // Every tool's parameters are checked, including those a named choice leaves
        // out: a request is refused or not whatever its choice.
        let mut parameters = Vec::with_capacity(tools.len());
        for (index, tool) in tools.iter().enumerate() {
            parameters.push(enforceable_parameters(index, tool)?);
        }
        let callable_parameters: Vec<(&str, Value)> = tools
            .iter()
            .zip(parameters)
            .filter(|(tool, _)| callable.iter().any(|c| c.name == tool.name))
            .map(|(tool, params)| (tool.name.as_str(), params))
            .collect();
        let schema_error = |e: SchemaError| ToolError::Schema(e.to_string());
        let grammar = match syntax {
            // Only the named tool's arguments are JSON here: no union of the calls.
            CallSyntax::MistralArgs { .. } => CallGrammar::Headed {
                names: callable_parameters
                    .iter()
                    .map(|(name, _)| name.to_string())
                    .collect(),
                arguments: callable_parameters
                    .iter()
                    .map(|(_, params)| Schema::compile(&params.to_string()).map(Arc::new))
                    .collect::<Result<_, _>>()
                    .map_err(schema_error)?,
            },
            _ => {
                let call = call_schema(callable_parameters.into_iter(), syntax.arguments_key());
                let schema = match syntax {
                    CallSyntax::Mistral => {
                        Schema::compile_array(&call_list_schema(call, parallel).to_string())
                    }
                    _ => Schema::compile(&call.to_string()),
                };
                CallGrammar::Json(Arc::new(schema.map_err(schema_error)?))
            }
        };
        Ok(Some(ToolSet {
            grammar,
            mode,
            // The Llama syntax has one call per answer (its templates refuse more).
            parallel: parallel && syntax != CallSyntax::LlamaJson,
            syntax,
        }))
    }
}

/// OpenAI's rule for function names, and no name twice.
fn check_names(tools: &[ToolSpec]) -> Result<(), ToolError> {
    for (index, tool) in tools.iter().enumerate() {
        let name = &tool.name;
        let valid = (1..=64).contains(&name.len())
            && name
                .bytes()
                .all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'-');
        if !valid {
            return Err(ToolError::BadName {
                index,
                name: name.chars().take(80).collect(),
            });
        }
        if tools[..index].iter().any(|t| t.name == *name) {
            return Err(ToolError::DuplicateName {
                index,
                name: name.clone(),
            });
        }
    }
    Ok(())
}

/// A tool's parameter schema as it will be enforced: its own when the daemon can
/// enforce it; any object when it cannot and the tool is not `strict` (OpenAI holds
/// only strict tools to their schemas); an error for a strict one.
fn enforceable_parameters(index: usize, tool: &ToolSpec) -> Result<Value, ToolError> {
    let bad = |message: String| ToolError::BadParameters {
        index,
        name: tool.name.clone(),
        message,
    };
    let any_object = || json!({"type": "object"});
    if tool.parameters.trim().is_empty() {
        return Ok(any_object());
    }
    let value: Value =
        serde_json::from_str(&tool.parameters).map_err(|e| bad(format!("not valid JSON: {e}")))?;
    let Value::Object(map) = &value else {
        return Err(bad("must be a JSON Schema object".into()));
    };
    if map.is_empty() {
        return Ok(any_object());
    }
    match Schema::compile(&tool.parameters) {
        Ok(_) => Ok(value),
        Err(e) if tool.strict => Err(bad(e.to_string())),
        Err(_) => Ok(any_object()),
    }
}

/// The schema of one call: an object whose `name` picks the tool and whose arguments
/// (under `arguments_key`) follow that tool's parameters. Each tool's schema goes under
/// `$defs`, with its own `$ref`s rewritten to point there.
fn call_schema<'a>(tools: impl Iterator<Item = (&'a str, Value)>, arguments_key: &str) -> Value {
    let mut defs = Map::new();
    let mut alternatives = Vec::new();
    for (i, (name, mut params)) in tools.enumerate() {
        let def = format!("tool{i}");
        rebase_refs(&mut params, &format!("#/$defs/{def}"));
        defs.insert(def.clone(), params);
        let mut properties = Map::new();
        properties.insert("name".into(), json!({"const": name}));
        properties.insert(
            arguments_key.into(),
            json!({"$ref": format!("#/$defs/{def}")}),
        );
        alternatives.push(json!({
            "type": "object",
            "properties": properties,
            "required": ["name", arguments_key],
            "additionalProperties": false,
        }));
    }
    let mut root = if alternatives.len() == 1 {
        alternatives.pop().unwrap_or_default()
    } else {
        json!({"anyOf": alternatives})
    };
    if let Value::Object(root) = &mut root {
        root.insert("$defs".into(), Value::Object(defs));
    }
    root
}

/// The Mistral syntax's array of calls: one call at least, and one at most unless
/// parallel calls are allowed. The call's `$defs` move to the root, where its `$ref`s
/// point.
fn call_list_schema(mut call: Value, parallel: bool) -> Value {
    let defs = call
        .as_object_mut()
        .and_then(|c| c.remove("$defs"))
        .unwrap_or_else(|| json!({}));
    let mut list = json!({"type": "array", "items": call, "minItems": 1, "$defs": defs});
    if !parallel {
        list["maxItems"] = json!(1);
    }
    list
}

/// Rewrites the document-local `$ref`s of a schema that moves to `base` (a JSON
/// pointer fragment such as `#/$defs/tool0`): `#/x` becomes `base/x`.
fn rebase_refs(schema: &mut Value, base: &str) {
    match schema {
        Value::Object(map) => {
            for (key, value) in map.iter_mut() {
                match value {
                    Value::String(target) if key == "$ref" => {
                        if let Some(rest) = target.strip_prefix('#') {
                            *target = format!("{base}{rest}");
                        }
                    }
                    _ => rebase_refs(value, base),
                }
            }
        }
        Value::Array(items) => items.iter_mut().for_each(|v| rebase_refs(v, base)),
        _ => {}
    }
}

#[cfg(test)]
mod tests;
