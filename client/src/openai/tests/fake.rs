//! A scripted in-memory daemon for the HTTP tests, and a helper that serves it.

use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

use futures::future::BoxFuture;
use futures::stream::{self, StreamExt};
use tokio::sync::Notify;
use tokio_util::sync::CancellationToken;

use crate::openai::{
    bind, router, serve, Backend, BackendError, BackendEvent, EventStream, RouterOptions,
};
use crate::protocol::{
    CacheReport, ChatFormatReport, DoneEvent, ErrorKind, FinishReason, GenerateOption,
    GenerateRequest, JobEntry, JobRecord, ModelInfo, OutputFormat, PrefillEvent, PromptInput,
    ReasoningEvent, StatusReport, Timings, TokenBytesEvent, TokenEvent, TokenLogprobs, ToolCall,
    ToolCallDeltaEvent, ToolCallEvent, ToolCallOpening, ToolChoice, ToolSpec, Usage,
};

/// The model the fake has "loaded".
pub const MODEL: &str = "fake-model";
/// What every successful generation says, token by token. The empty piece stands for a
/// token that only holds part of a UTF-8 character.
pub const PIECES: &[&str] = &["Hel", "lo", "", ",", " world"];
/// The arguments of every call the fake makes.
pub const CALL_ARGUMENTS: &str = r#"{"city":"Paris","unit":"celsius"}"#;
/// The pieces it streams them in (`StreamToolCalls`), the first with the call's opening.
pub const CALL_ARGUMENT_PIECES: &[&str] = &[r#"{"city":"#, r#""Paris","unit""#, r#":"celsius"}"#];

/// What the next calls do.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Behaviour {
    Reply,
    /// `generate` succeeds, then the first event is a Busy refusal (as the real client does).
    Busy,
    /// Every call fails: no daemon.
    Unavailable,
    /// The engine fails after two tokens.
    EngineErrorMidStream,
    /// One token, then nothing until the stream is dropped.
    Hang,
    /// Nothing at all (a long queue or prefill) until the stream is dropped.
    HangBeforeFirstToken,
    /// A thinking model: `REASONING` (each piece a `Reasoning` event and an empty
    /// `Token`), then the usual answer.
    Think,
    /// As `Reply`, but each call comes whole even when asked for in pieces, as from a
    /// daemon older than protocol 1.9.
    WholeCalls,
    /// `SPLIT_TEXT`, whose emoji takes two tokens, each with logprobs preceded by its
    /// raw bytes, as a daemon speaking protocol 1.11 sends them (logprobs always).
    SplitCharacter,
}

/// What `SplitCharacter` answers: "Hi " then 😊 (F0 9F 98 8A) over two tokens.
pub const SPLIT_TEXT: &str = "Hi \u{1F60A}";

/// What a thinking fake reasons, token by token, before its answer.
pub const REASONING: &[&str] = &["The user", " greets", "; greet back."];

pub struct FakeBackend {
    behaviour: Mutex<Behaviour>,
    next_id: AtomicU64,
    /// Every request `generate` received, ids assigned.
    pub requests: Mutex<Vec<GenerateRequest>>,
    /// The output format of each of them.
    pub formats: Mutex<Vec<OutputFormat>>,
    /// The options of each of them.
    pub options: Mutex<Vec<Vec<GenerateOption>>>,
    /// Generations dropped before their `Done` (what cancels the job in the real daemon).
    pub cancelled: AtomicUsize,
    pub cancelled_notify: Notify,
}

impl FakeBackend {
    pub fn new(behaviour: Behaviour) -> Arc<Self> {
        Arc::new(Self {
            behaviour: Mutex::new(behaviour),
            next_id: AtomicU64::new(1),
            requests: Mutex::new(Vec::new()),
            formats: Mutex::new(Vec::new()),
            options: Mutex::new(Vec::new()),
            cancelled: AtomicUsize::new(0),
            cancelled_notify: Notify::new(),
        })
    }

    pub fn set(&self, behaviour: Behaviour) {
        *self.behaviour.lock().unwrap() = behaviour;
    }

    fn behaviour(&self) -> Behaviour {
        *self.behaviour.lock().unwrap()
    }

    pub fn last_request(&self) -> GenerateRequest {
        self.requests
            .lock()
            .unwrap()
            .last()
            .cloned()
            .expect("no generate call")
    }
}

