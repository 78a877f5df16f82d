//! OpenAI response objects (`chat.completion`, `chat.completion.chunk`, `text_completion`),
//! written as focused serde structs rather than taken from an SDK crate, so the usage object
//! can carry sparkd's timing fields and only what is sent is modelled.

use serde::ser::SerializeMap;
use serde::{Serialize, Serializer};

use crate::protocol::{
    DoneEvent, FinishReason, PrefillEvent, TokenBytesEvent, TokenEvent, ToolCall, ToolCallEvent,
};

/// `usage`: OpenAI's three counts plus this request's own engine timings (additive fields
/// that OpenAI SDKs keep as extras). Timings are in milliseconds, rates in tokens/second.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Usage {
    pub prompt_tokens: u32,
    pub completion_tokens: u32,
    pub total_tokens: u32,
    pub ttft_ms: Option<f64>,
    pub generation_ms: f64,
    pub decode_tps: Option<f64>,
    pub queue_ms: f64,
    pub prefill_ms: f64,
    pub decode_ms: f64,
    pub prefill_tps: Option<f64>,
    /// OpenAI's own field: how many prompt tokens came from the daemon's prefix cache.
    /// Left out when the daemon did not say (it had not read the prompt, or it is older
    /// than protocol 1.2).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub prompt_tokens_details: Option<PromptTokensDetails>,
    /// OpenAI's own field: how many completion tokens were a thinking model's
    /// reasoning. Left out when there was none.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub completion_tokens_details: Option<CompletionTokensDetails>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub struct PromptTokensDetails {
    pub cached_tokens: u32,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub struct CompletionTokensDetails {
    pub reasoning_tokens: u32,
}

impl Usage {
    /// Always from the request's own events, so concurrent requests never mix timings.
    pub fn from_done(done: &DoneEvent, prefill: Option<&PrefillEvent>) -> Self {
        let u = done.usage;
        let t = done.timings;
        Self {
            prompt_tokens_details: prefill.map(|p| PromptTokensDetails {
                cached_tokens: p.cached_tokens,
            }),
            completion_tokens_details: None,
            prompt_tokens: u.prompt_tokens,
            completion_tokens: u.completion_tokens,
            total_tokens: u.prompt_tokens.saturating_add(u.completion_tokens),
            ttft_ms: t.ttft_ms,
            generation_ms: t.generation_ms,
            decode_tps: t.decode_tps,
            queue_ms: t.queue_ms,
            prefill_ms: t.prefill_ms,
            decode_ms: t.decode_ms,
            prefill_tps: t.prefill_tps,
        }
    }

    /// With the count of completion tokens that were reasoning (none when 0).
    pub fn with_reasoning_tokens(mut self, reasoning_tokens: u32) -> Self {
        self.completion_tokens_details =
            (reasoning_tokens > 0).then_some(CompletionTokensDetails { reasoning_tokens });
        self
    }
}

/// OpenAI's `finish_reason`; `None` means the generation failed (reported as an error).
pub fn finish_reason(reason: FinishReason) -> Option<&'static str> {
    match reason {
        FinishReason::Stop => Some("stop"),
        FinishReason::Length => Some("length"),
        // OpenAI has no word for these; the text simply ended.
        FinishReason::Cancelled | FinishReason::Disconnected | FinishReason::Shutdown => {
            Some("stop")
        }
        FinishReason::Error => None,
    }
}

/// A chat answer's `finish_reason`: `tool_calls` when the model called functions and
/// then stopped by itself (a cut-off answer stays `length`).
pub fn chat_finish_reason(reason: FinishReason, made_calls: bool) -> Option<&'static str> {
    match reason {
        FinishReason::Stop if made_calls => Some("tool_calls"),
        other => finish_reason(other),
    }
}

// ---- chat ----

#[derive(Debug, Serialize)]
pub struct ChatCompletion {
    pub id: String,
    pub object: &'static str,
    pub created: u64,
    pub model: String,
    pub choices: Vec<ChatChoice>,
    pub usage: Usage,
}

#[derive(Debug, Serialize)]
pub struct ChatChoice {
    pub index: u32,
    pub message: AssistantMessage,
    pub logprobs: Option<ChatLogprobs>,
    pub finish_reason: &'static str,
}

