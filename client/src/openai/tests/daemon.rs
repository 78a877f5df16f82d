//! The shim over the real `Client` and a fake daemon that speaks the wire protocol on a
//! Unix socket: lazy connection, reconnection after a restart, cancellation on hang-up.

use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use futures::{SinkExt, StreamExt};
use serde_json::{json, Value};
use tokio::net::{UnixListener, UnixStream};
use tokio::sync::{mpsc, oneshot, Notify};
use tokio_util::codec::Framed;
use tokio_util::sync::CancellationToken;

use super::client;
use super::fake::{model_info, status_report, timings_for};
use crate::codec::MessageCodec;
use crate::openai::{bind, router, serve, DaemonBackend, RouterOptions};
use crate::protocol::{
    ClientMessage, DoneEvent, ErrorEvent, ErrorKind, FinishReason, GenerateOption, GenerateRequest,
    OutputFormat, PromptInput, ServerMessage, TokenEvent, ToolCall, ToolCallEvent, ToolChatMessage,
    ToolChoice, ToolSpec, Usage, Welcome, PROTOCOL_MAJOR, PROTOCOL_MINOR,
};

const PIECES: &[&str] = &["Bon", "jour"];

/// What the fake daemon saw.
#[derive(Default)]
struct Seen {
    cancels: Mutex<Vec<u64>>,
    /// The output format of each generation, as the daemon received it.
    formats: Mutex<Vec<OutputFormat>>,
    /// The input of each generation, as the daemon received it.
    inputs: Mutex<Vec<PromptInput>>,
    /// The options of each `GenerateWith`.
    options: Mutex<Vec<Vec<GenerateOption>>>,
    /// The protocol minor the daemon announces, when older than this crate's.
    old_minor: Option<u16>,
    cancel_notify: Notify,
    connections: AtomicUsize,
}

struct FakeDaemon {
    seen: Arc<Seen>,
    stop: CancellationToken,
    task: tokio::task::JoinHandle<()>,
}

impl FakeDaemon {
    fn start(path: &PathBuf, seen: Arc<Seen>) -> Self {
        let _ = std::fs::remove_file(path);
        let listener = UnixListener::bind(path).expect("bind unix socket");
        let stop = CancellationToken::new();
        let task = tokio::spawn({
            let (seen, stop) = (seen.clone(), stop.clone());
            async move {
                loop {
                    tokio::select! {
                        _ = stop.cancelled() => break,
                        accepted = listener.accept() => {
                            let Ok((stream, _)) = accepted else { break };
                            seen.connections.fetch_add(1, Ordering::SeqCst);
                            tokio::spawn(connection(stream, seen.clone(), stop.clone()));
                        }
                    }
                }
            }
        });
        Self { seen, stop, task }
    }

