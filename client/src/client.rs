//! The async client: one connection to the daemon, multiplexed. A background task owns
//! the socket, writes what the handles queue and routes each incoming frame to the
//! request it answers, by request id.

use std::{
    collections::HashMap,
    io,
    path::Path,
    sync::{
        atomic::{AtomicU64, Ordering},
        Arc, Mutex, MutexGuard,
    },
    time::Duration,
};

use futures::{SinkExt, StreamExt};
use tokio::{
    net::UnixStream,
    sync::{mpsc, oneshot},
};
use tokio_util::codec::Framed;

use crate::{
    codec::MessageCodec,
    error::ClientError,
    generation::{Generation, GenerationEvent},
    protocol::{
        CacheReport, ChatFormatReport, ClientMessage, ErrorEvent, ErrorKind, ExternalJob,
        GenerateOption, GenerateRequest, Hello, JobEntry, JobRecord, ModelInfo, OutputFormat,
        ServerMessage, StatusReport, TokenPiece, Welcome, PROTOCOL_MAJOR, PROTOCOL_MINOR,
    },
};

/// The largest frame the client accepts from the daemon. Larger than the daemon's own
/// limit because replies (a long text's tokens, a long jobs list) outgrow requests.
pub const CLIENT_MAX_FRAME_BYTES: usize = 64 << 20;

type ClientFramed = Framed<UnixStream, MessageCodec<ServerMessage, ClientMessage>>;

/// How to connect; [`Client::connect`] uses the defaults.
#[derive(Debug, Clone)]
pub struct ConnectOptions {
    /// Sent in `Hello` for the daemon's logs.
    pub client_name: String,
    /// How long to wait for `Welcome`. The daemon accepts only a bounded number of
    /// connections; past that a connection waits in the backlog and this expires.
    pub handshake_timeout: Duration,
}

impl Default for ConnectOptions {
    fn default() -> Self {
        Self {
            client_name: format!("spark-client {}", env!("CARGO_PKG_VERSION")),
            handshake_timeout: Duration::from_secs(10),
        }
    }
}

/// A connection to sparkd. Cheap to clone; all clones share the connection, which
/// closes when the last clone and the last [`Generation`] are dropped.
#[derive(Clone)]
pub struct Client {
    shared: Arc<Shared>,
}

struct Shared {
    outgoing: mpsc::UnboundedSender<ClientMessage>,
    routes: Arc<Routes>,
    next_id: AtomicU64,
    welcome: Welcome,
}

/// Where the answers to each pending request go. Shared between the handles (which
/// register) and the background task (which delivers).
pub(crate) struct Routes {
    state: Mutex<RouteState>,
}

struct RouteState {
    pending: HashMap<u64, Route>,
    /// Set once the connection is gone: why, when the daemon said.
    closed: Option<Option<ErrorEvent>>,
}

enum Route {
    Generation(mpsc::UnboundedSender<Result<GenerationEvent, ClientError>>),
    Reply(oneshot::Sender<Result<ServerMessage, ClientError>>),
}

impl Client {
    /// Connects to the daemon's socket and completes the handshake.
    pub async fn connect(path: impl AsRef<Path>) -> Result<Client, ClientError> {
        Self::connect_with(path, &ConnectOptions::default()).await
    }

    pub async fn connect_with(
        path: impl AsRef<Path>,
        options: &ConnectOptions,
    ) -> Result<Client, ClientError> {
        let path = path.as_ref();
        let stream = UnixStream::connect(path)
            .await
            .map_err(|source| match source.kind() {
                // A missing socket, or a socket file nobody listens on (a stale one).
                io::ErrorKind::NotFound | io::ErrorKind::ConnectionRefused => {
                    ClientError::DaemonNotRunning {
                        path: path.to_path_buf(),
                        source,
                    }
                }
                _ => ClientError::Connect {
                    path: path.to_path_buf(),
                    source,
                },
            })?;
        Self::from_stream(stream, options).await
    }

