//! What the socket server asks of the engine: the boundary between async I/O and the
//! engine thread. The server only sees this trait, so its tests run against a fake.

use std::time::Instant;

use spark_client::protocol::{
    CacheReport, ChatFormatReport, ErrorEvent, ExternalJob, FinishReason, GenerateOption,
    GenerateRequest, JobEntry, JobRecord, ModelInfo, OutputFormat, ServerMessage, StatusReport,
    TokenPiece,
};
use tokio::sync::mpsc::UnboundedSender;

/// Identifies one socket connection for the life of the daemon.
pub type ConnId = u64;

/// Who is on the other end of a connection, from the socket's peer credentials.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct ClientInfo {
    pub pid: Option<u32>,
    pub uid: Option<u32>,
    pub gid: Option<u32>,
}

/// A generate request as it reaches the engine.
#[derive(Debug)]
pub struct Submission {
    pub conn: ConnId,
    pub client: ClientInfo,
    pub request: GenerateRequest,
    pub format: OutputFormat,
    /// The request's options (`GenerateWith`, protocol 1.7): chat-template variables.
    pub options: Vec<GenerateOption>,
    /// The client takes a thinking model's reasoning apart from its answer
    /// (`ServerMessage::Reasoning`, protocol 1.6): chat answers are split.
    pub split_reasoning: bool,
    /// The client reads `ServerMessage::TokenBytes` (protocol 1.11): each token that
    /// carries logprobs is preceded by its raw bytes and its alternatives'.
    pub token_bytes: bool,
    /// When the request's frame was decoded: the start of `queue_ms` and `ttft_ms`.
    pub arrived: Instant,
    /// Where this request's `Token`, `Error` and final `Done` go. The engine never
    /// blocks on it; a closed channel means the client is gone and the request ends.
    pub events: UnboundedSender<ServerMessage>,
}

/// The engine as the server sees it. Every method returns quickly: generation itself
/// happens on the engine's own thread and reports through `Submission::events`.
pub trait Engine: Send + Sync + 'static {
    /// Validates and queues a generation. An `Err` is sent to the client as is and no
    /// `Done` follows it (the request never started).
    fn submit(&self, submission: Submission) -> Result<(), ErrorEvent>;
    /// Ends one request of a connection; its stream still ends with a `Done` carrying
    /// `reason`. Unknown ids are ignored (the request may have just finished).
    fn cancel(&self, conn: ConnId, request_id: u64, reason: FinishReason);
    /// Ends every request of a connection that went away, within one engine step.
    fn cancel_connection(&self, conn: ConnId);
    fn tokenize(&self, text: &str, special: bool) -> Result<Vec<TokenPiece>, ErrorEvent>;
    fn status(&self) -> StatusReport;
    /// The prefix cache's state and totals.
    fn cache_status(&self) -> CacheReport;
    /// How the model's chats are rendered and read.
    fn chat_format(&self) -> ChatFormatReport;
    /// Most recent first, at most `limit`.
    fn jobs(&self, limit: usize) -> Vec<JobEntry>;
    fn models(&self) -> Vec<ModelInfo>;
    /// Books a job another engine served (reported by a proxy) in the jobs list and
    /// returns it as listed. The default keeps nothing and numbers it 0, for engines
    /// without a jobs list.
    fn record_external(&self, job: ExternalJob, client: ClientInfo) -> JobRecord {
        job.to_record(0, client.pid, client.uid)
    }
}