    /// Like the daemon's shutdown: a connection-level `ShuttingDown`, then close.
    async fn stop(self) {
        self.stop.cancel();
        let _ = self.task.await;
        // Let connection tasks send their goodbye.
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

async fn connection(stream: UnixStream, seen: Arc<Seen>, stop: CancellationToken) {
    let mut framed = Framed::new(
        stream,
        MessageCodec::<ClientMessage, ServerMessage>::new(1 << 20),
    );
    let (out_tx, mut out_rx) = mpsc::unbounded_channel::<ServerMessage>();
    // Generations that wait for their `Cancel`.
    let mut hanging: HashMap<u64, oneshot::Sender<()>> = HashMap::new();
    loop {
        tokio::select! {
            _ = stop.cancelled() => {
                let bye = ErrorEvent { id: None, kind: ErrorKind::ShuttingDown, message: "shutting down".into() };
                let _ = framed.send(ServerMessage::Error(bye)).await;
                return;
            }
            Some(out) = out_rx.recv() => {
                if framed.send(out).await.is_err() { return; }
            }
            frame = framed.next() => {
                let Some(Ok(message)) = frame else { return };
                let reply = match message {
                    ClientMessage::Hello(_) => Some(ServerMessage::Welcome(Welcome {
                        major: PROTOCOL_MAJOR,
                        minor: seen.old_minor.unwrap_or(PROTOCOL_MINOR),
                        daemon_version: "fake".into(),
                        max_frame_bytes: 1 << 20,
                    })),
                    ClientMessage::Generate(request) => {
                        start(&seen, &mut hanging, request, OutputFormat::Text, &out_tx);
                        None
                    }
                    ClientMessage::GenerateFormatted { request, format } => {
                        start(&seen, &mut hanging, request, format, &out_tx);
                        None
                    }
                    ClientMessage::GenerateWith { request, format, options } => {
                        seen.options.lock().unwrap().push(options);
                        start(&seen, &mut hanging, request, format, &out_tx);
                        None
                    }
                    ClientMessage::Cancel { id } => {
                        seen.cancels.lock().unwrap().push(id);
                        seen.cancel_notify.notify_waiters();
                        if let Some(tx) = hanging.remove(&id) { let _ = tx.send(()); }
                        None
                    }
                    ClientMessage::Status { id } => Some(ServerMessage::Status { id, status: status_report() }),
                    ClientMessage::Models { id } => Some(ServerMessage::Models { id, models: vec![model_info()] }),
                    ClientMessage::Jobs { id, .. } => Some(ServerMessage::Jobs { id, jobs: Vec::new() }),
                    ClientMessage::Tokenize { id, .. } => Some(ServerMessage::Tokens { id, tokens: Vec::new() }),
                    ClientMessage::RecordJob { id, job } => Some(ServerMessage::Recorded { id, job: job.to_record(77, None, None) }),
                    ClientMessage::CacheStatus { id } => Some(ServerMessage::CacheStatus { id, cache: super::fake::cache_report() }),
                    ClientMessage::ChatFormat { id } => Some(ServerMessage::ChatFormat { id, format: Default::default() }),
                    ClientMessage::JobEntries { id, .. } => Some(ServerMessage::JobEntries { id, jobs: Vec::new() }),
                };
                if let Some(reply) = reply {
                    if framed.send(reply).await.is_err() { return; }
                }
            }
        }
    }
}

/// Books a generation's format and starts it.
fn start(
    seen: &Seen,
    hanging: &mut HashMap<u64, oneshot::Sender<()>>,
    request: GenerateRequest,
    format: OutputFormat,
    out: &mpsc::UnboundedSender<ServerMessage>,
) {
    seen.formats.lock().unwrap().push(format);
    seen.inputs.lock().unwrap().push(request.input.clone());
    if let Some((id, cancel)) = generate(request, out.clone()) {
        hanging.insert(id, cancel);
    }
}

/// The call the fake daemon makes for a chat with tools (none when the choice is `None`).
fn tool_call_event(id: u64, input: &PromptInput) -> Option<ServerMessage> {
    let PromptInput::ChatWithTools { tools, choice, .. } = input else {
        return None;
    };
    let name = match choice {
        ToolChoice::None => return None,
        ToolChoice::Function(name) => name.clone(),
        ToolChoice::Auto | ToolChoice::Required => tools.first()?.name.clone(),
    };
    Some(ServerMessage::ToolCall(ToolCallEvent {
        id,
        index: 0,
        call: ToolCall {
            id: format!("call_fake{id}"),
            name,
            arguments: r#"{"city":"Oslo"}"#.into(),
        },
    }))
}

/// Answers a generation; a prompt `hang` sends one token and waits for `Cancel`, `busy`
/// is refused, a chat with tools gets the tokens and then a call. Returns the cancel hook
/// of a hanging generation.
fn generate(
    req: GenerateRequest,
    out: mpsc::UnboundedSender<ServerMessage>,
) -> Option<(u64, oneshot::Sender<()>)> {
    let id = req.id;
    let prompt = match &req.input {
        PromptInput::Chat { messages } => messages
            .last()
            .map(|m| m.content.clone())
            .unwrap_or_default(),
        PromptInput::ChatWithTools { messages, .. } => messages
            .last()
            .and_then(|m| m.content.clone())
            .unwrap_or_default(),
        PromptInput::Raw { text, .. } => text.clone(),
    };
    let call = tool_call_event(id, &req.input);
    let token = |i: usize| {
        ServerMessage::Token(TokenEvent {
            id,
            token: i as u32,
            text: PIECES[i].into(),
            logprobs: None,
        })
    };
    let done = move |reason, n: u32| {
        ServerMessage::Done(DoneEvent {
            id,
            finish_reason: reason,
            usage: Usage {
                prompt_tokens: 3,
                completion_tokens: n,
            },
            timings: timings_for(3, n),
        })
    };
    match prompt.as_str() {
        "busy" => {
            let busy = ErrorEvent {
                id: Some(id),
                kind: ErrorKind::Busy,
                message: "queue full".into(),
            };
            let _ = out.send(ServerMessage::Error(busy));
            None
        }
        "hang" => {
            let _ = out.send(token(0));
            let (tx, rx) = oneshot::channel();
            tokio::spawn(async move {
                if rx.await.is_ok() {
                    let _ = out.send(done(FinishReason::Cancelled, 1));
                }
            });
            Some((id, tx))
        }
        _ => {
            for i in 0..PIECES.len() {
                let _ = out.send(token(i));
            }
            if let Some(call) = call {
                let _ = out.send(call);
            }
            let _ = out.send(done(FinishReason::Stop, PIECES.len() as u32));
            None
        }
    }
}

fn socket_path(name: &str) -> PathBuf {
    std::env::temp_dir().join(format!("spark-openai-{}-{name}.sock", std::process::id()))
}

async fn start_shim(path: PathBuf) -> (String, CancellationToken) {
    let shutdown = CancellationToken::new();
    let listener = bind("127.0.0.1:0".parse().unwrap(), None).await.unwrap();
    let base = format!("http://{}", listener.local_addr().unwrap());
    let app = router(
        Arc::new(DaemonBackend::new(path)),
        RouterOptions::default(),
        shutdown.clone(),
    );
    tokio::spawn({
        let shutdown = shutdown.clone();
        async move { serve(listener, app, shutdown).await.unwrap() }
    });
    (base, shutdown)
}

fn chat(content: &str, stream: bool) -> Value {
    json!({"messages": [{"role": "user", "content": content}], "stream": stream})
}

async fn post_chat(base: &str, body: &Value) -> (u16, String) {
    let response = client()
        .post(format!("{base}/v1/chat/completions"))
        .json(body)
        .send()
        .await
        .unwrap();
    (response.status().as_u16(), response.text().await.unwrap())
}

async fn health(base: &str) -> u16 {
    client()
        .get(format!("{base}/health"))
        .send()
        .await
        .unwrap()
        .status()
        .as_u16()
}

#[tokio::test]
async fn generations_reach_the_daemon_through_the_real_client() {
    let path = socket_path("generate");
    let daemon = FakeDaemon::start(&path, Arc::default());
    let (base, _shutdown) = start_shim(path.clone()).await;

    let (status, text) = post_chat(&base, &chat("hi", false)).await;
    assert_eq!(status, 200, "{text}");
    let v: Value = serde_json::from_str(&text).unwrap();
    assert_eq!(v["choices"][0]["message"]["content"], PIECES.concat());
    assert_eq!(v["usage"]["ttft_ms"].as_f64(), timings_for(3, 2).ttft_ms);

    let (status, text) = post_chat(&base, &chat("busy", true)).await;
    assert_eq!(status, 429, "{text}");
    let models: Value = client()
        .get(format!("{base}/v1/models"))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(models["data"][0]["id"], model_info().name);
    // JSON output goes to the daemon as such.
    let mut body = chat("hi", false);
    body["response_format"] = serde_json::json!({"type": "json_object"});
    let (status, text) = post_chat(&base, &body).await;
    assert_eq!(status, 200, "{text}");
    assert_eq!(
        *daemon.seen.formats.lock().unwrap(),
        [
            OutputFormat::Text,
            OutputFormat::Text,
            OutputFormat::JsonObject
        ]
    );
    // Chat-template variables go as `GenerateWith`, the others as before.
    assert!(daemon.seen.options.lock().unwrap().is_empty());
    let mut body = chat("hi", false);
    body["chat_template_kwargs"] = serde_json::json!({"enable_thinking": false});
    let (status, text) = post_chat(&base, &body).await;
    assert_eq!(status, 200, "{text}");
    assert_eq!(
        *daemon.seen.options.lock().unwrap(),
        [vec![GenerateOption::TemplateVariables(
            r#"{"enable_thinking":false}"#.into()
        )]]
    );
    // A prompt within the shim's body limit (4 MiB) but over the daemon's frame limit
    // (1 MiB here) is the caller's to shorten: 413, and the connection stays up.
    let (status, text) = post_chat(&base, &chat(&"hello ".repeat(300_000), false)).await;
    assert_eq!(status, 413, "{text}");
    let error: Value = serde_json::from_str(&text).unwrap();
    assert_eq!(error["error"]["code"], "payload_too_large", "{text}");
    assert!(
        error["error"]["message"]
            .as_str()
            .unwrap()
            .contains("accepts at most 1048576"),
        "{text}"
    );
    let (status, text) = post_chat(&base, &chat("hi", false)).await;
    assert_eq!(status, 200, "{text}");
    // One shared connection for everything.
    assert_eq!(daemon.seen.connections.load(Ordering::SeqCst), 1);
    daemon.stop().await;
    let _ = std::fs::remove_file(&path);
}

fn weather_tool() -> Value {
    json!({"type": "function", "function": {
        "name": "get_weather", "description": "The weather in a city",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}},
                       "required": ["city"]},
        "strict": true,
    }})
}

