//! The shim's view of the daemon: a small trait, so the HTTP layer can be tested with a fake.

use futures::future::BoxFuture;
use futures::stream::BoxStream;

use crate::protocol::{
    CacheReport, ChatFormatReport, DoneEvent, ErrorKind, ExternalJob, GenerateOption,
    GenerateRequest, JobEntry, JobRecord, ModelInfo, OutputFormat, PrefillEvent, ReasoningEvent,
    StatusReport, TokenBytesEvent, TokenEvent, ToolCallDeltaEvent, ToolCallEvent,
};

/// One event of a running generation, in the order the daemon sent them.
#[derive(Debug, Clone, PartialEq)]
pub enum BackendEvent {
    /// How the prompt was read (cached tokens), before the first token; daemons older
    /// than protocol 1.2 never send it.
    Prefilled(PrefillEvent),
    Token(TokenEvent),
    /// A function call the model made (requests with tools only).
    ToolCall(ToolCallEvent),
    /// A piece of a call being written (requests with
    /// [`GenerateOption::StreamToolCalls`], to daemons speaking protocol 1.9 or later).
    ToolCallDelta(ToolCallDeltaEvent),
    /// A thinking model's reasoning, before the token that wrote it (daemons speaking
    /// protocol 1.6 or later).
    Reasoning(ReasoningEvent),
    /// The raw bytes of the next `Token` and its alternatives (requests with logprobs,
    /// daemons speaking protocol 1.11 or later).
    TokenBytes(TokenBytesEvent),
    /// Always the last event of a generation that was admitted.
    Done(DoneEvent),
}

/// A generation's events. Dropping it before its `Done` must cancel the generation in the
/// daemon: the HTTP layer relies on that when a client goes away mid-stream.
pub type EventStream = BoxStream<'static, Result<BackendEvent, BackendError>>;

/// Why the daemon could not serve a call. Each variant maps to one HTTP status.
#[derive(Debug, Clone, thiserror::Error)]
pub enum BackendError {
    /// The daemon is not running, or the connection to it broke.
    #[error("the sparkd daemon is unavailable: {0}")]
    Unavailable(String),
    /// The daemon's queue is full.
    #[error("the sparkd daemon is busy: {0}")]
    Busy(String),
    /// The daemon refused the request (`InvalidRequest`, `ContextOverflow`, `UnknownModel`...).
    #[error("{message}")]
    Rejected { kind: ErrorKind, message: String },
    /// The engine failed while running the request.
    #[error("engine error: {0}")]
    Engine(String),
    /// The daemon answered something this client does not understand (e.g. another
    /// protocol major version).
    #[error("unexpected answer from the sparkd daemon: {0}")]
    Protocol(String),
}

/// What the OpenAI shim needs from the daemon.
///
/// Methods return boxed futures so the trait stays object safe (`Arc<dyn Backend>`).
pub trait Backend: Send + Sync + 'static {
    /// Starts a generation whose text takes `format`, with `options` (chat-template
    /// variables...). The implementation chooses `req.id` (whatever the caller put there
    /// is overwritten), because ids must be unique on the daemon connection.
    fn generate(
        &self,
        req: GenerateRequest,
        format: OutputFormat,
        options: Vec<GenerateOption>,
    ) -> BoxFuture<'_, Result<EventStream, BackendError>>;
    fn models(&self) -> BoxFuture<'_, Result<Vec<ModelInfo>, BackendError>>;
    fn status(&self) -> BoxFuture<'_, Result<StatusReport, BackendError>>;
    /// The most recent finished jobs, newest first, at most `limit`.
    fn jobs(&self, limit: u32) -> BoxFuture<'_, Result<Vec<JobEntry>, BackendError>>;
    /// The daemon's prefix cache (daemons speaking protocol 1.2 or later).
    fn cache_status(&self) -> BoxFuture<'_, Result<CacheReport, BackendError>> {
        Box::pin(async {
            Err(BackendError::Unavailable(
                "this backend keeps no prefix cache".into(),
            ))
        })
    }
    /// How the daemon renders the model's chats (daemons speaking protocol 1.8 or later).
    fn chat_format(&self) -> BoxFuture<'_, Result<ChatFormatReport, BackendError>> {
        Box::pin(async {
            Err(BackendError::Unavailable(
                "this backend reports no chat format".into(),
            ))
        })
    }
    /// Books a job an upstream engine served in the daemon's jobs list (see `proxy`).
    fn record_job(&self, _job: ExternalJob) -> BoxFuture<'_, Result<JobRecord, BackendError>> {
        Box::pin(async {
            Err(BackendError::Unavailable(
                "this backend keeps no jobs list".into(),
            ))
        })
    }
}
