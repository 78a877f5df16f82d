//! OpenAI request bodies: lenient parsing (unknown fields ignored), strict validation,
//! and translation into the daemon's `GenerateRequest`.
//!
//! A body is parsed twice from one `serde_json::Value`: once for the fields both endpoints
//! share and once for the endpoint's own fields. That keeps each struct flat, which keeps
//! the error paths that `serde_path_to_error` reports exact (`messages[1].content`).

use std::collections::HashMap;

use serde::de::DeserializeOwned;
use serde::Deserialize;
use serde_json::Value;

use super::error::ApiError;
use super::tools::{self, ToolCallIn, ToolError, ToolIn};
use crate::protocol::{
    ChatMessage, GenerateOption, GenerateRequest, OutputFormat, PromptInput, SamplingParams,
    ToolChatMessage, ToolChoice, ToolSpec,
};

/// The daemon's cap on alternatives per token.
const MAX_TOP_LOGPROBS: u32 = 20;
/// More stop strings than this is a mistake, not a use case (OpenAI allows 4).
use crate::limits::{check_options, MAX_STOP_STRINGS};

/// A validated request, ready for the daemon.
#[derive(Debug, Clone, PartialEq)]
pub struct ParsedRequest {
    /// The model the caller named; `None` means the daemon's loaded model.
    pub model: Option<String>,
    /// `id` is left at 0: the backend assigns it.
    pub generate: GenerateRequest,
    pub stream: bool,
    /// `stream_options.include_usage`: send a final usage chunk.
    pub include_usage: bool,
    /// `response_format`: plain text, a JSON object, or one held to a JSON Schema.
    pub format: OutputFormat,
    /// What the protocol's `GenerateWith` carries: `chat_template_kwargs`.
    pub options: Vec<GenerateOption>,
}

/// Fields shared by `/v1/chat/completions` and `/v1/completions`.
#[derive(Debug, Default, Deserialize)]
struct CommonFields {
    model: Option<String>,
    max_tokens: Option<u32>,
    max_completion_tokens: Option<u32>,
    temperature: Option<f32>,
    top_p: Option<f32>,
    top_k: Option<i64>,
    min_p: Option<f32>,
    presence_penalty: Option<f32>,
    frequency_penalty: Option<f32>,
    repetition_penalty: Option<f32>,
    seed: Option<Seed>,
    stop: Option<Stop>,
    logit_bias: Option<HashMap<String, f32>>,
    n: Option<u32>,
    stream: Option<bool>,
    stream_options: Option<StreamOptions>,
}

#[derive(Debug, Deserialize)]
struct StreamOptions {
    include_usage: Option<bool>,
}

#[derive(Debug, Deserialize)]
#[serde(untagged, expecting = "an integer")]
enum Seed {
    Unsigned(u64),
    Signed(i64),
}

#[derive(Debug, Deserialize)]
#[serde(untagged, expecting = "a string or an array of strings")]
enum Stop {
    One(String),
    Many(Vec<String>),
}

#[derive(Debug, Deserialize)]
struct ChatFields {
    messages: Vec<MessageIn>,
    logprobs: Option<bool>,
    top_logprobs: Option<u32>,
    tools: Option<Vec<ToolIn>>,
    /// Checked by hand: a string or an object, with its own messages.
    tool_choice: Option<Value>,
    parallel_tool_calls: Option<bool>,
    response_format: Option<ResponseFormat>,
    /// Variables for the chat template (vLLM's and llama-server's extension).
    chat_template_kwargs: Option<Value>,
    /// OpenAI's effort for reasoning models: the template variable of that name.
    reasoning_effort: Option<Value>,
}

#[derive(Debug, Deserialize)]
struct MessageIn {
    role: String,
    content: Option<Content>,
    /// An assistant message's calls (earlier turns).
    tool_calls: Option<Vec<ToolCallIn>>,
    /// A `tool` message's answer to a call.
    tool_call_id: Option<String>,
}

#[derive(Debug, Deserialize)]
#[serde(untagged, expecting = "a string or an array of content parts")]
enum Content {
    Text(String),
    Parts(Vec<ContentPart>),
}

#[derive(Debug, Deserialize)]
struct ContentPart {
    #[serde(rename = "type")]
    kind: String,
    text: Option<String>,
}

#[derive(Debug, Deserialize)]
struct ResponseFormat {
    #[serde(rename = "type")]
    kind: String,
    /// For `json_schema`: `{name, description, schema, strict}`.
    json_schema: Option<JsonSchemaFormat>,
}

#[derive(Debug, Deserialize)]
struct JsonSchemaFormat {
    /// The schema document; without one, any JSON object.
    schema: Option<serde_json::Value>,
}

