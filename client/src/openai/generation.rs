//! Turns a generation's daemon events into an OpenAI answer: one JSON object, or an SSE
//! stream of chunks that owns the event stream (so a client hanging up cancels the job).

use std::convert::Infallible;
use std::sync::Arc;
use std::time::{SystemTime, UNIX_EPOCH};

use axum::response::sse::{Event, KeepAlive, Sse};
use axum::response::{IntoResponse, Response};
use axum::Json;
use futures::stream::{self, StreamExt};
use rand::distributions::Alphanumeric;
use rand::Rng;
use tokio_util::sync::CancellationToken;

use super::backend::{BackendError, BackendEvent, EventStream};
use super::error::ApiError;
use super::metrics::Metrics;
use super::response::{
    chat_finish_reason, finish_reason, AssistantMessage, ChatChoice, ChatChunk, ChatCompletion,
    ChatLogprobs, ChatTokenLogprob, ChunkChoice, ChunkUsage, CompletionLogprobs, Delta,
    FunctionCallOut, TextChoice, TextCompletion, ToolCallDelta, ToolCallOut, Usage,
};
use crate::protocol::{
    DoneEvent, PrefillEvent, ReasoningEvent, TokenBytesEvent, TokenEvent, ToolCallDeltaEvent,
    ToolCallEvent,
};

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Endpoint {
    Chat,
    Completion,
}

/// What every object of one answer repeats.
#[derive(Debug, Clone)]
pub struct ResponseMeta {
    pub endpoint: Endpoint,
    pub id: String,
    pub created: u64,
    pub model: String,
    pub include_usage: bool,
    pub logprobs: bool,
}

impl ResponseMeta {
    pub fn new(endpoint: Endpoint, model: String, include_usage: bool, logprobs: bool) -> Self {
        let prefix = match endpoint {
            Endpoint::Chat => "chatcmpl-",
            Endpoint::Completion => "cmpl-",
        };
        let suffix: String = rand::thread_rng()
            .sample_iter(&Alphanumeric)
            .take(24)
            .map(char::from)
            .collect();
        let created = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map_or(0, |d| d.as_secs());
        Self {
            endpoint,
            id: format!("{prefix}{suffix}"),
            created,
            model,
            include_usage,
            logprobs,
        }
    }

    fn chat_chunk(&self, choices: Vec<ChunkChoice>, usage: ChunkUsage) -> ChatChunk {
        ChatChunk {
            id: self.id.clone(),
            object: "chat.completion.chunk",
            created: self.created,
            model: self.model.clone(),
            choices,
            usage,
        }
    }

    fn text_completion(&self, choices: Vec<TextChoice>, usage: ChunkUsage) -> TextCompletion {
        TextCompletion {
            id: self.id.clone(),
            object: "text_completion",
            created: self.created,
            model: self.model.clone(),
            choices,
            usage,
        }
    }
}

fn closed_early() -> ApiError {
    ApiError::from(BackendError::Unavailable(
        "the daemon connection closed before the generation ended".into(),
    ))
}

fn engine_failed() -> ApiError {
    ApiError::from(BackendError::Engine(
        "the engine failed while generating".into(),
    ))
}