    /// Completes the handshake on an already connected stream.
    pub async fn from_stream(
        stream: UnixStream,
        options: &ConnectOptions,
    ) -> Result<Client, ClientError> {
        let mut framed = Framed::new(stream, MessageCodec::new(CLIENT_MAX_FRAME_BYTES));
        let welcome =
            tokio::time::timeout(options.handshake_timeout, handshake(&mut framed, options))
                .await
                .map_err(|_| {
                    ClientError::Protocol(format!(
                        "the daemon did not answer the handshake within {} s",
                        options.handshake_timeout.as_secs_f32()
                    ))
                })??;

        let (outgoing, outgoing_rx) = mpsc::unbounded_channel();
        let routes = Arc::new(Routes::new());
        tokio::spawn(run_connection(framed, outgoing_rx, Arc::clone(&routes)));
        Ok(Client {
            shared: Arc::new(Shared {
                outgoing,
                routes,
                next_id: AtomicU64::new(1),
                welcome,
            }),
        })
    }

    /// What the daemon said in its `Welcome`: its version and frame limit.
    pub fn daemon(&self) -> &Welcome {
        &self.shared.welcome
    }

    /// A request id not yet used on this connection (ids start at 1 and only grow).
    pub fn next_request_id(&self) -> u64 {
        self.shared.next_id.fetch_add(1, Ordering::Relaxed)
    }

    /// Starts a generation. Returns once the request is queued for sending; a rejection
    /// by the daemon (busy, invalid, context overflow...) is the stream's first and only
    /// item, since the protocol has no acceptance message to wait for.
    pub async fn generate(&self, request: GenerateRequest) -> Result<Generation, ClientError> {
        self.generate_as(request, OutputFormat::Text).await
    }

    /// [`Client::generate`] with the text held to `format`. A format other than
    /// [`OutputFormat::Text`] needs a daemon speaking protocol 1.3 or later (an older one
    /// gives `VersionMismatch`, and nothing is sent).
    pub async fn generate_as(
        &self,
        request: GenerateRequest,
        format: OutputFormat,
    ) -> Result<Generation, ClientError> {
        self.generate_with(request, format, Vec::new()).await
    }

    /// [`Client::generate_as`] with [`GenerateOption`]s (chat-template variables...).
    /// Options need a daemon speaking protocol 1.7 or later (an older one gives
    /// `VersionMismatch`, and nothing is sent); without any, the request goes as
    /// `Generate` or `GenerateFormatted`, which older daemons take. A
    /// [preference](GenerateOption::is_preference) the daemon is too old to know is left
    /// out: it answers as it would without it.
    pub async fn generate_with(
        &self,
        request: GenerateRequest,
        format: OutputFormat,
        mut options: Vec<GenerateOption>,
    ) -> Result<Generation, ClientError> {
        let invalid = |message| ClientError::InvalidRequest {
            kind: ErrorKind::InvalidRequest,
            message,
        };
        let minor = self.shared.welcome.minor;
        options.retain(|o| !o.is_preference() || o.since_minor() <= minor);
        crate::limits::check_request(&request).map_err(invalid)?;
        crate::limits::check_options(&options).map_err(invalid)?;
        let id = request.id;
        let message = match (format, options.is_empty()) {
            (OutputFormat::Text, true) => ClientMessage::Generate(request),
            (format, true) => ClientMessage::GenerateFormatted { request, format },
            (format, false) => ClientMessage::GenerateWith {
                request,
                format,
                options,
            },
        };
        let (events_tx, events_rx) = mpsc::unbounded_channel();
        self.shared
            .routes
            .register(id, Route::Generation(events_tx))?;
        if let Err(err) = self.send(message) {
            self.shared.routes.remove(id);
            return Err(err);
        }
        Ok(Generation::new(
            id,
            events_rx,
            self.shared.outgoing.clone(),
            Arc::clone(&self.shared.routes),
        ))
    }

