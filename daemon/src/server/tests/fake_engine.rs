//! A stand-in engine for the server tests: streams a fixed number of tokens per request
//! on a tokio task, honours cancel, and records what the server asked of it.

use std::{
    collections::HashMap,
    sync::{Arc, Mutex, MutexGuard},
    time::{Duration, Instant},
};

use spark_client::protocol::{
    CacheReport, ChatFormatReport, DoneEvent, ErrorEvent, ErrorKind, FinishReason, GenerateOption,
    JobEntry, JobRecord, ModelInfo, OutputFormat, PrefillEvent, PromptInput, ServerMessage,
    StatusReport, Timings, TokenEvent, TokenPiece, Usage,
};
use tokio_util::sync::CancellationToken;

use crate::engine::{ClientInfo, ConnId, Engine, Submission};

/// A prompt the fake refuses with `Busy`, as a full queue would.
pub const BUSY_PROMPT: &str = "please be busy";
/// A prompt on which the fake fails mid-generation (an `Error`, then `Done{Error}`).
pub const FAIL_PROMPT: &str = "please fail";
pub const PROMPT_TOKENS: u32 = 3;
/// Of which the fake "took from its cache".
pub const PROMPT_CACHED_TOKENS: u32 = 2;

/// What the fake says of its prefix cache.
pub const CACHE_REPORT: CacheReport = CacheReport {
    enabled: true,
    cached_blocks: 21,
    idle_blocks: 8,
    evicted_blocks: 5,
    prompt_tokens_reused: 336,
};

pub struct FakeEngine {
    token_delay: Duration,
    token_text_bytes: usize,
    /// Sends `Prefilled` before the first token, as the real engine does. Off by
    /// default, so that most tests read plain token streams.
    prefill: bool,
    state: Arc<Mutex<State>>,
}

#[derive(Default)]
struct State {
    running: HashMap<(ConnId, u64), Running>,
    submissions: Vec<(ConnId, ClientInfo, u64)>,
    formats: Vec<(u64, OutputFormat)>,
    options: Vec<(u64, Vec<GenerateOption>)>,
    /// (request id, split_reasoning, token_bytes): what the server says the client reads.
    reads: Vec<(u64, bool, bool)>,
    cancels: Vec<(ConnId, u64, FinishReason)>,
    connection_cancels: Vec<ConnId>,
    finished: Vec<((ConnId, u64), FinishReason, u32)>,
    shut_down: bool,
}

struct Running {
    stop: CancellationToken,
    reason: Arc<Mutex<Option<FinishReason>>>,
}

impl FakeEngine {
    pub fn new(token_delay: Duration) -> Arc<Self> {
        Self::with_text(token_delay, 0)
    }

    /// Every token's text is `token_text_bytes` long (0: a short `t<n> `).
    pub fn with_text(token_delay: Duration, token_text_bytes: usize) -> Arc<Self> {
        Arc::new(Self {
            token_delay,
            token_text_bytes,
            prefill: false,
            state: Arc::default(),
        })
    }

    /// Tells how each prompt was read (`Prefilled`) before its first token.
    pub fn with_prefill(token_delay: Duration) -> Arc<Self> {
        Arc::new(Self {
            token_delay,
            token_text_bytes: 0,
            prefill: true,
            state: Arc::default(),
        })
    }