#[derive(Debug, Serialize)]
pub struct AssistantMessage {
    pub role: &'static str,
    /// `null` when the answer is tool calls and no text.
    pub content: Option<String>,
    pub refusal: Option<String>,
    /// Left out when the model called nothing, as OpenAI does.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub tool_calls: Vec<ToolCallOut>,
    /// A thinking model's reasoning, apart from its answer (the field DeepSeek's API,
    /// vLLM and llama.cpp's server use). Left out when there was none.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub reasoning_content: Option<String>,
}

impl AssistantMessage {
    pub fn new(text: String, tool_calls: Vec<ToolCallOut>) -> Self {
        let content = if text.is_empty() && !tool_calls.is_empty() {
            None
        } else {
            Some(text)
        };
        Self {
            role: "assistant",
            content,
            refusal: None,
            tool_calls,
            reasoning_content: None,
        }
    }

    /// With a thinking model's reasoning (none when empty).
    pub fn with_reasoning(mut self, reasoning: String) -> Self {
        self.reasoning_content = (!reasoning.is_empty()).then_some(reasoning);
        self
    }
}

/// One function call of a non-streamed answer (`message.tool_calls[i]`).
#[derive(Debug, Serialize)]
pub struct ToolCallOut {
    pub id: String,
    #[serde(rename = "type")]
    pub kind: &'static str,
    pub function: FunctionCallOut,
}

#[derive(Debug, Serialize)]
pub struct FunctionCallOut {
    pub name: String,
    /// The JSON object's text, as OpenAI sends it.
    pub arguments: String,
}

impl From<ToolCallEvent> for ToolCallOut {
    fn from(event: ToolCallEvent) -> Self {
        Self {
            id: event.call.id,
            kind: "function",
            function: FunctionCallOut {
                name: event.call.name,
                arguments: event.call.arguments,
            },
        }
    }
}

#[derive(Debug, Serialize)]
pub struct ChatChunk {
    pub id: String,
    pub object: &'static str,
    pub created: u64,
    pub model: String,
    pub choices: Vec<ChunkChoice>,
    /// Present (as `null` until the last chunk) only with `stream_options.include_usage`,
    /// as OpenAI does.
    #[serde(skip_serializing_if = "ChunkUsage::is_absent")]
    pub usage: ChunkUsage,
}

#[derive(Debug, Serialize)]
pub struct ChunkChoice {
    pub index: u32,
    pub delta: Delta,
    pub logprobs: Option<ChatLogprobs>,
    pub finish_reason: Option<&'static str>,
}

#[derive(Debug, Default, Serialize)]
pub struct Delta {
    #[serde(skip_serializing_if = "Option::is_none")]
    pub role: Option<&'static str>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub content: Option<String>,
    /// A piece of a thinking model's reasoning (see [`AssistantMessage`]).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub reasoning_content: Option<String>,
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub tool_calls: Vec<ToolCallDelta>,
}

/// A piece of a streamed call (`delta.tool_calls[i]`); the pieces of one `index` add up
/// to the call, their `arguments` concatenated.
#[derive(Debug, Serialize)]
pub struct ToolCallDelta {
    pub index: u32,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub id: Option<String>,
    #[serde(rename = "type", skip_serializing_if = "Option::is_none")]
    pub kind: Option<&'static str>,
    pub function: FunctionDelta,
}

#[derive(Debug, Serialize)]
pub struct FunctionDelta {
    #[serde(skip_serializing_if = "Option::is_none")]
    pub name: Option<String>,
    /// Always a string, never left out: clients append it to what they have.
    pub arguments: String,
}

impl ToolCallDelta {
    /// A whole call as OpenAI streams one: first its id, type and name with empty
    /// arguments, then the arguments. Sending the arguments in the first piece would
    /// have them twice in clients written after OpenAI's guide, which keep the first
    /// piece as the call and then append every piece's arguments to it.
    pub fn pieces(event: ToolCallEvent) -> [Self; 2] {
        let ToolCall {
            id,
            name,
            arguments,
        } = event.call;
        [
            Self::opening(event.index, id, name),
            Self::arguments(event.index, arguments),
        ]
    }

    /// A call's first chunk: its id, type and name, with empty arguments.
    pub fn opening(index: u32, id: String, name: String) -> Self {
        Self {
            index,
            id: Some(id),
            kind: Some("function"),
            function: FunctionDelta {
                name: Some(name),
                arguments: String::new(),
            },
        }
    }