    /// Asks the daemon to stop generation `id`. Its stream still ends with a `Done`
    /// (finish reason `cancelled`, or whatever ended it first).
    pub async fn cancel(&self, id: u64) -> Result<(), ClientError> {
        self.send(ClientMessage::Cancel { id })
    }

    pub async fn tokenize(
        &self,
        text: &str,
        special: bool,
    ) -> Result<Vec<TokenPiece>, ClientError> {
        let text = text.to_owned();
        match self
            .request(|id| ClientMessage::Tokenize { id, text, special })
            .await?
        {
            ServerMessage::Tokens { tokens, .. } => Ok(tokens),
            other => Err(unexpected("Tokens", &other)),
        }
    }

    pub async fn status(&self) -> Result<StatusReport, ClientError> {
        match self.request(|id| ClientMessage::Status { id }).await? {
            ServerMessage::Status { status, .. } => Ok(status),
            other => Err(unexpected("Status", &other)),
        }
    }

    /// The prefix cache's state and totals. Needs a daemon speaking protocol 1.2 or
    /// later (an older one gives `VersionMismatch`, and the connection stays usable).
    pub async fn cache_status(&self) -> Result<CacheReport, ClientError> {
        match self.request(|id| ClientMessage::CacheStatus { id }).await? {
            ServerMessage::CacheStatus { cache, .. } => Ok(cache),
            other => Err(unexpected("CacheStatus", &other)),
        }
    }

    /// How the daemon renders the model's chats and reads its answers: the tool-call
    /// syntax, the thinking tags, the template's switches. Needs a daemon speaking
    /// protocol 1.8 or later (an older one gives `VersionMismatch`, and the connection
    /// stays usable).
    pub async fn chat_format(&self) -> Result<ChatFormatReport, ClientError> {
        match self.request(|id| ClientMessage::ChatFormat { id }).await? {
            ServerMessage::ChatFormat { format, .. } => Ok(format),
            other => Err(unexpected("ChatFormat", &other)),
        }
    }

    /// The most recent finished jobs, newest first, at most `limit`.
    pub async fn jobs(&self, limit: u32) -> Result<Vec<JobRecord>, ClientError> {
        match self.request(|id| ClientMessage::Jobs { id, limit }).await? {
            ServerMessage::Jobs { jobs, .. } => Ok(jobs),
            other => Err(unexpected("Jobs", &other)),
        }
    }

    /// The most recent finished jobs, newest first, at most `limit`, with the figures a
    /// `JobRecord` cannot carry, such as the prompt tokens taken from the prefix cache.
    /// A daemon older than protocol 1.10 is asked for its plain records, and those
    /// figures come back `None`.
    pub async fn job_entries(&self, limit: u32) -> Result<Vec<JobEntry>, ClientError> {
        if self.shared.welcome.minor < 10 {
            let jobs = self.jobs(limit).await?;
            return Ok(jobs.into_iter().map(JobEntry::from).collect());
        }
        match self
            .request(|id| ClientMessage::JobEntries { id, limit })
            .await?
        {
            ServerMessage::JobEntries { jobs, .. } => Ok(jobs),
            other => Err(unexpected("JobEntries", &other)),
        }
    }

    pub async fn models(&self) -> Result<Vec<ModelInfo>, ClientError> {
        match self.request(|id| ClientMessage::Models { id }).await? {
            ServerMessage::Models { models, .. } => Ok(models),
            other => Err(unexpected("Models", &other)),
        }
    }

    /// Books a job another engine served in the daemon's jobs list and returns the
    /// record as the list shows it. Needs a daemon speaking protocol 1.1 or later.
    pub async fn record_job(&self, job: ExternalJob) -> Result<JobRecord, ClientError> {
        match self
            .request(|id| ClientMessage::RecordJob { id, job })
            .await?
        {
            ServerMessage::Recorded { job, .. } => Ok(job),
            other => Err(unexpected("Recorded", &other)),
        }
    }

