//! One client connection: the handshake, then a loop that reads requests, hands them to
//! the engine, and writes the events and replies that come back, at the client's pace.
//!
//! A client that stops reading is cut off: once it has taken no bytes for the stall
//! timeout, or once more than `max_backlog_frames` events wait for it while a write is
//! blocked, its generations are cancelled and the connection is closed. The engine never
//! waits for a client, so that backlog is what bounds the memory a stalled client holds.

use std::{
    collections::HashSet,
    panic::{catch_unwind, AssertUnwindSafe},
    sync::Arc,
    time::{Duration, Instant},
};

use futures::{FutureExt, SinkExt, StreamExt};
use spark_client::{
    codec::{CodecError, MessageCodec},
    protocol::{
        ClientMessage, ErrorEvent, ErrorKind, FinishReason, GenerateOption, GenerateRequest, Hello,
        OutputFormat, PromptInput, ServerMessage, Welcome, PROTOCOL_MAJOR, PROTOCOL_MINOR,
    },
};
use tokio::{
    net::UnixStream,
    sync::mpsc::{self, UnboundedReceiver, UnboundedSender},
};
use tokio_util::{codec::Framed, sync::CancellationToken};

use super::peercred::{self, Access};
use super::stall::{is_stall, StallGuard};
use crate::engine::{ClientInfo, ConnId, Engine, Submission};

type ServerFramed = Framed<StallGuard<UnixStream>, MessageCodec<ClientMessage, ServerMessage>>;

/// How long the last frame before a close (an error) may take to write: the client may
/// not be reading, and the connection ends either way.
const FINAL_WRITE_TIMEOUT: Duration = Duration::from_secs(2);
/// Frames written between flushes; bounded so that reading is not starved.
const MAX_WRITE_BATCH: usize = 256;
/// How often the backlog is looked at while a write is blocked.
const BACKLOG_CHECK: Duration = Duration::from_millis(50);

/// What every connection needs from the server.
pub(crate) struct Shared {
    pub engine: Arc<dyn Engine>,
    pub max_frame_bytes: usize,
    pub handshake_timeout: Duration,
    pub allow: Access,
    /// A client that takes no bytes for this long is cut off.
    pub stall_timeout: Duration,
    /// Events waiting for a client whose write is blocked, past which it is cut off.
    pub max_backlog_frames: usize,
}

/// Why a connection ended, for the log.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum End {
    /// EOF, a read or a write error.
    Disconnected,
    /// We sent a connection-level error of this kind and closed.
    Refused(ErrorKind),
    /// Shutdown, after the last generation finished.
    Shutdown,
    /// The client stopped reading; see [`WriteError`].
    Stalled,
}

/// Why writing to the client failed.
#[derive(Debug, thiserror::Error)]
enum WriteError {
    /// The connection broke (or the client took no bytes for the stall timeout: an
    /// `Io` error that [`is_stall`] recognises).
    #[error(transparent)]
    Codec(CodecError),
    #[error("{0} events waiting while the client's socket is full")]
    Backlog(usize),
}

impl WriteError {
    fn is_stall(&self) -> bool {
        match self {
            WriteError::Backlog(_) => true,
            WriteError::Codec(CodecError::Io(e)) => is_stall(e),
            WriteError::Codec(_) => false,
        }
    }
}