#[derive(Debug, Deserialize)]
struct CompletionFields {
    prompt: Prompt,
    logprobs: Option<u32>,
    echo: Option<bool>,
    suffix: Option<String>,
    best_of: Option<u32>,
}

#[derive(Debug, Deserialize)]
#[serde(untagged, expecting = "a string or an array of one string")]
enum Prompt {
    One(String),
    Many(Vec<String>),
}

/// `response_format`. A `json_schema`'s schema goes to the daemon as it is: the daemon
/// says what it cannot enforce (and sparkd holds the output to the schema whether or
/// not `strict` is set).
fn output_format(format: ResponseFormat) -> Result<OutputFormat, ApiError> {
    match (format.kind.as_str(), format.json_schema) {
        ("text", _) => Ok(OutputFormat::Text),
        ("json_object", _) => Ok(OutputFormat::JsonObject),
        ("json_schema", Some(JsonSchemaFormat { schema: None })) => Ok(OutputFormat::JsonObject),
        ("json_schema", Some(JsonSchemaFormat { schema: Some(schema) })) => {
            if !(schema.is_object() || schema.is_boolean()) {
                return Err(ApiError::invalid(
                    "response_format.json_schema.schema".to_string(),
                    "the schema must be a JSON object",
                ));
            }
            Ok(OutputFormat::JsonSchema {
                schema: schema.to_string(),
            })
        }
        ("json_schema", None) => Err(ApiError::invalid(
            "response_format.json_schema".to_string(),
            "response_format of type 'json_schema' needs a 'json_schema' object",
        )),
        (kind, _) => Err(ApiError::unsupported(
            "response_format",
            format!(
                "response_format type '{kind}' is not supported (use 'json_schema', 'json_object' or 'text')"
            ),
        )),
    }
}

/// Parses and validates a `/v1/chat/completions` body.
pub fn parse_chat(body: &[u8]) -> Result<ParsedRequest, ApiError> {
    let value = parse_object(body)?;
    let common: CommonFields = from_value(&value)?;
    let chat: ChatFields = from_value(&value)?;

    let tools = tools::tool_specs(chat.tools.unwrap_or_default()).map_err(tool_error)?;
    let choice = chat
        .tool_choice
        .filter(|c| !c.is_null())
        .map(|c| tools::tool_choice(&c, &tools))
        .transpose()
        .map_err(tool_error)?;
    let format = match chat.response_format {
        None => OutputFormat::Text,
        Some(format) => output_format(format)?,
    };
    let logprobs = match (chat.logprobs.unwrap_or(false), chat.top_logprobs) {
        (false, Some(_)) => {
            return Err(ApiError::invalid(
                "top_logprobs".to_string(),
                "logprobs must be true when top_logprobs is set",
            ))
        }
        (false, None) => None,
        (true, top) => Some(top_logprobs(top.unwrap_or(0), "top_logprobs")?),
    };
    if chat.messages.is_empty() {
        return Err(ApiError::invalid(
            "messages".to_string(),
            "messages must hold at least one message",
        ));
    }
    let messages = chat
        .messages
        .into_iter()
        .enumerate()
        .map(|(i, m)| chat_message(i, m))
        .collect::<Result<Vec<_>, _>>()?;
    let input = if uses_tools(&tools, &messages) {
        if format != OutputFormat::Text {
            return Err(ApiError::unsupported(
                "response_format",
                "response_format must be 'text' when tools are used",
            ));
        }
        // Without tools (a conversation that only mentions earlier calls) there is
        // nothing to call.
        let default = if tools.is_empty() {
            ToolChoice::None
        } else {
            ToolChoice::Auto
        };
        PromptInput::ChatWithTools {
            messages,
            tools,
            choice: choice.unwrap_or(default),
            parallel: chat.parallel_tool_calls.unwrap_or(true),
        }
    } else {
        // Plain chats stay `Chat`, which daemons older than protocol 1.5 understand.
        PromptInput::Chat {
            messages: messages.into_iter().map(plain_message).collect(),
        }
    };
    let options = template_kwargs(chat.chat_template_kwargs, chat.reasoning_effort)?
        .into_iter()
        .collect();
    build(common, input, logprobs, format, options)
}

/// OpenAI's `reasoning_effort` values.
const REASONING_EFFORTS: [&str; 5] = ["none", "minimal", "low", "medium", "high"];