#[tokio::test]
async fn tool_calls_round_trip_through_the_real_client() {
    let path = socket_path("tools");
    let daemon = FakeDaemon::start(&path, Arc::default());
    let (base, _shutdown) = start_shim(path.clone()).await;

    // A follow-up turn: the earlier call and its result, with tools offered again.
    let body = json!({
        "messages": [
            {"role": "user", "content": "Weather in Oslo?"},
            {"role": "assistant", "content": null, "tool_calls": [{"id": "call_a",
             "type": "function", "function": {"name": "get_weather",
             "arguments": "{\"city\":\"Oslo\"}"}}]},
            {"role": "tool", "tool_call_id": "call_a", "content": "12 C"},
        ],
        "tools": [weather_tool()],
        "tool_choice": "required",
        "parallel_tool_calls": false,
    });
    let (status, text) = post_chat(&base, &body).await;
    assert_eq!(status, 200, "{text}");
    let v: Value = serde_json::from_str(&text).unwrap();
    let choice = &v["choices"][0];
    assert_eq!(choice["finish_reason"], "tool_calls", "{v}");
    let call = &choice["message"]["tool_calls"][0];
    assert!(
        call["id"].as_str().unwrap().starts_with("call_fake"),
        "{call}"
    );
    assert_eq!(call["function"]["name"], "get_weather");
    assert_eq!(call["function"]["arguments"], r#"{"city":"Oslo"}"#);

    // What reached the daemon is the whole conversation, its tools and the choice.
    let input = daemon.seen.inputs.lock().unwrap().last().cloned().unwrap();
    let expected_call = ToolCall {
        id: "call_a".into(),
        name: "get_weather".into(),
        arguments: r#"{"city":"Oslo"}"#.into(),
    };
    assert_eq!(
        input,
        PromptInput::ChatWithTools {
            messages: vec![
                ToolChatMessage::new("user", "Weather in Oslo?"),
                ToolChatMessage {
                    role: "assistant".into(),
                    content: None,
                    tool_calls: vec![expected_call],
                    tool_call_id: None,
                },
                ToolChatMessage {
                    tool_call_id: Some("call_a".into()),
                    ..ToolChatMessage::new("tool", "12 C")
                },
            ],
            tools: vec![ToolSpec {
                name: "get_weather".into(),
                description: "The weather in a city".into(),
                parameters: weather_tool()["function"]["parameters"].to_string(),
                strict: true,
            }],
            choice: ToolChoice::Required,
            parallel: false,
        }
    );

    // Streamed: the call arrives as its two chunks, then `tool_calls`.
    let mut body = chat("hi", true);
    body["tools"] = json!([weather_tool()]);
    let (status, text) = post_chat(&base, &body).await;
    assert_eq!(status, 200, "{text}");
    let chunks = super::sse_chunks(&text);
    let calls: Vec<&Value> = chunks
        .iter()
        .filter_map(|c| c["choices"][0]["delta"].get("tool_calls"))
        .collect();
    assert_eq!(calls.len(), 2, "{text}");
    assert_eq!(calls[0][0]["function"]["name"], "get_weather");
    assert_eq!(calls[1][0]["function"]["arguments"], r#"{"city":"Oslo"}"#);
    let last = &chunks.last().unwrap()["choices"][0];
    assert_eq!(last["finish_reason"], "tool_calls", "{text}");
    daemon.stop().await;
    let _ = std::fs::remove_file(&path);
}

#[tokio::test]
async fn a_daemon_older_than_tools_still_answers_plain_chats() {
    let path = socket_path("old-minor");
    let seen = Arc::new(Seen {
        old_minor: Some(4),
        ..Seen::default()
    });
    let daemon = FakeDaemon::start(&path, seen);
    let (base, _shutdown) = start_shim(path.clone()).await;

    // Without tools the request is the `Chat` a 1.4 daemon knows.
    let (status, text) = post_chat(&base, &chat("hi", false)).await;
    assert_eq!(status, 200, "{text}");
    // With tools the client refuses to send what the daemon cannot read: a 502 that
    // says why, and nothing reaches the daemon.
    let mut body = chat("hi", false);
    body["tools"] = json!([weather_tool()]);
    let (status, text) = post_chat(&base, &body).await;
    assert_eq!(status, 502, "{text}");
    assert!(text.contains("1.4"), "{text}");
    assert_eq!(daemon.seen.inputs.lock().unwrap().len(), 1);
    daemon.stop().await;
    let _ = std::fs::remove_file(&path);
}

#[tokio::test]
async fn hanging_up_mid_stream_sends_cancel_to_the_daemon() {
    let path = socket_path("cancel");
    let daemon = FakeDaemon::start(&path, Arc::default());
    let (base, _shutdown) = start_shim(path.clone()).await;

    let response = client()
        .post(format!("{base}/v1/chat/completions"))
        .json(&chat("hang", true))
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), 200);
    let mut body = response.bytes_stream();
    let mut seen = String::new();
    while !seen.contains(PIECES[0]) {
        seen.push_str(&String::from_utf8_lossy(
            &body.next().await.unwrap().unwrap(),
        ));
    }
    assert!(daemon.seen.cancels.lock().unwrap().is_empty());
    let cancelled = daemon.seen.cancel_notify.notified();
    drop(body);
    tokio::time::timeout(Duration::from_secs(5), cancelled)
        .await
        .expect("no Cancel reached the daemon");
    assert_eq!(daemon.seen.cancels.lock().unwrap().len(), 1);
    daemon.stop().await;
    let _ = std::fs::remove_file(&path);
}