    /// Sends a query under a fresh id and waits for its reply.
    async fn request(
        &self,
        message: impl FnOnce(u64) -> ClientMessage,
    ) -> Result<ServerMessage, ClientError> {
        let (reply_tx, reply_rx) = oneshot::channel();
        // Skips ids a caller chose for its own generations.
        let id = self
            .shared
            .routes
            .register_fresh(|| self.next_request_id(), Route::Reply(reply_tx))?;
        if let Err(err) = self.send(message(id)) {
            self.shared.routes.remove(id);
            return Err(err);
        }
        // The background task drops every route when the connection ends.
        reply_rx
            .await
            .map_err(|_| self.shared.routes.closed_error())?
    }

    fn send(&self, message: ClientMessage) -> Result<(), ClientError> {
        // An older daemon cannot decode a newer message and would close the connection.
        let welcome = &self.shared.welcome;
        let needs = message.since_minor();
        if needs > welcome.minor {
            return Err(ClientError::VersionMismatch {
                client: (PROTOCOL_MAJOR, PROTOCOL_MINOR),
                daemon: format!(
                    "protocol {}.{} (sparkd {}), which cannot take this request ({}.{needs} can)",
                    welcome.major, welcome.minor, welcome.daemon_version, welcome.major
                ),
            });
        }
        // The daemon closes the connection on an oversized frame, and the error it sends
        // may be lost while the rest of the frame is still being written: refuse here.
        let limit = self.shared.welcome.max_frame_bytes as usize;
        let size = postcard::experimental::serialized_size(&message)
            .map_err(|e| ClientError::Protocol(format!("cannot encode the request: {e}")))?;
        if size > limit {
            return Err(ClientError::InvalidRequest {
                kind: ErrorKind::FrameTooLarge,
                message: format!(
                    "the request takes {size} bytes; the daemon accepts at most {limit}"
                ),
            });
        }
        self.shared
            .outgoing
            .send(message)
            .map_err(|_| self.shared.routes.closed_error())
    }
}

impl std::fmt::Debug for Client {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Client")
            .field("daemon", &self.shared.welcome)
            .finish_non_exhaustive()
    }
}

fn unexpected(expected: &str, got: &ServerMessage) -> ClientError {
    ClientError::Protocol(format!(
        "expected a {expected} reply, got {}",
        message_name(got)
    ))
}

fn message_name(message: &ServerMessage) -> &'static str {
    match message {
        ServerMessage::Welcome(_) => "Welcome",
        ServerMessage::Token(_) => "Token",
        ServerMessage::Done(_) => "Done",
        ServerMessage::Error(_) => "Error",
        ServerMessage::Tokens { .. } => "Tokens",
        ServerMessage::Status { .. } => "Status",
        ServerMessage::Jobs { .. } => "Jobs",
        ServerMessage::Models { .. } => "Models",
        ServerMessage::Recorded { .. } => "Recorded",
        ServerMessage::Prefilled(_) => "Prefilled",
        ServerMessage::ToolCall(_) => "ToolCall",
        ServerMessage::ToolCallDelta(_) => "ToolCallDelta",
        ServerMessage::Reasoning(_) => "Reasoning",
        ServerMessage::CacheStatus { .. } => "CacheStatus",
        ServerMessage::ChatFormat { .. } => "ChatFormat",
        ServerMessage::JobEntries { .. } => "JobEntries",
        ServerMessage::TokenBytes(_) => "TokenBytes",
    }
}