/// The prompt's "token count": its characters, so tests can tell requests apart by their
/// timings (`ttft_ms` = 1.5 ms per prompt token).
pub fn prompt_tokens(input: &PromptInput) -> u32 {
    let chars = match input {
        PromptInput::Chat { messages } => messages.iter().map(|m| m.content.chars().count()).sum(),
        PromptInput::ChatWithTools { messages, .. } => messages
            .iter()
            .filter_map(|m| m.content.as_deref())
            .map(|c| c.chars().count())
            .sum(),
        PromptInput::Raw { text, .. } => text.chars().count(),
    };
    chars as u32
}

/// The prompt tokens the fake "took from its cache": half, so that tests can tell the
/// figure from the prompt's length.
pub fn cached_tokens(prompt: u32) -> u32 {
    prompt / 2
}

pub fn timings_for(prompt: u32, completion: u32) -> Timings {
    let decode_ms = 4.0 * f64::from(completion.saturating_sub(1));
    Timings {
        queue_ms: 0.5,
        ttft_ms: Some(1.5 * f64::from(prompt)),
        prefill_ms: 1.0 * f64::from(prompt),
        generation_ms: decode_ms + 0.25,
        decode_ms,
        decode_tps: (completion > 1).then(|| f64::from(completion - 1) / decode_ms * 1000.0),
        prefill_tps: (prompt > 0).then_some(1000.0),
    }
}

fn token(id: u64, index: usize, piece: &str, logprobs: Option<u8>) -> TokenEvent {
    let lp = -0.25 * (index as f32 + 1.0);
    TokenEvent {
        id,
        token: 100 + index as u32,
        text: piece.to_string(),
        logprobs: logprobs.map(|n| TokenLogprobs {
            logprob: lp,
            top: (0..n)
                .map(|k| (200 + u32::from(k), format!("alt{k}"), lp - f32::from(k)))
                .collect(),
        }),
    }
}

/// What a chat with tools gets: whether it answers in text, and the functions it calls.
/// `auto` says its text and then calls the first tool; `required` calls the first tool,
/// or the first two when parallel calls are allowed; a named function is called alone;
/// `none` (or no tools) is a plain answer.
pub fn planned_calls(input: &PromptInput) -> (bool, Vec<&str>) {
    let PromptInput::ChatWithTools {
        tools,
        choice,
        parallel,
        ..
    } = input
    else {
        return (true, Vec::new());
    };
    let names: Vec<&str> = tools.iter().map(|t: &ToolSpec| t.name.as_str()).collect();
    match choice {
        _ if names.is_empty() => (true, Vec::new()),
        ToolChoice::None => (true, Vec::new()),
        ToolChoice::Auto => (true, names[..1].to_vec()),
        ToolChoice::Required if *parallel => (false, names.into_iter().take(2).collect()),
        ToolChoice::Required => (false, names[..1].to_vec()),
        ToolChoice::Function(name) => (false, vec![name.as_str()]),
    }
}

/// The id the fake gives call `index` of generation `id`.
pub fn call_id(id: u64, index: u32) -> String {
    format!("call_{id}_{index}")
}

fn tool_call(id: u64, index: usize, name: &str) -> BackendEvent {
    let index = index as u32;
    BackendEvent::ToolCall(ToolCallEvent {
        id,
        index,
        call: ToolCall {
            id: call_id(id, index),
            name: name.to_string(),
            arguments: CALL_ARGUMENTS.to_string(),
        },
    })
}

/// Counts a cancellation when the hanging stream that owns it is dropped.
struct DropGuard(Option<Arc<FakeBackend>>);

impl Drop for DropGuard {
    fn drop(&mut self) {
        if let Some(fake) = self.0.take() {
            fake.cancelled.fetch_add(1, Ordering::SeqCst);
            fake.cancelled_notify.notify_waiters();
        }
    }
}

/// Call `index` of generation `id` as the daemon streams it: its opening with the first
/// piece of its arguments, the other pieces, then the whole call; cut short, only the
/// opening and the first piece.
fn streamed_call(id: u64, index: usize, name: &str, cut: bool) -> Vec<BackendEvent> {
    let index32 = index as u32;
    let mut events: Vec<BackendEvent> = CALL_ARGUMENT_PIECES
        .iter()
        .enumerate()
        .map(|(i, piece)| {
            BackendEvent::ToolCallDelta(ToolCallDeltaEvent {
                id,
                index: index32,
                opening: (i == 0).then(|| ToolCallOpening {
                    id: call_id(id, index32),
                    name: name.to_string(),
                }),
                arguments: piece.to_string(),
            })
        })
        .collect();
    if cut {
        events.truncate(1);
    } else {
        events.push(tool_call(id, index, name));
    }
    events
}