    /// A chunk of a call's arguments, which clients append to what they have.
    pub fn arguments(index: u32, arguments: String) -> Self {
        Self {
            index,
            id: None,
            kind: None,
            function: FunctionDelta {
                name: None,
                arguments,
            },
        }
    }
}

/// A chunk's `usage` field: left out, `null`, or the final counts.
#[derive(Debug, Serialize)]
#[serde(untagged)]
pub enum ChunkUsage {
    Absent,
    Null(Option<()>),
    Final(Usage),
}

impl ChunkUsage {
    fn is_absent(&self) -> bool {
        matches!(self, ChunkUsage::Absent)
    }

    pub fn pending(include_usage: bool) -> Self {
        if include_usage {
            ChunkUsage::Null(None)
        } else {
            ChunkUsage::Absent
        }
    }
}

#[derive(Debug, Default, Serialize)]
pub struct ChatLogprobs {
    pub content: Vec<ChatTokenLogprob>,
    pub refusal: Option<Vec<ChatTokenLogprob>>,
}

#[derive(Debug, Serialize)]
pub struct ChatTokenLogprob {
    pub token: String,
    pub logprob: f32,
    pub bytes: Vec<u8>,
    pub top_logprobs: Vec<TopLogprob>,
}

#[derive(Debug, Serialize)]
pub struct TopLogprob {
    pub token: String,
    pub logprob: f32,
    pub bytes: Vec<u8>,
}

/// How OpenAI shows a token: its text, or, for bytes that are not whole UTF-8 (part of
/// a character written over several tokens), `bytes:` then each byte as `\xNN`, as
/// OpenAI's own API does. Two partial tokens never show alike, which matters where
/// tokens are keys (completions' `top_logprobs`).
pub fn token_string(bytes: &[u8]) -> String {
    match std::str::from_utf8(bytes) {
        Ok(text) => text.to_owned(),
        Err(_) => {
            use std::fmt::Write;
            let mut shown = String::with_capacity(6 + 4 * bytes.len());
            shown.push_str("bytes:");
            for b in bytes {
                let _ = write!(shown, "\\x{b:02x}");
            }
            shown
        }
    }
}

/// One token's `token` string and `bytes`: from its own bytes when the daemon sent them
/// (protocol 1.11), else from its text (an older daemon: a character written over
/// several tokens then shows whole on the token that completes it).
fn shown(text: &str, raw: Option<&[u8]>) -> (String, Vec<u8>) {
    match raw {
        Some(bytes) => (token_string(bytes), bytes.to_vec()),
        None => (text.to_owned(), text.as_bytes().to_vec()),
    }
}

/// One token as a logprobs entry shows it.
struct Shown {
    token: String,
    bytes: Vec<u8>,
    logprob: f32,
}

/// The chosen token and each alternative as entries; `None` without logprobs.
fn shown_tokens(event: &TokenEvent, raw: Option<&TokenBytesEvent>) -> Option<(Shown, Vec<Shown>)> {
    let lp = event.logprobs.as_ref()?;
    let entry = |text: &str, bytes: Option<&Vec<u8>>, logprob: f32| {
        let (token, bytes) = shown(text, bytes.map(Vec::as_slice));
        Shown {
            token,
            bytes,
            logprob,
        }
    };
    let chosen = entry(&event.text, raw.map(|r| &r.bytes), lp.logprob);
    let top = (lp.top.iter().enumerate())
        .map(|(i, (_, text, logprob))| entry(text, raw.and_then(|r| r.top.get(i)), *logprob))
        .collect();
    Some((chosen, top))
}

impl ChatTokenLogprob {
    /// `None` when the token event carries no logprobs. `raw`: the token's
    /// [`TokenBytesEvent`], when the daemon sent one.
    pub fn from_token(event: &TokenEvent, raw: Option<&TokenBytesEvent>) -> Option<Self> {
        let (chosen, top) = shown_tokens(event, raw)?;
        Some(Self {
            token: chosen.token,
            logprob: chosen.logprob,
            bytes: chosen.bytes,
            top_logprobs: (top.into_iter())
                .map(|t| TopLogprob {
                    token: t.token,
                    logprob: t.logprob,
                    bytes: t.bytes,
                })
                .collect(),
        })
    }
}

// ---- completions ----

#[derive(Debug, Serialize)]
pub struct TextCompletion {
    pub id: String,
    pub object: &'static str,
    pub created: u64,
    pub model: String,
    pub choices: Vec<TextChoice>,
    #[serde(skip_serializing_if = "ChunkUsage::is_absent")]
    pub usage: ChunkUsage,
}