/// Serves one accepted connection to its end.
pub(crate) async fn run(
    shared: Arc<Shared>,
    stream: UnixStream,
    conn: ConnId,
    shutdown: CancellationToken,
) {
    let client = peercred::client_info(&stream);
    let stream = StallGuard::new(stream, shared.stall_timeout);
    let mut framed = Framed::new(stream, MessageCodec::new(shared.max_frame_bytes));

    if !shared.allow.permits(&client) {
        tracing::warn!(conn, uid = ?client.uid, "connection refused: user not on the allow-list");
        let message = match client.uid {
            Some(uid) => format!("uid {uid} is not allowed to use this daemon"),
            None => {
                "this daemon admits only known users, and the peer's credentials are unavailable"
                    .to_owned()
            }
        };
        send_final(
            &mut framed,
            connection_error(ErrorKind::NotAllowed, message),
        )
        .await;
        return;
    }

    let hello = match handshake(&shared, &mut framed, &shutdown).await {
        Ok(hello) => hello,
        Err(end) => {
            tracing::debug!(conn, uid = ?client.uid, ?end, "connection ended during the handshake");
            return;
        }
    };
    tracing::info!(
        conn,
        uid = ?client.uid,
        pid = ?client.pid,
        client = %printable(&hello.client),
        minor = hello.minor,
        "client connected"
    );

    let (events_tx, events_rx) = mpsc::unbounded_channel();
    let mut connection = Connection {
        conn,
        client,
        engine: Arc::clone(&shared.engine),
        events_tx,
        events_rx,
        running: HashSet::new(),
        draining: false,
        generations: 0,
        max_backlog_frames: shared.max_backlog_frames,
        peer_minor: hello.minor,
    };
    let end = connection.serve(&mut framed, &shutdown).await;
    if !connection.running.is_empty() {
        // Nobody will read these generations any more: free their slots now rather than
        // when the engine next fails to send.
        connection.engine.cancel_connection(conn);
    }
    tracing::info!(
        conn,
        uid = ?client.uid,
        generations = connection.generations,
        abandoned = connection.running.len(),
        ?end,
        "connection closed"
    );
}

/// Reads the first frame, which must be a `Hello` of our major version, and welcomes it.
async fn handshake(
    shared: &Shared,
    framed: &mut ServerFramed,
    shutdown: &CancellationToken,
) -> Result<Hello, End> {
    let first = tokio::select! {
        first = tokio::time::timeout(shared.handshake_timeout, framed.next()) => first,
        _ = shutdown.cancelled() => {
            return Err(refuse(framed, connection_error(ErrorKind::ShuttingDown, "sparkd is shutting down")).await);
        }
    };
    let hello = match first {
        Err(_elapsed) => {
            let message = format!(
                "no Hello within {} s",
                shared.handshake_timeout.as_secs_f32()
            );
            return Err(refuse(framed, connection_error(ErrorKind::Handshake, message)).await);
        }
        Ok(None) => return Err(End::Disconnected),
        Ok(Some(Err(err))) => {
            return Err(match codec_refusal(&err) {
                Some(refusal) => refuse(framed, refusal).await,
                None => End::Disconnected,
            })
        }
        Ok(Some(Ok(ClientMessage::Hello(hello)))) => hello,
        Ok(Some(Ok(_))) => {
            let refusal = connection_error(ErrorKind::Handshake, "the first message must be Hello");
            return Err(refuse(framed, refusal).await);
        }
    };
    if hello.major != PROTOCOL_MAJOR {
        let message = format!(
            "client speaks protocol {}.{}, sparkd {} speaks {PROTOCOL_MAJOR}.{PROTOCOL_MINOR}",
            hello.major,
            hello.minor,
            env!("CARGO_PKG_VERSION"),
        );
        return Err(refuse(
            framed,
            connection_error(ErrorKind::VersionMismatch, message),
        )
        .await);
    }
    let welcome = Welcome {
        major: PROTOCOL_MAJOR,
        minor: PROTOCOL_MINOR,
        daemon_version: env!("CARGO_PKG_VERSION").to_owned(),
        max_frame_bytes: u32::try_from(shared.max_frame_bytes).unwrap_or(u32::MAX),
    };
    framed
        .send(ServerMessage::Welcome(welcome))
        .await
        .map_err(|_| End::Disconnected)?;
    Ok(hello)
}

/// A connection after its handshake.
struct Connection {
    conn: ConnId,
    client: ClientInfo,
    engine: Arc<dyn Engine>,
    /// Cloned into every submission; our own replies go through it too, so that there is
    /// one write path.
    events_tx: UnboundedSender<ServerMessage>,
    events_rx: UnboundedReceiver<ServerMessage>,
    /// Generations submitted whose `Done` has not been written yet.
    running: HashSet<u64>,
    /// Shutdown was requested: no new generations; close once `running` is empty.
    draining: bool,
    generations: u64,
    max_backlog_frames: usize,
    /// The minor version the client announced: newer messages would not decode there.
    peer_minor: u16,
}