async fn handshake(
    framed: &mut ClientFramed,
    options: &ConnectOptions,
) -> Result<Welcome, ClientError> {
    let hello = Hello {
        major: PROTOCOL_MAJOR,
        minor: PROTOCOL_MINOR,
        client: options.client_name.clone(),
    };
    // A daemon that refuses us (not allowed) may close before reading `Hello`, failing
    // the write; its `Error` frame is still waiting to be read, and says more.
    let sent = framed.send(ClientMessage::Hello(hello)).await;
    match framed.next().await {
        Some(Ok(ServerMessage::Welcome(welcome))) if welcome.major == PROTOCOL_MAJOR => Ok(welcome),
        Some(Ok(ServerMessage::Welcome(welcome))) => Err(ClientError::VersionMismatch {
            client: (PROTOCOL_MAJOR, PROTOCOL_MINOR),
            daemon: format!(
                "protocol {}.{} (sparkd {})",
                welcome.major, welcome.minor, welcome.daemon_version
            ),
        }),
        Some(Ok(ServerMessage::Error(event))) => Err(event.into()),
        Some(Ok(other)) => Err(unexpected("Welcome", &other)),
        Some(Err(err)) => Err(sent
            .err()
            .map(ClientError::from)
            .unwrap_or_else(|| err.into())),
        None => Err(sent
            .err()
            .map(ClientError::from)
            .unwrap_or(ClientError::Disconnected)),
    }
}

/// The background task: writes queued messages, routes incoming frames, and fails every
/// pending request when the connection ends.
async fn run_connection(
    mut framed: ClientFramed,
    mut outgoing: mpsc::UnboundedReceiver<ClientMessage>,
    routes: Arc<Routes>,
) {
    let reason = loop {
        tokio::select! {
            message = outgoing.recv() => {
                let Some(message) = message else {
                    // Every handle is gone: nobody can read an answer any more.
                    break None;
                };
                if write_batch(&mut framed, message, &mut outgoing).await.is_err() {
                    break None;
                }
            }
            frame = framed.next() => match frame {
                Some(Ok(ServerMessage::Error(event))) if event.id.is_none() => break Some(event),
                Some(Ok(message)) => routes.deliver(message),
                Some(Err(_)) | None => break None,
            },
        }
    };
    routes.close(reason);
}

/// Writes one message and whatever else is already queued, then flushes once.
async fn write_batch(
    framed: &mut ClientFramed,
    first: ClientMessage,
    outgoing: &mut mpsc::UnboundedReceiver<ClientMessage>,
) -> Result<(), crate::codec::CodecError> {
    framed.feed(first).await?;
    while let Ok(next) = outgoing.try_recv() {
        framed.feed(next).await?;
    }
    framed.flush().await
}

impl Routes {
    fn new() -> Self {
        Self {
            state: Mutex::new(RouteState {
                pending: HashMap::new(),
                closed: None,
            }),
        }
    }

    fn lock(&self) -> MutexGuard<'_, RouteState> {
        // Nothing panics while holding the lock; if something did, the map is still
        // consistent (every operation is a single insert or remove).
        self.state
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    fn register(&self, id: u64, route: Route) -> Result<(), ClientError> {
        let mut state = self.lock();
        if let Some(reason) = &state.closed {
            return Err(closed_error(reason.as_ref()));
        }
        if state.pending.contains_key(&id) {
            return Err(ClientError::InvalidRequest {
                kind: ErrorKind::DuplicateId,
                message: format!("request id {id} is already in use on this connection"),
            });
        }
        state.pending.insert(id, route);
        Ok(())
    }

    /// Registers `route` under the first id from `next` that is not in use.
    fn register_fresh(&self, next: impl Fn() -> u64, route: Route) -> Result<u64, ClientError> {
        let mut state = self.lock();
        if let Some(reason) = &state.closed {
            return Err(closed_error(reason.as_ref()));
        }
        let id = std::iter::repeat_with(next)
            .find(|id| !state.pending.contains_key(id))
            .unwrap_or_default();
        state.pending.insert(id, route);
        Ok(id)
    }

    /// Forgets a request: frames that still arrive for it are dropped.
    pub(crate) fn remove(&self, id: u64) {
        self.lock().pending.remove(&id);
    }

    pub(crate) fn closed_error(&self) -> ClientError {
        match &self.lock().closed {
            Some(reason) => closed_error(reason.as_ref()),
            None => ClientError::Disconnected,
        }
    }