/// Reads the whole generation and answers with one `chat.completion` / `text_completion`.
pub async fn collect(
    meta: ResponseMeta,
    mut events: EventStream,
    metrics: &Metrics,
) -> Result<Response, ApiError> {
    let mut text = String::new();
    let mut reasoning = String::new();
    let mut reasoning_tokens = 0u32;
    // By index: each call whole once complete, or as far as its pieces went.
    let mut calls: std::collections::BTreeMap<u32, ToolCallOut> = Default::default();
    let mut complete = std::collections::BTreeSet::new();
    let mut chat_logprobs = ChatLogprobs::default();
    let mut completion_logprobs = CompletionLogprobs::default();
    let mut prefill = None;
    // The raw bytes of the token that comes next (daemons speaking 1.11, with logprobs).
    let mut token_bytes: Option<TokenBytesEvent> = None;
    let done = loop {
        match events.next().await {
            Some(Ok(BackendEvent::Prefilled(event))) => prefill = Some(event),
            Some(Ok(BackendEvent::TokenBytes(event))) => token_bytes = Some(event),
            Some(Ok(BackendEvent::Token(token))) => {
                let raw = token_bytes.take();
                if meta.logprobs {
                    match meta.endpoint {
                        Endpoint::Chat => chat_logprobs
                            .content
                            .extend(ChatTokenLogprob::from_token(&token, raw.as_ref())),
                        Endpoint::Completion => {
                            completion_logprobs.push(&token, raw.as_ref(), text.chars().count())
                        }
                    }
                }
                text.push_str(&token.text);
            }
            // Only chat requests offer tools.
            Some(Ok(BackendEvent::ToolCall(call))) => {
                complete.insert(call.index);
                calls.insert(call.index, call.into());
            }
            // The pieces of a call being written: what stands of it if it is cut short.
            Some(Ok(BackendEvent::ToolCallDelta(delta))) if !complete.contains(&delta.index) => {
                let call = calls.entry(delta.index).or_insert_with(|| ToolCallOut {
                    id: String::new(),
                    kind: "function",
                    function: FunctionCallOut {
                        name: String::new(),
                        arguments: String::new(),
                    },
                });
                if let Some(opening) = delta.opening {
                    call.id = opening.id;
                    call.function.name = opening.name;
                }
                call.function.arguments.push_str(&delta.arguments);
            }
            Some(Ok(BackendEvent::ToolCallDelta(_))) => {}
            // Only chat requests are split (a completion's text is all one).
            Some(Ok(BackendEvent::Reasoning(event))) => {
                reasoning_tokens += 1;
                reasoning.push_str(&event.text);
            }
            Some(Ok(BackendEvent::Done(done))) => break done,
            Some(Err(err)) => return Err(err.into()),
            None => return Err(closed_early()),
        }
    };
    metrics.record_done(&done, prefill.as_ref());
    let calls: Vec<ToolCallOut> = calls.into_values().collect();
    let reason =
        chat_finish_reason(done.finish_reason, !calls.is_empty()).ok_or_else(engine_failed)?;
    let usage = Usage::from_done(&done, prefill.as_ref()).with_reasoning_tokens(reasoning_tokens);
    let body = match meta.endpoint {
        Endpoint::Chat => Json(ChatCompletion {
            id: meta.id,
            object: "chat.completion",
            created: meta.created,
            model: meta.model,
            choices: vec![ChatChoice {
                index: 0,
                message: AssistantMessage::new(text, calls).with_reasoning(reasoning),
                logprobs: meta.logprobs.then_some(chat_logprobs),
                finish_reason: reason,
            }],
            usage,
        })
        .into_response(),
        Endpoint::Completion => Json(TextCompletion {
            choices: vec![TextChoice {
                text,
                index: 0,
                logprobs: meta.logprobs.then_some(completion_logprobs),
                finish_reason: Some(reason),
            }],
            ..meta.text_completion(Vec::new(), ChunkUsage::Final(usage))
        })
        .into_response(),
    };
    Ok(body)
}

/// Answers with an SSE stream. The returned body owns `events`: when hyper drops the body
/// (client gone) or `shutdown` fires, the event stream is dropped and the daemon cancels.
pub fn stream(
    meta: ResponseMeta,
    events: EventStream,
    metrics: Arc<Metrics>,
    shutdown: CancellationToken,
) -> Response {
    let state = StreamState {
        meta,
        events,
        metrics,
        started: false,
        finished: false,
        chars: 0,
        prefill: None,
        made_calls: false,
        streamed_calls: Vec::new(),
        reasoning_tokens: 0,
        token_bytes: None,
    };
    let body = stream::unfold(state, |mut state| async move {
        let batch = state.next_batch().await?;
        Some((stream::iter(batch), state))
    })
    .flatten()
    .map(Ok::<_, Infallible>)
    .take_until(shutdown.cancelled_owned());
    let mut response = Sse::new(body)
        .keep_alive(KeepAlive::default())
        .into_response();
    // SSE is always UTF-8, but tools that read bodies (browser devtools, some proxies)
    // fall back to windows-1252 for a text type without a charset.
    response.headers_mut().insert(
        axum::http::header::CONTENT_TYPE,
        axum::http::HeaderValue::from_static("text/event-stream; charset=utf-8"),
    );
    response
}