    fn lock(&self) -> MutexGuard<'_, State> {
        lock(&self.state)
    }

    pub fn submissions(&self) -> Vec<(ConnId, ClientInfo, u64)> {
        self.lock().submissions.clone()
    }

    /// (request id, options) of every submission, as the engine got them.
    pub fn options(&self) -> Vec<(u64, Vec<GenerateOption>)> {
        self.lock().options.clone()
    }

    /// (request id, split_reasoning, token_bytes) of every submission: which events
    /// the server told the engine the client can decode.
    pub fn reads(&self) -> Vec<(u64, bool, bool)> {
        self.lock().reads.clone()
    }

    /// (request id, output format) of every submission.
    pub fn formats(&self) -> Vec<(u64, OutputFormat)> {
        self.lock().formats.clone()
    }

    pub fn cancels(&self) -> Vec<(ConnId, u64, FinishReason)> {
        self.lock().cancels.clone()
    }

    pub fn connection_cancels(&self) -> Vec<ConnId> {
        self.lock().connection_cancels.clone()
    }

    /// (request id, finish reason, tokens sent) of every ended generation.
    pub fn finished(&self) -> Vec<(u64, FinishReason, u32)> {
        self.lock()
            .finished
            .iter()
            .map(|&((_, id), reason, n)| (id, reason, n))
            .collect()
    }

    pub fn running(&self) -> usize {
        self.lock().running.len()
    }

    /// Ends every generation with `Shutdown` and refuses new ones, as the real engine
    /// does when the daemon stops.
    pub fn shutdown(&self) {
        let mut state = self.lock();
        state.shut_down = true;
        for running in state.running.values() {
            running.stop_with(FinishReason::Shutdown);
        }
    }

    fn stop(&self, key: (ConnId, u64), reason: FinishReason) {
        if let Some(running) = self.lock().running.get(&key) {
            running.stop_with(reason);
        }
    }
}

impl Running {
    fn stop_with(&self, reason: FinishReason) {
        lock(&self.reason).get_or_insert(reason);
        self.stop.cancel();
    }
}

fn lock<T>(mutex: &Mutex<T>) -> MutexGuard<'_, T> {
    mutex
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner())
}

fn prompt_text(input: &PromptInput) -> &str {
    match input {
        PromptInput::Raw { text, .. } => text,
        PromptInput::Chat { messages } => messages.last().map_or("", |m| m.content.as_str()),
        PromptInput::ChatWithTools { messages, .. } => messages
            .last()
            .and_then(|m| m.content.as_deref())
            .unwrap_or(""),
    }
}

impl Engine for FakeEngine {
    fn submit(&self, submission: Submission) -> Result<(), ErrorEvent> {
        let Submission {
            conn,
            client,
            request,
            format,
            options,
            split_reasoning,
            token_bytes,
            arrived,
            events,
        } = submission;
        let id = request.id;
        let prompt = prompt_text(&request.input).to_owned();
        let mut state = self.lock();
        if state.shut_down {
            return Err(ErrorEvent {
                id: Some(id),
                kind: ErrorKind::ShuttingDown,
                message: "stopping".into(),
            });
        }
        if prompt == BUSY_PROMPT {
            // Deliberately without an id: the server must fill it in.
            return Err(ErrorEvent {
                id: None,
                kind: ErrorKind::Busy,
                message: "queue full".into(),
            });
        }
        state.submissions.push((conn, client, id));
        state.formats.push((id, format));
        state.options.push((id, options));
        state.reads.push((id, split_reasoning, token_bytes));
        let stop = CancellationToken::new();
        let reason = Arc::new(Mutex::new(None));
        state.running.insert(
            (conn, id),
            Running {
                stop: stop.clone(),
                reason: Arc::clone(&reason),
            },
        );
        drop(state);

        let total = request.max_tokens.unwrap_or(5);
        let delay = self.token_delay;
        let text_bytes = self.token_text_bytes;
        let prefill = self.prefill;
        let shared = Arc::clone(&self.state);
        tokio::spawn(async move {
            let mut sent = 0;
            let mut first_token = None;
            let mut finish = FinishReason::Length;
            for n in 0..total {
                tokio::select! {
                    _ = stop.cancelled() => {
                        finish = lock(&reason).unwrap_or(FinishReason::Cancelled);
                        break;
                    }
                    _ = tokio::time::sleep(delay) => {}
                }
                if prompt == FAIL_PROMPT && n == 1 {
                    let error = ErrorEvent {
                        id: Some(id),
                        kind: ErrorKind::Engine,
                        message: "boom".into(),
                    };
                    let _ = events.send(ServerMessage::Error(error));
                    finish = FinishReason::Error;
                    break;
                }
                if n == 0 && prefill {
                    // Like the engine: how the prompt was read, before the first token.
                    let prefill = PrefillEvent {
                        id,
                        prompt_tokens: PROMPT_TOKENS,
                        cached_tokens: PROMPT_CACHED_TOKENS,
                    };
                    let _ = events.send(ServerMessage::Prefilled(prefill));
                }
                let text = if text_bytes == 0 {
                    format!("t{n} ")
                } else {
                    "x".repeat(text_bytes)
                };
                if events
                    .send(ServerMessage::Token(TokenEvent {
                        id,
                        token: n,
                        text,
                        logprobs: None,
                    }))
                    .is_err()
                {
                    finish = FinishReason::Disconnected;
                    break;
                }
                first_token.get_or_insert_with(Instant::now);
                sent += 1;
            }
            let timings = Timings {
                ttft_ms: first_token.map(|t| t.duration_since(arrived).as_secs_f64() * 1e3),
                ..Timings::default()
            };
            let done = DoneEvent {
                id,
                finish_reason: finish,
                usage: Usage {
                    prompt_tokens: PROMPT_TOKENS,
                    completion_tokens: sent,
                },
                timings,
            };
            let _ = events.send(ServerMessage::Done(done));
            let mut state = lock(&shared);
            state.running.remove(&(conn, id));
            state.finished.push(((conn, id), finish, sent));
        });
        Ok(())
    }