impl Connection {
    async fn serve(&mut self, framed: &mut ServerFramed, shutdown: &CancellationToken) -> End {
        loop {
            if self.draining && self.running.is_empty() {
                send_final(
                    framed,
                    connection_error(ErrorKind::ShuttingDown, "sparkd is shutting down"),
                )
                .await;
                return End::Shutdown;
            }
            tokio::select! {
                // Never `None`: this connection holds a sender itself.
                Some(event) = self.events_rx.recv() => {
                    match self.write_events(framed, event).await {
                        Ok(()) => {}
                        Err(err) if err.is_stall() => {
                            tracing::warn!(
                                conn = self.conn,
                                uid = ?self.client.uid,
                                reason = %err,
                                running = self.running.len(),
                                "client stopped reading: cancelling its generations and closing"
                            );
                            return End::Stalled;
                        }
                        Err(_) => return End::Disconnected,
                    }
                }
                frame = framed.next() => match frame {
                    Some(Ok(message)) => {
                        let arrived = Instant::now();
                        if let Err(refusal) = self.handle(message, arrived) {
                            return refuse(framed, refusal).await;
                        }
                    }
                    Some(Err(err)) => {
                        return match codec_refusal(&err) {
                            Some(refusal) => {
                                tracing::warn!(conn = self.conn, uid = ?self.client.uid, %err, "closing connection");
                                refuse(framed, refusal).await
                            }
                            None => End::Disconnected,
                        };
                    }
                    None => return End::Disconnected,
                },
                _ = shutdown.cancelled(), if !self.draining => self.draining = true,
            }
        }
    }

    /// Acts on one request. An `Err` is a connection-level error: send it and close.
    fn handle(&mut self, message: ClientMessage, arrived: Instant) -> Result<(), ErrorEvent> {
        match message {
            ClientMessage::Hello(_) => {
                return Err(connection_error(
                    ErrorKind::Handshake,
                    "Hello was already sent on this connection",
                ));
            }
            ClientMessage::Generate(request) => {
                self.generate(request, OutputFormat::Text, Vec::new(), arrived)
            }
            ClientMessage::GenerateFormatted { request, format } => {
                self.generate(request, format, Vec::new(), arrived)
            }
            ClientMessage::GenerateWith {
                request,
                format,
                options,
            } => self.generate(request, format, options, arrived),
            ClientMessage::Cancel { id } => {
                if self.running.contains(&id) {
                    self.engine.cancel(self.conn, id, FinishReason::Cancelled);
                }
            }
            ClientMessage::Tokenize { id, text, special } => self.tokenize(id, text, special),
            ClientMessage::Status { id } => {
                self.reply(ServerMessage::Status {
                    id,
                    status: self.engine.status(),
                });
            }
            ClientMessage::Jobs { id, limit } => {
                let limit = usize::try_from(limit).unwrap_or(usize::MAX);
                let jobs = self.engine.jobs(limit);
                self.reply(ServerMessage::Jobs {
                    id,
                    jobs: jobs.into_iter().map(|entry| entry.record).collect(),
                });
            }
            ClientMessage::JobEntries { id, limit } => {
                let limit = usize::try_from(limit).unwrap_or(usize::MAX);
                self.reply(ServerMessage::JobEntries {
                    id,
                    jobs: self.engine.jobs(limit),
                });
            }
            ClientMessage::Models { id } => {
                self.reply(ServerMessage::Models {
                    id,
                    models: self.engine.models(),
                });
            }
            ClientMessage::CacheStatus { id } => {
                self.reply(ServerMessage::CacheStatus {
                    id,
                    cache: self.engine.cache_status(),
                });
            }
            ClientMessage::ChatFormat { id } => {
                self.reply(ServerMessage::ChatFormat {
                    id,
                    format: self.engine.chat_format(),
                });
            }
            ClientMessage::RecordJob { id, job } => {
                self.reply(ServerMessage::Recorded {
                    id,
                    job: self.engine.record_external(job, self.client),
                });
            }
        }
        Ok(())
    }