/// `chat_template_kwargs`: an object (or null, meaning none), passed on as its JSON text;
/// the daemon checks the names against the ones it sets itself. OpenAI's
/// `reasoning_effort` joins it as the template variable of that name (GPT-OSS's
/// template reads it), unless the object sets one itself.
fn template_kwargs(
    value: Option<Value>,
    reasoning_effort: Option<Value>,
) -> Result<Option<GenerateOption>, ApiError> {
    let mut vars = match value {
        None | Some(Value::Null) => serde_json::Map::new(),
        Some(Value::Object(map)) => map,
        Some(_) => {
            return Err(ApiError::invalid(
                "chat_template_kwargs".to_string(),
                "chat_template_kwargs must be an object of template variables",
            ))
        }
    };
    match reasoning_effort {
        None | Some(Value::Null) => {}
        Some(Value::String(effort)) if REASONING_EFFORTS.contains(&effort.as_str()) => {
            vars.entry("reasoning_effort")
                .or_insert(Value::String(effort));
        }
        Some(other) => {
            return Err(ApiError::invalid(
                "reasoning_effort".to_string(),
                format!(
                    "reasoning_effort must be one of {}, got {other}",
                    REASONING_EFFORTS.join(", ")
                ),
            ))
        }
    }
    if vars.is_empty() {
        return Ok(None);
    }
    let option = GenerateOption::TemplateVariables(Value::Object(vars).to_string());
    // The protocol's size cap, said here with the field it belongs to.
    check_options(std::slice::from_ref(&option))
        .map_err(|message| ApiError::invalid("chat_template_kwargs".to_string(), message))?;
    Ok(Some(option))
}

fn tool_error(err: ToolError) -> ApiError {
    ApiError::invalid(err.param, err.message)
}

/// Whether the request needs `PromptInput::ChatWithTools`: tools to offer, or a
/// conversation that holds calls or their results.
fn uses_tools(tools: &[ToolSpec], messages: &[ToolChatMessage]) -> bool {
    !tools.is_empty()
        || messages
            .iter()
            .any(|m| !m.tool_calls.is_empty() || m.role == "tool")
}

/// A message without tool parts as `Chat` has it: no content is empty content.
fn plain_message(message: ToolChatMessage) -> ChatMessage {
    ChatMessage {
        role: message.role,
        content: message.content.unwrap_or_default(),
    }
}

/// Parses and validates a `/v1/completions` body. The prompt is used raw (no template).
pub fn parse_completion(body: &[u8]) -> Result<ParsedRequest, ApiError> {
    let value = parse_object(body)?;
    let common: CommonFields = from_value(&value)?;
    let completion: CompletionFields = from_value(&value)?;

    if completion.echo == Some(true) {
        return Err(ApiError::unsupported("echo", "echo is not supported"));
    }
    if completion.suffix.as_deref().is_some_and(|s| !s.is_empty()) {
        return Err(ApiError::unsupported("suffix", "suffix is not supported"));
    }
    if completion.best_of.is_some_and(|n| n != 1) {
        return Err(ApiError::unsupported(
            "best_of",
            "only best_of=1 is supported",
        ));
    }
    let text = match completion.prompt {
        Prompt::One(text) => text,
        Prompt::Many(mut texts) if texts.len() == 1 => texts.swap_remove(0),
        Prompt::Many(_) => {
            return Err(ApiError::unsupported(
                "prompt",
                "exactly one prompt is supported",
            ))
        }
    };
    let logprobs = completion
        .logprobs
        .map(|n| top_logprobs(n, "logprobs"))
        .transpose()?;
    // Special-token text in a raw prompt is parsed, so a caller can write its own template.
    build(
        common,
        PromptInput::Raw {
            text,
            special: true,
        },
        logprobs,
        OutputFormat::Text,
        Vec::new(),
    )
}

fn parse_object(body: &[u8]) -> Result<Value, ApiError> {
    let value: Value = serde_json::from_slice(body)
        .map_err(|e| ApiError::bad_json(format!("the request body is not valid JSON: {e}")))?;
    if !value.is_object() {
        return Err(ApiError::bad_json("the request body must be a JSON object"));
    }
    Ok(value)
}

/// Deserialises with the failing field's path as OpenAI's `param`.
fn from_value<T: DeserializeOwned>(value: &Value) -> Result<T, ApiError> {
    serde_path_to_error::deserialize(value).map_err(|err| {
        let (param, message) = failing_field(err);
        if param == "." {
            ApiError::invalid(None, message)
        } else {
            ApiError::invalid(
                param.clone(),
                format!("invalid value for '{param}': {message}"),
            )
        }
    })
}