    fn cancel(&self, conn: ConnId, request_id: u64, reason: FinishReason) {
        self.lock().cancels.push((conn, request_id, reason));
        self.stop((conn, request_id), reason);
    }

    fn cancel_connection(&self, conn: ConnId) {
        let mut state = self.lock();
        state.connection_cancels.push(conn);
        for ((c, _), running) in &state.running {
            if *c == conn {
                running.stop_with(FinishReason::Disconnected);
            }
        }
    }

    fn tokenize(&self, text: &str, _special: bool) -> Result<Vec<TokenPiece>, ErrorEvent> {
        if text.is_empty() {
            return Err(ErrorEvent {
                id: None,
                kind: ErrorKind::InvalidRequest,
                message: "empty text".into(),
            });
        }
        Ok(text
            .split_inclusive(' ')
            .enumerate()
            .map(|(n, piece)| TokenPiece {
                id: n as u32 + 100,
                piece: piece.to_owned(),
            })
            .collect())
    }

    fn status(&self) -> StatusReport {
        let state = self.lock();
        StatusReport {
            daemon_version: "fake".into(),
            model: model(),
            backend: "cpu".into(),
            device: "fake".into(),
            resident_bytes: 1 << 20,
            uptime_s: 1.5,
            running: state.running.len() as u32,
            queued: 0,
            kv_blocks_used: 0,
            kv_blocks_total: 64,
            kv_block_tokens: 16,
            requests_served: state.finished.len() as u64,
            tokens_generated: state.finished.iter().map(|f| u64::from(f.2)).sum(),
            prompt_tokens_processed: 0,
        }
    }

    fn cache_status(&self) -> CacheReport {
        CACHE_REPORT
    }

    fn chat_format(&self) -> ChatFormatReport {
        ChatFormatReport {
            template: true,
            tools: "hermes".into(),
            system_role: true,
            think_open: "<think>".into(),
            think_close: "</think>".into(),
            variables: vec!["enable_thinking".into()],
        }
    }

    fn jobs(&self, limit: usize) -> Vec<JobEntry> {
        let state = self.lock();
        state
            .finished
            .iter()
            .rev()
            .take(limit)
            .enumerate()
            .map(|(n, &((_, id), reason, sent))| JobEntry {
                record: JobRecord {
                    job: n as u64,
                    request_id: id,
                    client_pid: None,
                    client_uid: None,
                    model: "fake".into(),
                    engine: "sparkd".into(),
                    started_unix_ms: 0,
                    finished_unix_ms: 0,
                    usage: Usage {
                        prompt_tokens: PROMPT_TOKENS,
                        completion_tokens: sent,
                    },
                    timings: Timings::default(),
                    finish_reason: reason,
                    estimated: false,
                },
                cached_tokens: Some(PROMPT_CACHED_TOKENS),
            })
            .collect()
    }

    fn models(&self) -> Vec<ModelInfo> {
        vec![model()]
    }
}

fn model() -> ModelInfo {
    ModelInfo {
        name: "fake-model".into(),
        path: "/dev/null".into(),
        architecture: "llama".into(),
        quantization: "Q4_1".into(),
        parameters: 135_000_000,
        context_length: 2048,
        file_bytes: 1,
    }
}