    fn generate(
        &mut self,
        request: GenerateRequest,
        format: OutputFormat,
        options: Vec<GenerateOption>,
        arrived: Instant,
    ) {
        let id = request.id;
        if self.draining {
            self.reply(request_error(
                id,
                ErrorKind::ShuttingDown,
                "sparkd is shutting down".into(),
            ));
            return;
        }
        if !self.running.insert(id) {
            let message = format!("request id {id} is already running on this connection");
            self.reply(request_error(id, ErrorKind::DuplicateId, message));
            return;
        }
        let heavy = heavy_to_prepare(&request.input, &format);
        // A client that could not decode `ToolCallDelta` gets each call whole (and a call
        // cut short as text), whatever it asked for.
        let mut options = options;
        if GenerateOption::StreamToolCalls.since_minor() > self.peer_minor {
            options.retain(|o| *o != GenerateOption::StreamToolCalls);
        }
        let submission = Submission {
            conn: self.conn,
            client: self.client,
            request,
            format,
            options,
            // Older clients could not decode a `Reasoning` event: their reasoning stays
            // in the tokens' text.
            split_reasoning: ServerMessage::Reasoning(Default::default()).since_minor()
                <= self.peer_minor,
            token_bytes: ServerMessage::TokenBytes(Default::default()).since_minor()
                <= self.peer_minor,
            arrived,
            events: self.events_tx.clone(),
        };
        let submitted = if heavy {
            off_the_runtime(|| self.engine.submit(submission))
        } else {
            self.engine.submit(submission)
        };
        match submitted {
            Ok(()) => self.generations += 1,
            Err(rejection) => {
                self.running.remove(&id);
                tracing::debug!(conn = self.conn, id, kind = ?rejection.kind, "generation rejected");
                // The id is forced: without one the client would take it for a
                // connection-level error.
                self.reply(ServerMessage::Error(ErrorEvent {
                    id: Some(id),
                    ..rejection
                }));
            }
        }
    }

    /// Tokenizing a long text takes a while: do it off the async workers.
    fn tokenize(&self, id: u64, text: String, special: bool) {
        let engine = Arc::clone(&self.engine);
        let events = self.events_tx.clone();
        tokio::task::spawn_blocking(move || {
            let reply = match catch_unwind(AssertUnwindSafe(|| engine.tokenize(&text, special))) {
                Ok(Ok(tokens)) => ServerMessage::Tokens { id, tokens },
                Ok(Err(err)) => ServerMessage::Error(ErrorEvent {
                    id: Some(id),
                    ..err
                }),
                Err(_panic) => {
                    request_error(id, ErrorKind::Internal, "the tokenizer failed".into())
                }
            };
            // The connection may be gone; then nobody wants the reply.
            let _ = events.send(reply);
        });
    }

    fn reply(&self, message: ServerMessage) {
        // Cannot fail: `self.events_rx` is alive as long as `self`.
        let _ = self.events_tx.send(message);
    }

    /// Writes `first` and whatever else is queued, then flushes once. While the write
    /// is blocked on a client that is not reading, the backlog behind it is watched.
    async fn write_events(
        &mut self,
        framed: &mut ServerFramed,
        first: ServerMessage,
    ) -> Result<(), WriteError> {
        let mut batch = vec![first];
        while batch.len() < MAX_WRITE_BATCH {
            match self.events_rx.try_recv() {
                Ok(message) => batch.push(message),
                Err(_) => break,
            }
        }
        // The engine reports to every client alike; what an older client cannot decode
        // is left out here (only informational events are ever newer than 1.0).
        batch.retain(|message| message.since_minor() <= self.peer_minor);
        for message in &batch {
            if let ServerMessage::Done(done) = message {
                self.running.remove(&done.id);
            }
        }
        let write = async move {
            for message in batch {
                framed.feed(message).await?;
            }
            framed.flush().await
        };
        let mut write = std::pin::pin!(write);
        // Nearly every write completes at once: no timer for those.
        if let Some(result) = (&mut write).now_or_never() {
            return result.map_err(WriteError::Codec);
        }
        let mut check = tokio::time::interval(BACKLOG_CHECK);
        loop {
            tokio::select! {
                biased;
                result = &mut write => return result.map_err(WriteError::Codec),
                _ = check.tick() => {
                    let backlog = self.events_rx.len();
                    if backlog > self.max_backlog_frames {
                        return Err(WriteError::Backlog(backlog));
                    }
                }
            }
        }
    }
}

/// The error frame for a codec failure, or `None` when the peer simply went away.
fn codec_refusal(err: &CodecError) -> Option<ErrorEvent> {
    match err {
        CodecError::FrameTooLarge { .. } => {
            Some(connection_error(ErrorKind::FrameTooLarge, err.to_string()))
        }
        CodecError::BadFrame(_) | CodecError::Encode(_) => {
            Some(connection_error(ErrorKind::BadFrame, err.to_string()))
        }
        CodecError::Io(_) => None,
    }
}