/// The path of the field a deserialisation failed at (`.` for the whole value), and why.
pub(super) fn failing_field(
    err: serde_path_to_error::Error<serde_json::Error>,
) -> (String, String) {
    let path = err.path().to_string();
    let message = err.into_inner().to_string();
    // serde reports a missing field at its parent's path; name the field itself.
    let missing = message
        .strip_prefix("missing field `")
        .and_then(|rest| rest.split_once('`'))
        .map(|(field, _)| field);
    let param = match (path.as_str(), missing) {
        (".", Some(field)) => field.to_string(),
        (_, Some(field)) => format!("{path}.{field}"),
        (_, None) => path,
    };
    (param, message)
}

fn top_logprobs(n: u32, param: &str) -> Result<u8, ApiError> {
    if n > MAX_TOP_LOGPROBS {
        return Err(ApiError::invalid(
            param.to_string(),
            format!("{param} must be at most {MAX_TOP_LOGPROBS}, got {n}"),
        ));
    }
    // Checked above: n <= 20 fits a u8.
    Ok(n as u8)
}

fn chat_message(index: usize, message: MessageIn) -> Result<ToolChatMessage, ApiError> {
    let role = message_role(index, &message.role)?;
    let tool_calls = match message.tool_calls {
        Some(calls) if !calls.is_empty() => {
            if role != "assistant" {
                return Err(ApiError::invalid(
                    format!("messages[{index}].tool_calls"),
                    "only assistant messages carry tool_calls",
                ));
            }
            tools::tool_calls(index, calls).map_err(tool_error)?
        }
        _ => Vec::new(),
    };
    let tool_call_id = if role == "tool" {
        let id = message.tool_call_id.ok_or_else(|| {
            ApiError::invalid(
                format!("messages[{index}].tool_call_id"),
                "a tool message needs the tool_call_id of the call it answers",
            )
        })?;
        Some(id)
    } else {
        None
    };
    // Only an assistant's turn may lack content (it made calls, or said nothing), as in
    // OpenAI's API: a user, system or tool message without any is a client's mistake.
    if message.content.is_none() && role != "assistant" {
        return Err(ApiError::invalid(
            format!("messages[{index}].content"),
            format!("a {role} message needs content"),
        ));
    }
    Ok(ToolChatMessage {
        role,
        // Assistant messages that only carried tool calls have no content.
        content: message
            .content
            .map(|c| content_text(index, c))
            .transpose()?,
        tool_calls,
        tool_call_id,
    })
}

fn message_role(index: usize, role: &str) -> Result<String, ApiError> {
    Ok(match role {
        // OpenAI's newer name for the system role; chat templates only know `system`.
        "developer" => "system".to_string(),
        "" => {
            return Err(ApiError::invalid(
                format!("messages[{index}].role"),
                "role must not be empty",
            ))
        }
        other => other.to_string(),
    })
}

/// A message's text: a string, or text parts joined with newlines.
fn content_text(index: usize, content: Content) -> Result<String, ApiError> {
    let parts = match content {
        Content::Text(text) => return Ok(text),
        Content::Parts(parts) => parts,
    };
    let mut texts = Vec::with_capacity(parts.len());
    for (p, part) in parts.into_iter().enumerate() {
        let param = format!("messages[{index}].content[{p}]");
        match (part.kind.as_str(), part.text) {
            ("text", Some(text)) => texts.push(text),
            ("text", None) => {
                return Err(ApiError::invalid(
                    format!("{param}.text"),
                    "a text content part needs a 'text' field",
                ))
            }
            (other, _) => {
                return Err(ApiError::unsupported(
                    &format!("{param}.type"),
                    format!("content parts of type '{other}' are not supported"),
                ))
            }
        }
    }
    Ok(texts.join("\n"))
}

fn build(
    common: CommonFields,
    input: PromptInput,
    logprobs: Option<u8>,
    format: OutputFormat,
    mut options: Vec<GenerateOption>,
) -> Result<ParsedRequest, ApiError> {
    if let Some(n) = common.n {
        if n != 1 {
            return Err(ApiError::unsupported(
                "n",
                format!("only n=1 is supported, got {n}"),
            ));
        }
    }
    // The newer name wins when a client sends both.
    let max_tokens = common.max_completion_tokens.or(common.max_tokens);
    if max_tokens == Some(0) {
        let param = if common.max_completion_tokens.is_some() {
            "max_completion_tokens"
        } else {
            "max_tokens"
        };
        return Err(ApiError::invalid(
            param.to_string(),
            format!("{param} must be at least 1"),
        ));
    }
    let sampling = sampling(&common)?;
    let model = common.model.filter(|m| !m.is_empty());
    let stream = common.stream.unwrap_or(false);
    if matches!(input, PromptInput::ChatWithTools { .. }) {
        // A streamed answer gives its calls' arguments as they are written, as OpenAI
        // does, rather than each call whole once it is complete; a whole answer gathers
        // the pieces, so that a call cut short by max_tokens is still a call (with the
        // arguments written so far), as in the stream, not text.
        options.push(GenerateOption::StreamToolCalls);
    }
    // Like OpenAI, usage chunks exist only in streams.
    let include_usage = stream
        && common
            .stream_options
            .as_ref()
            .and_then(|o| o.include_usage)
            .unwrap_or(false);
    let generate = GenerateRequest {
        id: 0,
        model: model.clone(),
        input,
        sampling,
        max_tokens,
        stop: stop_strings(common.stop)?,
        logprobs,
    };
    Ok(ParsedRequest {
        model,
        generate,
        stream,
        include_usage,
        format,
        options,
    })
}