impl FakeBackend {
    fn reply(self: &Arc<Self>, req: &GenerateRequest, stream_calls: bool) -> EventStream {
        self.reply_thinking(req, &[], stream_calls)
    }

    /// As `reply`, with `reasoning` before the answer (one token each).
    fn reply_thinking(
        self: &Arc<Self>,
        req: &GenerateRequest,
        reasoning: &[&str],
        stream_calls: bool,
    ) -> EventStream {
        let id = req.id;
        let prompt = prompt_tokens(&req.input);
        let (says_text, calls) = planned_calls(&req.input);
        let pieces = if says_text { PIECES } else { &[] };
        let limit = req
            .max_tokens
            .map_or(pieces.len(), |m| (m as usize).min(pieces.len()));
        // Like the daemon: how the prompt was read, before the first token.
        let prefill = BackendEvent::Prefilled(PrefillEvent {
            id,
            prompt_tokens: prompt,
            cached_tokens: cached_tokens(prompt),
        });
        // Calls come after the text, whole; a text cut short by max_tokens stands for a
        // later call cut short, so the answer still ends with `Length`. Streamed, such
        // a call is its first pieces and no more.
        let cut = limit < pieces.len();
        let call_events: Vec<BackendEvent> = if stream_calls {
            let calls = if cut {
                &calls[..calls.len().min(1)]
            } else {
                &calls[..]
            };
            calls
                .iter()
                .enumerate()
                .flat_map(|(i, name)| streamed_call(id, i, name, cut))
                .collect()
        } else {
            calls
                .iter()
                .enumerate()
                .map(|(i, name)| tool_call(id, i, name))
                .collect()
        };
        let thinking = reasoning.iter().enumerate().flat_map(|(i, text)| {
            [
                Ok(BackendEvent::Reasoning(ReasoningEvent {
                    id,
                    text: text.to_string(),
                })),
                Ok(BackendEvent::Token(token(id, 1000 + i, "", None))),
            ]
        });
        let mut events: Vec<Result<BackendEvent, BackendError>> = std::iter::once(Ok(prefill))
            .chain(thinking)
            .chain(
                pieces[..limit]
                    .iter()
                    .enumerate()
                    .map(|(i, p)| Ok(BackendEvent::Token(token(id, i, p, req.logprobs)))),
            )
            .chain(call_events.into_iter().map(Ok))
            .collect();
        let finish = if cut {
            FinishReason::Length
        } else {
            FinishReason::Stop
        };
        let completion = (reasoning.len() + limit + calls.len()) as u32;
        events.push(Ok(BackendEvent::Done(DoneEvent {
            id,
            finish_reason: finish,
            usage: Usage {
                prompt_tokens: prompt,
                completion_tokens: completion,
            },
            timings: timings_for(prompt, completion),
        })));
        stream::iter(events).boxed()
    }

    fn hang(self: &Arc<Self>, req: &GenerateRequest, first_token: bool) -> EventStream {
        let mut guard = DropGuard(Some(self.clone()));
        let first = Ok(BackendEvent::Token(token(
            req.id,
            0,
            PIECES[0],
            req.logprobs,
        )));
        let first = if first_token { vec![first] } else { Vec::new() };
        stream::iter(first)
            .chain(stream::pending())
            .map(move |event| {
                // The guard lives as long as the stream: a hanging generation never
                // reaches `Done`, so its end can only be a drop.
                let _ = &mut guard;
                event
            })
            .boxed()
    }