struct StreamState {
    meta: ResponseMeta,
    events: EventStream,
    metrics: Arc<Metrics>,
    started: bool,
    finished: bool,
    /// Characters sent so far (completions' `text_offset`).
    chars: usize,
    /// How the daemon read the prompt, for the final usage.
    prefill: Option<PrefillEvent>,
    /// A tool call was sent: the finish reason is then `tool_calls`.
    made_calls: bool,
    /// The indices of calls whose pieces were sent as they were written: their whole
    /// `ToolCall` adds nothing.
    streamed_calls: Vec<u32>,
    /// Tokens that wrote reasoning, for the final usage.
    reasoning_tokens: u32,
    /// The raw bytes of the token that comes next (daemons speaking 1.11, with logprobs).
    token_bytes: Option<TokenBytesEvent>,
}

impl StreamState {
    /// The SSE events for the next daemon event; `None` once the stream has ended.
    async fn next_batch(&mut self) -> Option<Vec<Event>> {
        if self.finished {
            return None;
        }
        let mut out = Vec::new();
        if !self.started {
            self.started = true;
            // OpenAI's first chat chunk announces the role with empty content.
            if self.meta.endpoint == Endpoint::Chat {
                let delta = Delta {
                    role: Some("assistant"),
                    content: Some(String::new()),
                    ..Delta::default()
                };
                out.push(self.chat_event(delta, None, None));
            }
        }
        match self.events.next().await {
            Some(Ok(BackendEvent::Prefilled(event))) => self.prefill = Some(event),
            Some(Ok(BackendEvent::TokenBytes(event))) => self.token_bytes = Some(event),
            Some(Ok(BackendEvent::Token(token))) => out.extend(self.token_event(&token)),
            Some(Ok(BackendEvent::ToolCall(call))) => self.tool_call_events(call, &mut out),
            Some(Ok(BackendEvent::ToolCallDelta(delta))) => {
                out.extend(self.tool_call_delta_event(delta));
            }
            Some(Ok(BackendEvent::Reasoning(event))) => out.extend(self.reasoning_event(event)),
            Some(Ok(BackendEvent::Done(done))) => {
                self.finished = true;
                self.done_events(&done, &mut out);
            }
            Some(Err(err)) => {
                self.finished = true;
                out.push(self.error_event(err.into()));
            }
            None => {
                self.finished = true;
                out.push(self.error_event(closed_early()));
            }
        }
        Some(out)
    }

    fn token_event(&mut self, token: &TokenEvent) -> Option<Event> {
        let raw = self.token_bytes.take();
        // A token that only holds part of a UTF-8 character has no text yet; without
        // logprobs there is nothing to say about it.
        if token.text.is_empty() && !self.meta.logprobs {
            return None;
        }
        let offset = self.chars;
        self.chars += token.text.chars().count();
        match self.meta.endpoint {
            Endpoint::Chat => {
                let logprobs = if self.meta.logprobs {
                    Some(ChatLogprobs {
                        content: ChatTokenLogprob::from_token(token, raw.as_ref())
                            .into_iter()
                            .collect(),
                        refusal: None,
                    })
                } else {
                    None
                };
                let delta = Delta {
                    content: Some(token.text.clone()),
                    ..Delta::default()
                };
                Some(self.chat_event(delta, logprobs, None))
            }
            Endpoint::Completion => {
                let logprobs = self.meta.logprobs.then(|| {
                    let mut lps = CompletionLogprobs::default();
                    lps.push(token, raw.as_ref(), offset);
                    lps
                });
                Some(self.text_event(token.text.clone(), logprobs, None))
            }
        }
    }

    /// A piece of reasoning as a chunk with `delta.reasoning_content`.
    fn reasoning_event(&mut self, event: ReasoningEvent) -> Option<Event> {
        self.reasoning_tokens += 1;
        if self.meta.endpoint != Endpoint::Chat || event.text.is_empty() {
            return None;
        }
        let delta = Delta {
            reasoning_content: Some(event.text),
            ..Delta::default()
        };
        Some(self.chat_event(delta, None, None))
    }