fn sampling(common: &CommonFields) -> Result<SamplingParams, ApiError> {
    let mut params = SamplingParams::default();
    if let Some(t) = common.temperature {
        params.temperature = in_range("temperature", t, 0.0, 2.0)?;
    }
    // Nucleus sampling with p = 0 keeps only the most likely token; the daemon wants p in
    // (0, 1], so that case is said with top_k = 1 instead.
    let mut nucleus_is_greedy = false;
    if let Some(p) = common.top_p {
        let p = in_range("top_p", p, 0.0, 1.0)?;
        if p == 0.0 {
            nucleus_is_greedy = true;
        } else {
            params.top_p = p;
        }
    }
    let top_k = match common.top_k {
        // -1 is the common "disabled" spelling (vLLM, llama.cpp).
        None | Some(-1) | Some(0) => 0,
        Some(k) if k > 0 => u32::try_from(k).unwrap_or(u32::MAX),
        Some(_) => {
            return Err(ApiError::invalid(
                "top_k".to_string(),
                "top_k must be >= -1",
            ))
        }
    };
    params.top_k = if nucleus_is_greedy { 1 } else { top_k };
    if let Some(m) = common.min_p {
        params.min_p = in_range("min_p", m, 0.0, 1.0)?;
    }
    if let Some(p) = common.presence_penalty {
        params.presence_penalty = in_range("presence_penalty", p, -2.0, 2.0)?;
    }
    if let Some(p) = common.frequency_penalty {
        params.frequency_penalty = in_range("frequency_penalty", p, -2.0, 2.0)?;
    }
    if let Some(p) = common.repetition_penalty {
        if !(p.is_finite() && p > 0.0) {
            return Err(ApiError::invalid(
                "repetition_penalty".to_string(),
                "repetition_penalty must be > 0",
            ));
        }
        params.repeat_penalty = p;
    }
    params.seed = common.seed.as_ref().map(|seed| match *seed {
        Seed::Unsigned(s) => s,
        // Any fixed mapping works: the point is that the same seed repeats.
        Seed::Signed(s) => s as u64,
    });
    if let Some(bias) = &common.logit_bias {
        let mut pairs = Vec::with_capacity(bias.len());
        for (token, &value) in bias {
            let param = format!("logit_bias.{token}");
            let id: u32 = token.parse().map_err(|_| {
                ApiError::invalid(param.clone(), format!("'{token}' is not a token id"))
            })?;
            pairs.push((id, in_range(&param, value, -100.0, 100.0)?));
        }
        // HashMap order is random; a sorted list keeps requests reproducible.
        pairs.sort_by_key(|&(id, _)| id);
        params.logit_bias = pairs;
    }
    Ok(params)
}

fn in_range(param: &str, value: f32, min: f32, max: f32) -> Result<f32, ApiError> {
    if value.is_finite() && (min..=max).contains(&value) {
        Ok(value)
    } else {
        Err(ApiError::invalid(
            param.to_string(),
            format!("{param} must be between {min} and {max}, got {value}"),
        ))
    }
}

fn stop_strings(stop: Option<Stop>) -> Result<Vec<String>, ApiError> {
    let stops = match stop {
        None => Vec::new(),
        Some(Stop::One(s)) => vec![s],
        Some(Stop::Many(list)) => list,
    };
    if stops.len() > MAX_STOP_STRINGS {
        return Err(ApiError::invalid(
            "stop".to_string(),
            format!("at most {MAX_STOP_STRINGS} stop strings are supported"),
        ));
    }
    // An empty stop string would end every generation at once; clients that send one
    // mean "no stop string".
    Ok(stops.into_iter().filter(|s| !s.is_empty()).collect())
}

#[cfg(test)]
#[path = "request_tests.rs"]
mod tests;

#[cfg(test)]
#[path = "request_fuzz_tests.rs"]
mod fuzz_tests;