    /// Three tokens: "Hi ", the emoji's first two bytes (no text yet), its last two
    /// (its whole text). Each token's one alternative is partial too (F0 9F 98 and
    /// F0 9F 99): shown as U+FFFD by the `String`s, told apart by the bytes.
    fn split_character(self: &Arc<Self>, req: &GenerateRequest) -> EventStream {
        let id = req.id;
        let tokens: [(&[u8], &str); 3] = [
            (b"Hi ", "Hi "),
            (&[0xF0, 0x9F], ""),
            (&[0x98, 0x8A], "\u{1F60A}"),
        ];
        let mut events = vec![Ok(BackendEvent::Prefilled(PrefillEvent {
            id,
            prompt_tokens: 4,
            cached_tokens: 0,
        }))];
        for (i, (bytes, text)) in tokens.into_iter().enumerate() {
            let alternative: &[u8] = if i == 0 {
                &[0xF0, 0x9F, 0x98]
            } else {
                &[0xF0, 0x9F, 0x99]
            };
            events.push(Ok(BackendEvent::TokenBytes(TokenBytesEvent {
                id,
                bytes: bytes.to_vec(),
                top: vec![alternative.to_vec()],
            })));
            events.push(Ok(BackendEvent::Token(TokenEvent {
                id,
                token: 300 + i as u32,
                text: text.into(),
                logprobs: Some(TokenLogprobs {
                    logprob: -0.5,
                    top: vec![(400 + i as u32, "\u{FFFD}".into(), -1.0 - i as f32)],
                }),
            })));
        }
        events.push(Ok(BackendEvent::Done(DoneEvent {
            id,
            finish_reason: FinishReason::Stop,
            usage: Usage {
                prompt_tokens: 4,
                completion_tokens: 3,
            },
            timings: timings_for(4, 3),
        })));
        stream::iter(events).boxed()
    }

    fn engine_error(self: &Arc<Self>, req: &GenerateRequest) -> EventStream {
        let id = req.id;
        let events = vec![
            Ok(BackendEvent::Token(token(id, 0, PIECES[0], None))),
            Ok(BackendEvent::Token(token(id, 1, PIECES[1], None))),
            Err(BackendError::Engine("out of memory".into())),
        ];
        stream::iter(events).boxed()
    }
}

pub fn model_info() -> ModelInfo {
    ModelInfo {
        name: MODEL.into(),
        path: "/models/fake.gguf".into(),
        architecture: "llama".into(),
        quantization: "Q4_1".into(),
        parameters: 135_000_000,
        context_length: 2048,
        file_bytes: 90_000_000,
    }
}

pub fn status_report() -> StatusReport {
    StatusReport {
        daemon_version: "0.1.0-fake".into(),
        model: model_info(),
        backend: "cpu".into(),
        device: "fake cpu".into(),
        resident_bytes: 1,
        uptime_s: 2.0,
        running: 3,
        queued: 4,
        kv_blocks_used: 5,
        kv_blocks_total: 6,
        kv_block_tokens: 16,
        requests_served: 7,
        tokens_generated: 8,
        prompt_tokens_processed: 9,
    }
}

pub fn cache_report() -> CacheReport {
    CacheReport {
        enabled: true,
        cached_blocks: 10,
        idle_blocks: 11,
        evicted_blocks: 12,
        prompt_tokens_reused: 13,
    }
}

pub fn chat_format_report() -> ChatFormatReport {
    ChatFormatReport {
        template: true,
        tools: "mistral-args".into(),
        system_role: true,
        think_open: "[THINK]".into(),
        think_close: "[/THINK]".into(),
        variables: vec!["enable_thinking".into(), "reasoning_effort".into()],
    }
}

fn unavailable() -> BackendError {
    BackendError::Unavailable("sparkd is not running (no daemon answers on /tmp/x.sock)".into())
}

/// The `Backend` impl lives on `Arc<FakeBackend>` so streams can hold the fake.
pub struct SharedFake(pub Arc<FakeBackend>);