    fn deliver(&self, message: ServerMessage) {
        let id = match &message {
            ServerMessage::Token(event) => event.id,
            ServerMessage::Prefilled(event) => event.id,
            ServerMessage::ToolCall(event) => event.id,
            ServerMessage::ToolCallDelta(event) => event.id,
            ServerMessage::Reasoning(event) => event.id,
            ServerMessage::TokenBytes(event) => event.id,
            ServerMessage::Done(event) => event.id,
            ServerMessage::Error(ErrorEvent { id: Some(id), .. }) => *id,
            ServerMessage::Tokens { id, .. }
            | ServerMessage::Status { id, .. }
            | ServerMessage::Jobs { id, .. }
            | ServerMessage::Models { id, .. }
            | ServerMessage::Recorded { id, .. }
            | ServerMessage::CacheStatus { id, .. }
            | ServerMessage::ChatFormat { id, .. }
            | ServerMessage::JobEntries { id, .. } => *id,
            // A second Welcome, or a connection error (handled by the caller): no route.
            ServerMessage::Welcome(_) | ServerMessage::Error(ErrorEvent { id: None, .. }) => return,
        };
        let mut state = self.lock();
        let streamed = match message {
            ServerMessage::Token(event) => Ok(GenerationEvent::Token(event)),
            ServerMessage::Prefilled(event) => Ok(GenerationEvent::Prefilled(event)),
            ServerMessage::ToolCall(event) => Ok(GenerationEvent::ToolCall(event)),
            ServerMessage::ToolCallDelta(event) => Ok(GenerationEvent::ToolCallDelta(event)),
            ServerMessage::Reasoning(event) => Ok(GenerationEvent::Reasoning(event)),
            ServerMessage::TokenBytes(event) => Ok(GenerationEvent::TokenBytes(event)),
            other => Err(other),
        };
        let message = match streamed {
            // Events within a generation leave the route in place; anything else is the
            // request's last frame.
            Ok(event) => {
                match state.pending.get(&id) {
                    Some(Route::Generation(tx)) => {
                        let _ = tx.send(Ok(event));
                    }
                    Some(Route::Reply(_)) => {
                        if let Some(Route::Reply(tx)) = state.pending.remove(&id) {
                            let _ = tx.send(Err(unexpected("reply", &event.into_message())));
                        }
                    }
                    None => {}
                }
                return;
            }
            Err(last) => last,
        };
        // Frames for requests nobody waits for any more (a dropped generation, a reply
        // to an abandoned call) are expected, and dropped.
        let Some(route) = state.pending.remove(&id) else {
            return;
        };
        drop(state);
        match (route, message) {
            (Route::Generation(tx), ServerMessage::Done(event)) => {
                let _ = tx.send(Ok(GenerationEvent::Done(event)));
            }
            (Route::Generation(tx), ServerMessage::Error(event)) => {
                let _ = tx.send(Err(event.into()));
            }
            (Route::Generation(tx), other) => {
                let _ = tx.send(Err(unexpected("generation event", &other)));
            }
            (Route::Reply(tx), ServerMessage::Error(event)) => {
                let _ = tx.send(Err(event.into()));
            }
            (Route::Reply(tx), reply) => {
                let _ = tx.send(Ok(reply));
            }
        }
    }

    fn close(&self, reason: Option<ErrorEvent>) {
        let pending = {
            let mut state = self.lock();
            state.closed = Some(reason.clone());
            std::mem::take(&mut state.pending)
        };
        for (_, route) in pending {
            let err = closed_error(reason.as_ref());
            match route {
                Route::Generation(tx) => {
                    let _ = tx.send(Err(err));
                }
                Route::Reply(tx) => {
                    let _ = tx.send(Err(err));
                }
            }
        }
    }
}

fn closed_error(reason: Option<&ErrorEvent>) -> ClientError {
    match reason {
        Some(event) => event.clone().into(),
        None => ClientError::Disconnected,
    }
}

#[cfg(test)]
#[path = "client_tests.rs"]
mod tests;