#[tokio::test]
async fn daemon_down_then_up_then_restarted() {
    let path = socket_path("restart");
    let _ = std::fs::remove_file(&path);
    let (base, _shutdown) = start_shim(path.clone()).await;

    // Not running yet: the shim is up and says so.
    assert_eq!(health(&base).await, 503);
    let (status, text) = post_chat(&base, &chat("hi", false)).await;
    assert_eq!(status, 503, "{text}");
    assert!(text.contains("not running"), "{text}");

    let daemon = FakeDaemon::start(&path, Arc::default());
    assert_eq!(health(&base).await, 200);
    assert_eq!(post_chat(&base, &chat("hi", false)).await.0, 200);

    // A restart closes the cached connection (with `ShuttingDown`); the next requests
    // must connect again rather than fail.
    daemon.stop().await;
    assert_eq!(health(&base).await, 503);
    let daemon = FakeDaemon::start(&path, Arc::default());
    let (status, text) = post_chat(&base, &chat("hi", false)).await;
    assert_eq!(status, 200, "{text}");
    assert_eq!(health(&base).await, 200);
    daemon.stop().await;
    let _ = std::fs::remove_file(&path);
}

#[tokio::test]
async fn forwarded_jobs_are_recorded_through_the_real_client() {
    use crate::openai::Backend;
    use crate::protocol::{CountSource, DecodeClock, ExternalJob, Timings};
    let path = socket_path("record");
    let daemon = FakeDaemon::start(&path, Arc::default());
    let backend = DaemonBackend::new(path.clone());
    let job = ExternalJob {
        engine: "llama".into(),
        upstream: "http://127.0.0.1:8091".into(),
        model: "m".into(),
        request_id: 4,
        started_unix_ms: 1,
        finished_unix_ms: 2,
        usage: Usage {
            prompt_tokens: 3,
            completion_tokens: 4,
        },
        timings: Timings::default(),
        finish_reason: FinishReason::Stop,
        counts: CountSource::Reported,
        decode_clock: DecodeClock::Stream,
        http_status: 200,
    };
    let record = backend.record_job(job.clone()).await.expect("recorded");
    assert_eq!(record, job.to_record(77, None, None));
    daemon.stop().await;
    let _ = std::fs::remove_file(&path);
}