#[derive(Debug, Serialize)]
pub struct TextChoice {
    pub text: String,
    pub index: u32,
    pub logprobs: Option<CompletionLogprobs>,
    pub finish_reason: Option<&'static str>,
}

/// One token's alternatives as completions show them: a JSON object from token to
/// logprob, most likely first as OpenAI orders it (a reader that keeps key order sees
/// the ranking), each token once (the likelier kept, should two read alike).
#[derive(Debug, Default, PartialEq)]
pub struct Alternatives(Vec<(String, f32)>);

impl Alternatives {
    /// From alternatives most likely first.
    pub fn new(ranked: impl IntoIterator<Item = (String, f32)>) -> Self {
        let mut kept: Vec<(String, f32)> = Vec::new();
        for (token, logprob) in ranked {
            if !kept.iter().any(|(t, _)| *t == token) {
                kept.push((token, logprob));
            }
        }
        Alternatives(kept)
    }

    #[cfg(test)]
    pub fn get(&self, token: &str) -> Option<f32> {
        self.0.iter().find(|(t, _)| t == token).map(|(_, lp)| *lp)
    }
}

impl Serialize for Alternatives {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        let mut map = serializer.serialize_map(Some(self.0.len()))?;
        for (token, logprob) in &self.0 {
            map.serialize_entry(token, logprob)?;
        }
        map.end()
    }
}

/// The legacy completions logprobs layout: parallel arrays, one entry per token.
#[derive(Debug, Default, Serialize)]
pub struct CompletionLogprobs {
    pub tokens: Vec<String>,
    pub token_logprobs: Vec<f32>,
    pub top_logprobs: Vec<Alternatives>,
    /// Character offset of each token in the generated text.
    pub text_offset: Vec<usize>,
}