    /// A call as two chunks: its id and name, then its arguments (see
    /// [`ToolCallDelta::pieces`]); nothing for a call already sent in pieces.
    fn tool_call_events(&mut self, call: ToolCallEvent, out: &mut Vec<Event>) {
        // Only chat requests offer tools.
        if self.meta.endpoint != Endpoint::Chat {
            return;
        }
        self.made_calls = true;
        if self.streamed_calls.contains(&call.index) {
            return;
        }
        for piece in ToolCallDelta::pieces(call) {
            let delta = Delta {
                tool_calls: vec![piece],
                ..Delta::default()
            };
            out.push(self.chat_event(delta, None, None));
        }
    }

    /// A piece of a call being written: its opening (id, type and name, with empty
    /// arguments) as one chunk, then what follows of its arguments as another.
    fn tool_call_delta_event(&mut self, delta: ToolCallDeltaEvent) -> Vec<Event> {
        if self.meta.endpoint != Endpoint::Chat {
            return Vec::new();
        }
        self.made_calls = true;
        if !self.streamed_calls.contains(&delta.index) {
            self.streamed_calls.push(delta.index);
        }
        let opening = delta
            .opening
            .map(|o| ToolCallDelta::opening(delta.index, o.id, o.name));
        let arguments = (!delta.arguments.is_empty())
            .then(|| ToolCallDelta::arguments(delta.index, delta.arguments));
        opening
            .into_iter()
            .chain(arguments)
            .map(|piece| {
                let delta = Delta {
                    tool_calls: vec![piece],
                    ..Delta::default()
                };
                self.chat_event(delta, None, None)
            })
            .collect()
    }

    fn done_events(&mut self, done: &DoneEvent, out: &mut Vec<Event>) {
        self.metrics.record_done(done, self.prefill.as_ref());
        let reason = match self.meta.endpoint {
            Endpoint::Chat => chat_finish_reason(done.finish_reason, self.made_calls),
            Endpoint::Completion => finish_reason(done.finish_reason),
        };
        let Some(reason) = reason else {
            out.push(self.error_event(engine_failed()));
            return;
        };
        out.push(match self.meta.endpoint {
            Endpoint::Chat => self.chat_event(Delta::default(), None, Some(reason)),
            Endpoint::Completion => self.text_event(String::new(), None, Some(reason)),
        });
        if self.meta.include_usage {
            let usage = ChunkUsage::Final(
                Usage::from_done(done, self.prefill.as_ref())
                    .with_reasoning_tokens(self.reasoning_tokens),
            );
            out.push(match self.meta.endpoint {
                Endpoint::Chat => json_event(&self.meta.chat_chunk(Vec::new(), usage)),
                Endpoint::Completion => json_event(&self.meta.text_completion(Vec::new(), usage)),
            });
        }
        out.push(Event::default().data("[DONE]"));
    }

    fn chat_event(
        &self,
        delta: Delta,
        logprobs: Option<ChatLogprobs>,
        finish_reason: Option<&'static str>,
    ) -> Event {
        let choice = ChunkChoice {
            index: 0,
            delta,
            logprobs,
            finish_reason,
        };
        let usage = ChunkUsage::pending(self.meta.include_usage);
        json_event(&self.meta.chat_chunk(vec![choice], usage))
    }

    fn text_event(
        &self,
        text: String,
        logprobs: Option<CompletionLogprobs>,
        finish_reason: Option<&'static str>,
    ) -> Event {
        let choice = TextChoice {
            text,
            index: 0,
            logprobs,
            finish_reason,
        };
        let usage = ChunkUsage::pending(self.meta.include_usage);
        json_event(&self.meta.text_completion(vec![choice], usage))
    }

    /// OpenAI's mid-stream error: a `data:` event holding `{"error": ...}`. The OpenAI SDKs
    /// raise it as an API error.
    fn error_event(&self, err: ApiError) -> Event {
        self.metrics.record_error(err.metric);
        Event::default().data(err.body_json())
    }
}

fn json_event<T: serde::Serialize>(value: &T) -> Event {
    // These types serialise infallibly (no maps with non-string keys, no custom impls).
    Event::default().data(serde_json::to_string(value).unwrap_or_default())
}