async fn refuse(framed: &mut ServerFramed, refusal: ErrorEvent) -> End {
    let kind = refusal.kind;
    send_final(framed, refusal).await;
    End::Refused(kind)
}

/// Writes a connection's last frame, best effort.
async fn send_final(framed: &mut ServerFramed, refusal: ErrorEvent) {
    let _ = tokio::time::timeout(
        FINAL_WRITE_TIMEOUT,
        framed.send(ServerMessage::Error(refusal)),
    )
    .await;
}

fn connection_error(kind: ErrorKind, message: impl Into<String>) -> ErrorEvent {
    ErrorEvent {
        id: None,
        kind,
        message: message.into(),
    }
}

fn request_error(id: u64, kind: ErrorKind, message: String) -> ServerMessage {
    ServerMessage::Error(ErrorEvent {
        id: Some(id),
        kind,
        message,
    })
}

/// A client-chosen name, safe for a log line.
fn printable(name: &str) -> String {
    name.chars().filter(|c| !c.is_control()).take(64).collect()
}

/// Runs `f`, CPU-bound work, telling a multi-threaded runtime to move its other tasks to
/// other workers meanwhile; elsewhere (a current-thread runtime in tests) just runs it.
/// Prompts up to this many bytes of text are rendered and tokenized on the async worker:
/// well under a millisecond, less than handing the worker over would cost.
const INLINE_PROMPT_BYTES: usize = 16 * 1024;
/// Chats with more messages than this go off the worker whatever their size: the
/// template's loop over them costs per message.
const INLINE_CHAT_MESSAGES: usize = 64;

/// Whether submitting a request takes long enough (milliseconds to a second) that it
/// must not hold one of the two async workers, which every other connection's stream
/// needs: a JSON Schema or a tool list, compiled to automata, or a prompt to render and
/// tokenize that is long or has many messages.
fn heavy_to_prepare(input: &PromptInput, format: &OutputFormat) -> bool {
    let (bytes, messages) = match input {
        PromptInput::Raw { text, .. } => (text.len(), 1),
        PromptInput::Chat { messages } => (
            messages
                .iter()
                .map(|m| m.role.len() + m.content.len())
                .sum(),
            messages.len(),
        ),
        PromptInput::ChatWithTools { .. } => return true,
    };
    matches!(format, OutputFormat::JsonSchema { .. })
        || bytes > INLINE_PROMPT_BYTES
        || messages > INLINE_CHAT_MESSAGES
}

fn off_the_runtime<T>(f: impl FnOnce() -> T) -> T {
    match tokio::runtime::Handle::try_current().map(|h| h.runtime_flavor()) {
        Ok(tokio::runtime::RuntimeFlavor::MultiThread) => tokio::task::block_in_place(f),
        _ => f(),
    }
}

#[cfg(test)]
mod tests {
    use spark_client::protocol::{ChatMessage, OutputFormat, PromptInput};

    use super::{heavy_to_prepare, INLINE_CHAT_MESSAGES, INLINE_PROMPT_BYTES};

    fn raw(bytes: usize) -> PromptInput {
        PromptInput::Raw {
            text: "a".repeat(bytes),
            special: false,
        }
    }

    fn chat(messages: usize, each: usize) -> PromptInput {
        PromptInput::Chat {
            messages: (0..messages)
                .map(|_| ChatMessage::new("user", "a".repeat(each)))
                .collect(),
        }
    }

    #[test]
    fn long_prompts_many_messages_and_automata_are_prepared_off_the_workers() {
        let text = OutputFormat::Text;
        assert!(!heavy_to_prepare(&raw(100), &text));
        assert!(!heavy_to_prepare(&raw(INLINE_PROMPT_BYTES), &text));
        assert!(heavy_to_prepare(&raw(INLINE_PROMPT_BYTES + 1), &text));
        assert!(!heavy_to_prepare(&chat(4, 100), &text));
        assert!(heavy_to_prepare(&chat(2, INLINE_PROMPT_BYTES), &text));
        // Tiny messages, but the template loops over each.
        assert!(heavy_to_prepare(&chat(INLINE_CHAT_MESSAGES + 1, 1), &text));
        let schema = OutputFormat::JsonSchema {
            schema: "{}".into(),
        };
        assert!(heavy_to_prepare(&raw(1), &schema));
        assert!(!heavy_to_prepare(&raw(1), &OutputFormat::JsonObject));
    }
}