impl Backend for SharedFake {
    fn generate(
        &self,
        mut req: GenerateRequest,
        format: OutputFormat,
        options: Vec<GenerateOption>,
    ) -> BoxFuture<'_, Result<EventStream, BackendError>> {
        Box::pin(async move {
            let fake = &self.0;
            req.id = fake.next_id.fetch_add(1, Ordering::SeqCst);
            fake.requests.lock().unwrap().push(req.clone());
            fake.formats.lock().unwrap().push(format);
            fake.options.lock().unwrap().push(options);
            if let Some(model) = &req.model {
                if model != MODEL {
                    let err = BackendError::Rejected {
                        kind: ErrorKind::UnknownModel,
                        message: format!("no model named '{model}' is loaded"),
                    };
                    return Ok(stream::iter([Err(err)]).boxed());
                }
            }
            let stream_calls = fake
                .options
                .lock()
                .unwrap()
                .last()
                .is_some_and(|o| o.contains(&GenerateOption::StreamToolCalls));
            Ok(match fake.behaviour() {
                Behaviour::Reply => fake.reply(&req, stream_calls),
                Behaviour::WholeCalls => fake.reply(&req, false),
                Behaviour::SplitCharacter => fake.split_character(&req),
                Behaviour::Busy => {
                    stream::iter([Err(BackendError::Busy("queue full (64 waiting)".into()))])
                        .boxed()
                }
                Behaviour::Unavailable => return Err(unavailable()),
                Behaviour::EngineErrorMidStream => fake.engine_error(&req),
                Behaviour::Hang => fake.hang(&req, true),
                Behaviour::HangBeforeFirstToken => fake.hang(&req, false),
                Behaviour::Think => fake.reply_thinking(&req, REASONING, stream_calls),
            })
        })
    }

    fn models(&self) -> BoxFuture<'_, Result<Vec<ModelInfo>, BackendError>> {
        Box::pin(async move {
            match self.0.behaviour() {
                Behaviour::Unavailable => Err(unavailable()),
                _ => Ok(vec![model_info()]),
            }
        })
    }

    fn status(&self) -> BoxFuture<'_, Result<StatusReport, BackendError>> {
        Box::pin(async move {
            match self.0.behaviour() {
                Behaviour::Unavailable => Err(unavailable()),
                _ => Ok(status_report()),
            }
        })
    }

    fn chat_format(&self) -> BoxFuture<'_, Result<ChatFormatReport, BackendError>> {
        Box::pin(async move {
            match self.0.behaviour() {
                Behaviour::Unavailable => Err(unavailable()),
                _ => Ok(chat_format_report()),
            }
        })
    }

    fn cache_status(&self) -> BoxFuture<'_, Result<CacheReport, BackendError>> {
        Box::pin(async move {
            match self.0.behaviour() {
                Behaviour::Unavailable => Err(unavailable()),
                _ => Ok(cache_report()),
            }
        })
    }

    fn jobs(&self, limit: u32) -> BoxFuture<'_, Result<Vec<JobEntry>, BackendError>> {
        Box::pin(async move {
            if self.0.behaviour() == Behaviour::Unavailable {
                return Err(unavailable());
            }
            let job = |n: u64| JobRecord {
                job: n,
                request_id: n,
                client_pid: Some(42),
                client_uid: Some(1000),
                model: MODEL.into(),
                engine: "sparkd".into(),
                started_unix_ms: 1_000 * n,
                finished_unix_ms: 1_000 * n + 500,
                usage: Usage {
                    prompt_tokens: 3,
                    completion_tokens: 5,
                },
                timings: timings_for(3, 5),
                finish_reason: FinishReason::Stop,
                estimated: false,
            };
            let entry = |n: u64| JobEntry {
                record: job(n),
                cached_tokens: Some(cached_tokens(3)),
            };
            Ok((0..u64::from(limit.min(3))).rev().map(entry).collect())
        })
    }
}

/// A running shim over a fake backend.
pub struct TestServer {
    pub base: String,
    pub fake: Arc<FakeBackend>,
    pub shutdown: CancellationToken,
    pub task: tokio::task::JoinHandle<()>,
}

impl TestServer {
    pub async fn start(behaviour: Behaviour, options: RouterOptions) -> Self {
        Self::start_on("127.0.0.1:0".parse().unwrap(), behaviour, options).await
    }

    pub async fn start_on(addr: SocketAddr, behaviour: Behaviour, options: RouterOptions) -> Self {
        let fake = FakeBackend::new(behaviour);
        let shutdown = CancellationToken::new();
        let key = options.api_key.clone();
        let listener = bind(addr, key.as_deref()).await.expect("bind");
        let addr = listener.local_addr().expect("local addr");
        let app = router(
            Arc::new(SharedFake(fake.clone())),
            options,
            shutdown.clone(),
        );
        let task = tokio::spawn({
            let shutdown = shutdown.clone();
            async move { serve(listener, app, shutdown).await.expect("serve") }
        });
        Self {
            base: format!("http://{addr}"),
            fake,
            shutdown,
            task,
        }
    }

    pub fn url(&self, path: &str) -> String {
        format!("{}{path}", self.base)
    }
}