impl CompletionLogprobs {
    /// Appends one token; `offset` is where its text starts in the completion.
    /// `raw`: the token's [`TokenBytesEvent`], when the daemon sent one.
    pub fn push(&mut self, event: &TokenEvent, raw: Option<&TokenBytesEvent>, offset: usize) {
        let Some((chosen, top)) = shown_tokens(event, raw) else {
            return;
        };
        self.tokens.push(chosen.token);
        self.token_logprobs.push(chosen.logprob);
        (self.top_logprobs).push(Alternatives::new(
            top.into_iter().map(|t| (t.token, t.logprob)),
        ));
        self.text_offset.push(offset);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::protocol::{Timings, TokenLogprobs, Usage as WireUsage};

    fn done(prompt: u32, completion: u32, ttft: f64) -> DoneEvent {
        DoneEvent {
            id: 1,
            finish_reason: FinishReason::Stop,
            usage: WireUsage {
                prompt_tokens: prompt,
                completion_tokens: completion,
            },
            timings: Timings {
                ttft_ms: Some(ttft),
                decode_tps: None,
                ..Timings::default()
            },
        }
    }

    #[test]
    fn usage_copies_counts_and_timings() {
        let usage = Usage::from_done(&done(7, 5, 12.5), None);
        assert_eq!(usage.total_tokens, 12);
        let json = serde_json::to_value(&usage).unwrap();
        assert_eq!(json["ttft_ms"], 12.5);
        assert!(json["decode_tps"].is_null());
        assert!(json.get("prefill_tps").is_some());
    }

    #[test]
    fn chunk_usage_field_is_omitted_null_or_filled() {
        let chunk = |usage| ChatChunk {
            id: "x".into(),
            object: "chat.completion.chunk",
            created: 0,
            model: "m".into(),
            choices: vec![],
            usage,
        };
        let absent = serde_json::to_value(chunk(ChunkUsage::pending(false))).unwrap();
        assert!(absent.get("usage").is_none());
        let null = serde_json::to_value(chunk(ChunkUsage::pending(true))).unwrap();
        assert!(null.get("usage").is_some_and(|u| u.is_null()));
        let full = serde_json::to_value(chunk(ChunkUsage::Final(Usage::from_done(
            &done(1, 2, 3.0),
            None,
        ))))
        .unwrap();
        assert_eq!(full["usage"]["total_tokens"], 3);
    }

    #[test]
    fn finish_reasons_map_to_openai_words() {
        assert_eq!(finish_reason(FinishReason::Stop), Some("stop"));
        assert_eq!(finish_reason(FinishReason::Length), Some("length"));
        assert_eq!(finish_reason(FinishReason::Cancelled), Some("stop"));
        assert_eq!(finish_reason(FinishReason::Shutdown), Some("stop"));
        assert_eq!(finish_reason(FinishReason::Error), None);
    }

    #[test]
    fn tool_calls_finish_with_tool_calls_unless_cut_short() {
        assert_eq!(
            chat_finish_reason(FinishReason::Stop, true),
            Some("tool_calls")
        );
        assert_eq!(chat_finish_reason(FinishReason::Stop, false), Some("stop"));
        assert_eq!(
            chat_finish_reason(FinishReason::Length, true),
            Some("length")
        );
        assert_eq!(
            chat_finish_reason(FinishReason::Cancelled, true),
            Some("stop")
        );
        assert_eq!(chat_finish_reason(FinishReason::Error, true), None);
    }

    fn call_event() -> ToolCallEvent {
        ToolCallEvent {
            id: 1,
            index: 2,
            call: crate::protocol::ToolCall {
                id: "call_1".into(),
                name: "f".into(),
                arguments: r#"{"a":1}"#.into(),
            },
        }
    }

    #[test]
    fn an_answer_of_calls_only_has_null_content() {
        let message = AssistantMessage::new(String::new(), vec![call_event().into()]);
        let json = serde_json::to_value(&message).unwrap();
        assert!(json["content"].is_null(), "{json}");
        assert_eq!(json["tool_calls"][0]["id"], "call_1");
        assert_eq!(json["tool_calls"][0]["type"], "function");
        assert_eq!(json["tool_calls"][0]["function"]["name"], "f");
        assert_eq!(json["tool_calls"][0]["function"]["arguments"], r#"{"a":1}"#);
        // Without calls: the text, even empty, and no tool_calls field.
        let json = serde_json::to_value(AssistantMessage::new(String::new(), vec![])).unwrap();
        assert_eq!(json["content"], "");
        assert!(json.get("tool_calls").is_none(), "{json}");
    }

    #[test]
    fn a_streamed_call_is_an_opening_then_its_arguments() {
        let [opening, arguments] = ToolCallDelta::pieces(call_event());
        assert_eq!(
            serde_json::to_value(&opening).unwrap(),
            serde_json::json!({"index": 2, "id": "call_1", "type": "function",
                               "function": {"name": "f", "arguments": ""}})
        );
        assert_eq!(
            serde_json::to_value(&arguments).unwrap(),
            serde_json::json!({"index": 2, "function": {"arguments": r#"{"a":1}"#}})
        );
    }

    #[test]
    fn a_token_that_is_not_whole_utf8_shows_its_bytes_as_openai_does() {
        assert_eq!(token_string(b" hello"), " hello");
        assert_eq!(token_string("😊".as_bytes()), "😊");
        assert_eq!(token_string(b""), "");
        assert_eq!(token_string(&[0xF0, 0x9F]), r"bytes:\xf0\x9f");
        // A token with part of a character after text: all of it as bytes.
        assert_eq!(token_string(&[b' ', 0xE2, 0x80]), r"bytes:\x20\xe2\x80");
    }

    #[test]
    fn completion_alternatives_keep_their_ranking_and_each_token_once() {
        let ranked = [("b", -0.5), ("a", -1.0), ("b", -2.0), ("c", -3.0)];
        let alternatives = Alternatives::new(ranked.map(|(t, lp)| (t.to_owned(), lp)));
        assert_eq!(
            serde_json::to_string(&alternatives).unwrap(),
            r#"{"b":-0.5,"a":-1.0,"c":-3.0}"#
        );
    }

    #[test]
    fn completion_logprobs_are_parallel_arrays() {
        let token = |text: &str, lp: f32| TokenEvent {
            id: 1,
            token: 5,
            text: text.into(),
            logprobs: Some(TokenLogprobs {
                logprob: lp,
                top: vec![(5, text.into(), lp), (6, "other".into(), lp - 1.0)],
            }),
        };
        let mut lps = CompletionLogprobs::default();
        lps.push(&token("Hel", -0.5), None, 0);
        lps.push(&token("lo", -0.25), None, 3);
        assert_eq!(lps.tokens, ["Hel", "lo"]);
        assert_eq!(lps.token_logprobs, [-0.5, -0.25]);
        assert_eq!(lps.text_offset, [0, 3]);
        assert_eq!(lps.top_logprobs[1].get("other"), Some(-1.25));
    }
}
