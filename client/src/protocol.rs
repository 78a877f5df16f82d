//! The sparkd wire protocol: every message a client and the daemon exchange.
//!
//! Frames are a big-endian u32 length followed by one postcard-encoded message (see
//! `codec`). Postcard is not self-describing, so the rules for evolving these types are
//! strict (see `PROTOCOL.md`): a new field or a changed field is a new major version; a
//! minor version may only add new enum variants at the end of an enum.

use serde::{Deserialize, Serialize};

/// Bumped when an existing message changes shape. Peers with different majors refuse
/// each other with [`ErrorKind::VersionMismatch`].
pub const PROTOCOL_MAJOR: u16 = 1;
/// Bumped when variants are appended. A newer minor may send variants an older peer
/// does not know; peers announce their minor so the other side can avoid that.
pub const PROTOCOL_MINOR: u16 = 11;
/// Default cap on one frame's payload, checked before any allocation.
pub const DEFAULT_MAX_FRAME_BYTES: usize = 1 << 20;

/// A message from a client to the daemon.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub enum ClientMessage {
    /// Must be the first message on a connection.
    Hello(Hello),
    /// Starts a generation; its events carry the same `id`.
    Generate(GenerateRequest),
    /// Stops a running or queued generation. The stream still ends with a `Done`.
    Cancel {
        id: u64,
    },
    /// Turns text into token ids with the loaded model's tokenizer.
    Tokenize {
        id: u64,
        text: String,
        /// Parse special tokens such as `<|im_start|>` in `text`.
        special: bool,
    },
    Status {
        id: u64,
    },
    /// The most recent finished jobs, newest first, at most `limit`.
    Jobs {
        id: u64,
        limit: u32,
    },
    Models {
        id: u64,
    },
    /// Books a job that another engine served (measured by a proxy such as
    /// `spark serve-openai --upstream`) in the daemon's jobs list. Since 1.1; the daemon
    /// answers `Recorded`.
    RecordJob {
        id: u64,
        job: ExternalJob,
    },
    /// The prefix cache's state and totals. Since 1.2; the daemon answers
    /// `CacheStatus`.
    CacheStatus {
        id: u64,
    },
    /// `Generate` with its text held to a format (JSON output). Since 1.3 (the format
    /// [`OutputFormat::JsonSchema`] since 1.4); answered like `Generate`.
    GenerateFormatted {
        request: GenerateRequest,
        format: OutputFormat,
    },
    /// `GenerateFormatted` with options that neither the request nor its format carry.
    /// Since 1.7; answered like `Generate`. New options are appended to
    /// [`GenerateOption`] (a minor version each), so no further generate message is
    /// needed for them.
    GenerateWith {
        request: GenerateRequest,
        format: OutputFormat,
        /// At most [`MAX_GENERATE_OPTIONS`](crate::limits::MAX_GENERATE_OPTIONS), each
        /// kind at most once.
        #[serde(
            deserialize_with = "crate::limits::bounded::<_, _, { crate::limits::MAX_GENERATE_OPTIONS }>"
        )]
        options: Vec<GenerateOption>,
    },
    /// How the loaded model's chats are rendered and read. Since 1.8; the daemon answers
    /// `ChatFormat`.
    ChatFormat {
        id: u64,
    },
    /// The most recent finished jobs, newest first, at most `limit`, each with what its
    /// `JobRecord` cannot carry (see [`JobEntry`]). Since 1.10; the daemon answers
    /// `JobEntries`.
    JobEntries {
        id: u64,
        limit: u32,
    },
}

/// An option of [`ClientMessage::GenerateWith`].
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub enum GenerateOption {
    /// Variables for the chat template, beside the messages and tools: the text of a
    /// JSON object whose members the template sees under their names (what vLLM and
    /// llama-server take as `chat_template_kwargs`: Qwen 3's `enable_thinking`,
    /// GPT-OSS's `reasoning_effort`). They override the daemon's own
    /// `--chat-template-kwargs` member by member. Names the daemon sets itself
    /// (`messages`, `tools`, `add_generation_prompt`, `bos_token`...) are refused, and so
    /// is a raw prompt, which no template renders. At most
    /// [`MAX_TEMPLATE_VARIABLES_BYTES`](crate::limits::MAX_TEMPLATE_VARIABLES_BYTES).
    /// Since 1.7.
    TemplateVariables(String),
    /// Streams each tool call while the model writes it ([`ServerMessage::ToolCallDelta`]),
    /// as OpenAI's streaming API does: its id and name as soon as the name is whole,
    /// then its arguments' text piece by piece. The whole [`ServerMessage::ToolCall`]
    /// still follows when the call is complete. A call whose pieces began and that is
    /// then cut short (`max_tokens`, a stop string, a cancel) ends there, in pieces
    /// only, instead of coming back as text. Other inputs make no calls: there it
    /// changes nothing. Since 1.9.
    StreamToolCalls,
}

impl GenerateOption {
    /// The protocol minor version that introduced this option.
    pub fn since_minor(&self) -> u16 {
        match self {
            GenerateOption::TemplateVariables(_) => 7,
            GenerateOption::StreamToolCalls => 9,
        }
    }

    /// Whether the answer is right without it, only in another shape: a client may
    /// leave it out for a daemon too old to know it (the Rust client does).
    pub fn is_preference(&self) -> bool {
        match self {
            GenerateOption::TemplateVariables(_) => false,
            GenerateOption::StreamToolCalls => true,
        }
    }
}

/// The form a generation's text must take.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub enum OutputFormat {
    /// Whatever the model writes (what `Generate` gives).
    #[default]
    Text,
    /// One JSON object (RFC 8259) and nothing else: each step only tokens that keep the
    /// text a valid beginning of one may be chosen, and the generation ends, finish
    /// reason `Stop`, when the object closes. End-of-generation and control tokens are
    /// held back until then; stop strings and `max_tokens` still end it early (then the
    /// object is incomplete). The text starts with the `{`; strings hold valid UTF-8 and
    /// no unpaired surrogate escape; numbers stay below 10^308, with at most 32 fraction
    /// digits; nesting stops at 64 levels and whitespace between tokens at 64 bytes in a
    /// row.
    JsonObject,
    /// [`OutputFormat::JsonObject`], and the object valid under this JSON Schema (the
    /// document's text). Since 1.4. A schema the daemon cannot enforce is refused with
    /// `InvalidRequest` and a message that says what and where, rather than answered
    /// with text that may not match it: supported are `type`, `properties`, `required`,
    /// `additionalProperties`, `items`, `minItems`/`maxItems`,
    /// `minLength`/`maxLength`, `minimum`/`maximum` and their exclusive forms, `enum`,
    /// `const`, `anyOf`/`oneOf` whose alternatives begin differently (a string or
    /// null) or are objects told apart by a tag property or by a required key of
    /// each one's own, `allOf` of one schema, and
    /// `$ref` within the document (recursive too);
    /// annotations such as `description` and `format` are ignored. Listed properties
    /// come in any order, each at most once; other keys only where
    /// `additionalProperties` is a schema or the object lists no properties.
    JsonSchema { schema: String },
}

impl OutputFormat {
    /// The protocol minor version that introduced this format.
    pub fn since_minor(&self) -> u16 {
        match self {
            OutputFormat::Text | OutputFormat::JsonObject => 3,
            OutputFormat::JsonSchema { .. } => 4,
        }
    }
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Hello {
    pub major: u16,
    pub minor: u16,
    /// Free-form client name and version, for logs (never user content).
    pub client: String,
}

/// A message from the daemon to a client.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub enum ServerMessage {
    /// The answer to a compatible `Hello`.
    Welcome(Welcome),
    Token(TokenEvent),
    /// The last frame of every generation, whatever ended it.
    Done(DoneEvent),
    /// A failure. With an `id` it belongs to that request (a generation's stream still
    /// ends with `Done` when it had started); without, it concerns the connection, which
    /// the daemon closes after sending it.
    Error(ErrorEvent),
    Tokens {
        id: u64,
        tokens: Vec<TokenPiece>,
    },
    Status {
        id: u64,
        status: StatusReport,
    },
    Jobs {
        id: u64,
        jobs: Vec<JobRecord>,
    },
    Models {
        id: u64,
        models: Vec<ModelInfo>,
    },
    /// The answer to `RecordJob`: the job as the jobs list now shows it. Since 1.1.
    Recorded {
        id: u64,
        job: JobRecord,
    },
    /// A generation's prompt has been read: sent once, right before its first `Token`.
    /// Since 1.2; the daemon sends it only to clients that announced 1.2 or later.
    Prefilled(PrefillEvent),
    /// The answer to `ClientMessage::CacheStatus`. Since 1.2.
    CacheStatus {
        id: u64,
        cache: CacheReport,
    },
    /// A function call the model made, sent as soon as its arguments are complete and
    /// before the generation's `Done` (whose finish reason is then `Stop`, or `Length`
    /// when a later call was cut short). Only sent for `PromptInput::ChatWithTools`.
    /// Since 1.5.
    ToolCall(ToolCallEvent),
    /// Reasoning a thinking model wrote before its answer (`<think>` ... `</think>`,
    /// tags left out), sent right before the `Token` event of the token that wrote it,
    /// whose `text` then holds only answer text (often none). Sent for chat requests
    /// without an output format or a forced call, and only to clients that announced
    /// 1.6 or later: older clients get the reasoning in the tokens' text, as before.
    /// Since 1.6.
    Reasoning(ReasoningEvent),
    /// The answer to `ClientMessage::ChatFormat`. Since 1.8.
    ChatFormat {
        id: u64,
        format: ChatFormatReport,
    },
    /// A piece of a tool call being written, for requests with
    /// [`GenerateOption::StreamToolCalls`]: the first piece of a call carries its
    /// opening (id and name), and the pieces' `arguments` put end to end are the
    /// `arguments` of the call's `ToolCall` event, which follows them once the call is
    /// complete (in Mistral's list syntax, when the list closes). Sent right before the
    /// `Token` event of the token that wrote it. Since 1.9.
    ToolCallDelta(ToolCallDeltaEvent),
    /// The answer to `ClientMessage::JobEntries`. Since 1.10.
    JobEntries {
        id: u64,
        jobs: Vec<JobEntry>,
    },
    /// The raw bytes of a token that carries logprobs and of its alternatives, sent
    /// right before that token's `Token` event to clients that announced 1.11 or later.
    /// Since 1.11.
    TokenBytes(TokenBytesEvent),
}

/// What a token's `String`s cannot hold: a byte-level vocabulary writes a character
/// of several bytes (an emoji, most CJK) over several tokens, each holding part of it.
/// [`TokenEvent::text`] holds the text once whole and [`TokenLogprobs::top`] shows a
/// partial alternative as U+FFFD; these are each token's own bytes, which OpenAI's
/// `logprobs.bytes` carry.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct TokenBytesEvent {
    /// The generation's id.
    pub id: u64,
    /// The chosen token's bytes; a control token's are its text (`<|im_end|>`), which
    /// the text stream leaves out, as `top` shows it.
    pub bytes: Vec<u8>,
    /// The bytes of each alternative of [`TokenLogprobs::top`], in the same order.
    pub top: Vec<Vec<u8>>,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ToolCallDeltaEvent {
    /// The generation's id.
    pub id: u64,
    /// The call's index, as its `ToolCall` event has it.
    pub index: u32,
    /// In the call's first piece only.
    pub opening: Option<ToolCallOpening>,
    /// What follows of the arguments' text: whole characters, possibly none.
    pub arguments: String,
}

/// What is known of a call before its arguments: what OpenAI's first streamed chunk of
/// a call carries.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ToolCallOpening {
    /// The id its `ToolCall` will have.
    pub id: String,
    pub name: String,
}

#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct ReasoningEvent {
    /// The generation's id.
    pub id: u64,
    pub text: String,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ToolCallEvent {
    /// The generation's id.
    pub id: u64,
    /// 0 for the generation's first call, then 1, 2...
    pub index: u32,
    pub call: ToolCall,
}

impl ClientMessage {
    /// The protocol minor version that introduced this message: a peer that announced
    /// an older minor cannot decode it.
    pub fn since_minor(&self) -> u16 {
        match self {
            ClientMessage::RecordJob { .. } => 1,
            ClientMessage::CacheStatus { .. } => 2,
            ClientMessage::ChatFormat { .. } => 8,
            ClientMessage::JobEntries { .. } => 10,
            ClientMessage::GenerateFormatted { request, format } => {
                format.since_minor().max(request.input.since_minor())
            }
            ClientMessage::GenerateWith {
                request,
                format,
                options,
            } => options
                .iter()
                .map(GenerateOption::since_minor)
                .fold(7, u16::max)
                .max(format.since_minor())
                .max(request.input.since_minor()),
            ClientMessage::Generate(request) => request.input.since_minor(),
            ClientMessage::Hello(_)
            | ClientMessage::Cancel { .. }
            | ClientMessage::Tokenize { .. }
            | ClientMessage::Status { .. }
            | ClientMessage::Jobs { .. }
            | ClientMessage::Models { .. } => 0,
        }
    }
}

impl ServerMessage {
    /// The protocol minor version that introduced this message: a peer that announced
    /// an older minor cannot decode it.
    pub fn since_minor(&self) -> u16 {
        match self {
            ServerMessage::Recorded { .. } => 1,
            ServerMessage::Prefilled(_) | ServerMessage::CacheStatus { .. } => 2,
            ServerMessage::ToolCall(_) => 5,
            ServerMessage::Reasoning(_) => 6,
            ServerMessage::ChatFormat { .. } => 8,
            ServerMessage::ToolCallDelta(_) => 9,
            ServerMessage::JobEntries { .. } => 10,
            ServerMessage::TokenBytes(_) => 11,
            ServerMessage::Welcome(_)
            | ServerMessage::Token(_)
            | ServerMessage::Done(_)
            | ServerMessage::Error(_)
            | ServerMessage::Tokens { .. }
            | ServerMessage::Status { .. }
            | ServerMessage::Jobs { .. }
            | ServerMessage::Models { .. } => 0,
        }
    }
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Welcome {
    pub major: u16,
    pub minor: u16,
    pub daemon_version: String,
    /// The largest frame the daemon accepts, in bytes.
    pub max_frame_bytes: u32,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct GenerateRequest {
    /// Chosen by the client, unique among its connection's running requests.
    pub id: u64,
    /// `None` is the daemon's loaded model; a name that is not loaded is `UnknownModel`.
    pub model: Option<String>,
    pub input: PromptInput,
    pub sampling: SamplingParams,
    /// `None`: up to the end of the context.
    pub max_tokens: Option<u32>,
    /// Generation ends before any of these strings; it is not emitted. At most
    /// [`MAX_STOP_STRINGS`](crate::limits::MAX_STOP_STRINGS).
    #[serde(
        deserialize_with = "crate::limits::bounded::<_, _, { crate::limits::MAX_STOP_STRINGS }>"
    )]
    pub stop: Vec<String>,
    /// `Some(n)`: each token event carries the chosen token's logprob and the top `n`
    /// alternatives (`n` at most 20).
    pub logprobs: Option<u8>,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub enum PromptInput {
    /// Rendered with the model's chat template, with the generation prompt added.
    Chat {
        /// At most [`MAX_CHAT_MESSAGES`](crate::limits::MAX_CHAT_MESSAGES).
        #[serde(
            deserialize_with = "crate::limits::bounded::<_, _, { crate::limits::MAX_CHAT_MESSAGES }>"
        )]
        messages: Vec<ChatMessage>,
    },
    /// Used as is; `special` parses special-token text into special tokens.
    Raw { text: String, special: bool },
    /// A chat whose model may call functions (tools). Since 1.5. The messages and the
    /// tools are rendered by the model's chat template (or, when the template knows no
    /// tools, described in a system message); the calls the model writes come back as
    /// [`ServerMessage::ToolCall`] events, each held to its tool's parameter schema while
    /// it is written, and their text is not sent as token text. The request's output
    /// format must be `Text`.
    ChatWithTools {
        /// At most [`MAX_CHAT_MESSAGES`](crate::limits::MAX_CHAT_MESSAGES).
        #[serde(
            deserialize_with = "crate::limits::bounded::<_, _, { crate::limits::MAX_CHAT_MESSAGES }>"
        )]
        messages: Vec<ToolChatMessage>,
        /// At most [`MAX_TOOLS`](crate::limits::MAX_TOOLS), names unique.
        #[serde(deserialize_with = "crate::limits::bounded::<_, _, { crate::limits::MAX_TOOLS }>")]
        tools: Vec<ToolSpec>,
        choice: ToolChoice,
        /// Whether the model may make more than one call in its answer.
        parallel: bool,
    },
}

impl PromptInput {
    /// The protocol minor version that introduced this kind of input.
    pub fn since_minor(&self) -> u16 {
        match self {
            PromptInput::Chat { .. } | PromptInput::Raw { .. } => 0,
            PromptInput::ChatWithTools { .. } => 5,
        }
    }
}

/// A chat message that may carry tool calls (an assistant's) or a tool's result.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ToolChatMessage {
    /// `system`, `user`, `assistant` or `tool`.
    pub role: String,
    /// `None` for an assistant message that only calls tools.
    pub content: Option<String>,
    /// The calls an assistant message made (earlier turns of the conversation).
    #[serde(deserialize_with = "crate::limits::bounded::<_, _, { crate::limits::MAX_TOOLS }>")]
    pub tool_calls: Vec<ToolCall>,
    /// For a `tool` message: the id of the call it answers.
    pub tool_call_id: Option<String>,
}

impl ToolChatMessage {
    pub fn new(role: impl Into<String>, content: impl Into<String>) -> Self {
        Self {
            role: role.into(),
            content: Some(content.into()),
            tool_calls: Vec::new(),
            tool_call_id: None,
        }
    }
}

/// A function the model may call.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ToolSpec {
    /// 1 to 64 characters of `a-z`, `A-Z`, `0-9`, `_` and `-` (OpenAI's rule).
    pub name: String,
    pub description: String,
    /// The JSON Schema of the arguments object (the document's text); empty: any
    /// object. The arguments are held to it while written, like
    /// [`OutputFormat::JsonSchema`]; a schema the daemon cannot enforce is refused when
    /// `strict`, and otherwise loosened to any object.
    pub parameters: String,
    pub strict: bool,
}

/// Whether and how the model calls tools.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub enum ToolChoice {
    /// The model answers in text or calls tools, as it decides.
    #[default]
    Auto,
    /// The model answers in text; the tools are not shown to it.
    None,
    /// The answer is one call of any offered function, and no text.
    Required,
    /// The answer is one call of this function.
    Function(String),
}

/// One function call.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ToolCall {
    /// Made by the daemon for calls it reports (`call_` and 24 letters and digits); a
    /// client sends back the ids it got.
    pub id: String,
    pub name: String,
    /// The arguments: one JSON object, as text.
    pub arguments: String,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ChatMessage {
    /// `system`, `user` or `assistant` (others are passed to the template as they are).
    pub role: String,
    pub content: String,
}

impl ChatMessage {
    pub fn new(role: impl Into<String>, content: impl Into<String>) -> Self {
        Self {
            role: role.into(),
            content: content.into(),
        }
    }
}

/// How the next token is chosen. The defaults are greedy decoding with no penalties.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct SamplingParams {
    /// 0 is greedy. Must be finite and >= 0.
    pub temperature: f32,
    /// 0 disables.
    pub top_k: u32,
    /// In (0, 1]; 1 disables.
    pub top_p: f32,
    /// In [0, 1]; 0 disables.
    pub min_p: f32,
    /// > 0; 1 disables. Applied over the last `repeat_last_n` tokens.
    pub repeat_penalty: f32,
    pub repeat_last_n: u32,
    /// In [-2, 2], OpenAI semantics.
    pub presence_penalty: f32,
    /// In [-2, 2], OpenAI semantics.
    pub frequency_penalty: f32,
    /// The same seed and prompt give the same tokens. `None`: the daemon picks one.
    pub seed: Option<u64>,
    /// Added to the logits of these token ids before sampling. At most
    /// [`MAX_LOGIT_BIAS`](crate::limits::MAX_LOGIT_BIAS) entries.
    #[serde(
        deserialize_with = "crate::limits::bounded::<_, _, { crate::limits::MAX_LOGIT_BIAS }>"
    )]
    pub logit_bias: Vec<(u32, f32)>,
}

impl Default for SamplingParams {
    fn default() -> Self {
        Self {
            temperature: 0.0,
            top_k: 0,
            top_p: 1.0,
            min_p: 0.0,
            repeat_penalty: 1.0,
            repeat_last_n: 64,
            presence_penalty: 0.0,
            frequency_penalty: 0.0,
            seed: None,
            logit_bias: Vec::new(),
        }
    }
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct TokenEvent {
    pub id: u64,
    pub token: u32,
    /// The text this token completes. Always whole UTF-8: bytes of a partial character
    /// are held back and sent with the token that completes it, so this may be empty.
    pub text: String,
    pub logprobs: Option<TokenLogprobs>,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct TokenLogprobs {
    /// Natural-log probability of the chosen token under the unmodified distribution.
    pub logprob: f32,
    /// The most likely alternatives, most likely first.
    pub top: Vec<(u32, String, f32)>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum FinishReason {
    /// An end-of-sequence token or a stop string.
    Stop,
    /// `max_tokens` or the end of the context.
    Length,
    /// The client sent `Cancel`.
    Cancelled,
    /// The client's connection went away (recorded in the jobs list; nobody reads it).
    Disconnected,
    /// The daemon shut down before the generation ended.
    Shutdown,
    /// The engine failed; an `Error` with the same id precedes this `Done`.
    Error,
}

impl FinishReason {
    pub fn as_str(self) -> &'static str {
        match self {
            FinishReason::Stop => "stop",
            FinishReason::Length => "length",
            FinishReason::Cancelled => "cancelled",
            FinishReason::Disconnected => "disconnected",
            FinishReason::Shutdown => "shutdown",
            FinishReason::Error => "error",
        }
    }
}

#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Usage {
    pub prompt_tokens: u32,
    pub completion_tokens: u32,
}

/// Engine-side timings of one request, in milliseconds, measured around the model's
/// forward passes (never around socket writes). See `PROTOCOL.md` for the definitions.
#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize, Deserialize)]
pub struct Timings {
    /// Arrival at the daemon to admission into the running batch.
    pub queue_ms: f64,
    /// Arrival to the first generated token being sampled. `None` if none was.
    pub ttft_ms: Option<f64>,
    /// Sum of the forward steps that processed this request's prompt.
    pub prefill_ms: f64,
    /// First sampled token to the last one.
    pub generation_ms: f64,
    /// Sum of the forward steps in which this request decoded a token after the first.
    pub decode_ms: f64,
    /// (completion_tokens - 1) / decode_ms. `None` with fewer than two tokens.
    pub decode_tps: Option<f64>,
    /// Prompt tokens run through the model / prefill_ms: tokens taken from the daemon's
    /// prefix cache are not counted. `None` when no prompt was processed.
    pub prefill_tps: Option<f64>,
}

/// How a generation's prompt was read (protocol 1.2).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct PrefillEvent {
    pub id: u64,
    /// The prompt's length in tokens, as the final `Usage` will count it.
    pub prompt_tokens: u32,
    /// How many of them the daemon took from its prefix cache instead of computing them
    /// (at the admission that produced the first token).
    pub cached_tokens: u32,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct DoneEvent {
    pub id: u64,
    pub finish_reason: FinishReason,
    pub usage: Usage,
    pub timings: Timings,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum ErrorKind {
    /// A frame that did not decode as a message.
    BadFrame,
    /// A frame over the size limit.
    FrameTooLarge,
    /// The first message was not `Hello`, or came twice.
    Handshake,
    VersionMismatch,
    /// The queue is full; try again later.
    Busy,
    /// A field is out of range; the message names it.
    InvalidRequest,
    /// Prompt plus `max_tokens` does not fit in the context.
    ContextOverflow,
    UnknownModel,
    /// The request id is already running on this connection.
    DuplicateId,
    /// The connecting user is not allowed.
    NotAllowed,
    /// The engine failed while running the request.
    Engine,
    ShuttingDown,
    Internal,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ErrorEvent {
    pub id: Option<u64>,
    pub kind: ErrorKind,
    pub message: String,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct TokenPiece {
    pub id: u32,
    /// The token's text (lossy for tokens that are part of a UTF-8 sequence).
    pub piece: String,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ModelInfo {
    pub name: String,
    pub path: String,
    pub architecture: String,
    /// The file's dominant tensor type, e.g. `Q4_1`.
    pub quantization: String,
    pub parameters: u64,
    pub context_length: u32,
    pub file_bytes: u64,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct StatusReport {
    pub daemon_version: String,
    pub model: ModelInfo,
    /// `cpu` or `cuda`.
    pub backend: String,
    /// E.g. `AMD EPYC (2 threads, avx2)` or `NVIDIA GB10 (sm_121)`.
    pub device: String,
    pub resident_bytes: u64,
    pub uptime_s: f64,
    pub running: u32,
    pub queued: u32,
    pub kv_blocks_used: u32,
    pub kv_blocks_total: u32,
    pub kv_block_tokens: u32,
    pub requests_served: u64,
    pub tokens_generated: u64,
    pub prompt_tokens_processed: u64,
}

/// How the daemon renders the loaded model's chats and reads its answers (protocol
/// 1.8), as it made them out when the model loaded: what to check when a model calls
/// tools or thinks other than expected.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct ChatFormatReport {
    /// Whether there is a chat template (the model's, or `--chat-template`); without
    /// one, chat requests are refused and only raw prompts are served.
    pub template: bool,
    /// How tools reach the model: `hermes` (`<tool_call>` tags), `llama` (a bare JSON
    /// call), `mistral` (`[TOOL_CALLS]` and an array), `mistral-args`
    /// (`[TOOL_CALLS]name[ARGS]...`), `mistral-args-ids` (with `[CALL_ID]`), or
    /// `described` (in a system message, calls in the Hermes syntax).
    pub tools: String,
    /// Whether the template renders system messages (when not, they are merged into
    /// the next user message).
    pub system_role: bool,
    /// The tags the model's reasoning is read between, e.g. `<think>` and `</think>`.
    pub think_open: String,
    pub think_close: String,
    /// The template's variables besides those the daemon sets, sorted: the switches
    /// that `GenerateOption::TemplateVariables` can set (`enable_thinking`,
    /// `reasoning_effort`...). At most
    /// [`MAX_TEMPLATE_SWITCHES`](crate::limits::MAX_TEMPLATE_SWITCHES).
    #[serde(
        deserialize_with = "crate::limits::bounded::<_, _, { crate::limits::MAX_TEMPLATE_SWITCHES }>"
    )]
    pub variables: Vec<String>,
}

/// The daemon's prefix cache (protocol 1.2): what it holds now and what it saved since
/// the daemon started. Blocks are `kv_block_tokens` positions each (see `StatusReport`).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct CacheReport {
    /// `--prefix-cache on`. When off, every figure below is 0.
    pub enabled: bool,
    /// KV blocks holding a cached prefix, whether running requests hold them or not.
    pub cached_blocks: u32,
    /// Of those, the blocks no request holds: kept for later prompts, and the first to
    /// give way when running requests need room.
    pub idle_blocks: u32,
    /// Cached blocks given up for room since the start.
    pub evicted_blocks: u64,
    /// Prompt tokens taken from the cache instead of computed, since the start (of
    /// `StatusReport::prompt_tokens_processed`, which counts every prompt token).
    pub prompt_tokens_reused: u64,
}

/// One finished generation as the daemon remembers it: counts and timings, never text.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct JobRecord {
    /// Daemon-wide job number (not the client's request id).
    pub job: u64,
    /// The client's request id.
    pub request_id: u64,
    pub client_pid: Option<u32>,
    pub client_uid: Option<u32>,
    pub model: String,
    /// `sparkd`, or the name of the upstream engine that served a forwarded job.
    pub engine: String,
    /// Milliseconds since the Unix epoch.
    pub started_unix_ms: u64,
    pub finished_unix_ms: u64,
    pub usage: Usage,
    pub timings: Timings,
    pub finish_reason: FinishReason,
    /// True when counts were estimated rather than reported by the engine.
    pub estimated: bool,
}

/// A finished job as `ClientMessage::JobEntries` lists it: the record, and the figures
/// that came after `JobRecord`'s shape was fixed (postcard is positional, so a record
/// cannot grow a field within major 1). Since 1.10.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct JobEntry {
    pub record: JobRecord,
    /// Of the prompt's tokens, those the daemon took from its prefix cache instead of
    /// computing them (`PrefillEvent::cached_tokens`). `None` for a job the daemon did
    /// not run itself (a forwarded one) and for one that never reached admission.
    pub cached_tokens: Option<u32>,
}

impl From<JobRecord> for JobEntry {
    /// An entry with nothing known beyond the record: what a daemon older than 1.10
    /// can tell.
    fn from(record: JobRecord) -> Self {
        JobEntry {
            record,
            cached_tokens: None,
        }
    }
}

/// A job another engine served, as the proxy in front of it measured it: counts and
/// timings, never text. Sent with `ClientMessage::RecordJob` (protocol 1.1).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ExternalJob {
    /// The upstream's name (`--upstream NAME=URL`); the record's `engine`.
    pub engine: String,
    /// The upstream's base URL. Not part of `JobRecord`.
    pub upstream: String,
    pub model: String,
    /// The proxy's own number for the request; the record's `request_id`.
    pub request_id: u64,
    /// Milliseconds since the Unix epoch.
    pub started_unix_ms: u64,
    pub finished_unix_ms: u64,
    pub usage: Usage,
    /// As far as the proxy could measure them; see `decode_clock` and `PROTOCOL.md`.
    pub timings: Timings,
    /// `Error` when the upstream answered an HTTP error or its body broke off.
    pub finish_reason: FinishReason,
    /// Where `usage` came from.
    pub counts: CountSource,
    /// What `timings.decode_ms` (and so `decode_tps`) measures.
    pub decode_clock: DecodeClock,
    /// The upstream's HTTP status; 0 when it never answered.
    pub http_status: u16,
}

/// Where a forwarded job's token counts came from.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum CountSource {
    /// The engine's own report (an OpenAI `usage` object, Ollama's `eval_count`...).
    Reported,
    /// Counted from the streamed chunks: the engine sent no report.
    Estimated,
    /// Not counted (a compressed or failed body): the counts are 0.
    Unknown,
}

/// What a forwarded job's `decode_ms` measures.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum DecodeClock {
    /// Nothing: no decode time (an embedding, an error, no tokens).
    None,
    /// The engine's own figure (Ollama's `eval_duration`); `decode_tps` is the
    /// engine's tokens over it.
    Engine,
    /// The proxy's clock from the first to the last body byte of a stream;
    /// `decode_tps` is `(completion_tokens - 1) / decode_ms`.
    Stream,
    /// The whole request as the proxy saw it (a non-streaming reply), prefill included:
    /// `decode_tps` = `completion_tokens / decode_ms` is a lower bound.
    Request,
}

impl ExternalJob {
    /// The job as a jobs list shows it, numbered `job` and attributed to the client
    /// that reported it.
    pub fn to_record(
        &self,
        job: u64,
        client_pid: Option<u32>,
        client_uid: Option<u32>,
    ) -> JobRecord {
        JobRecord {
            job,
            request_id: self.request_id,
            client_pid,
            client_uid,
            model: self.model.clone(),
            engine: self.engine.clone(),
            started_unix_ms: self.started_unix_ms,
            finished_unix_ms: self.finished_unix_ms,
            usage: self.usage,
            timings: self.timings,
            finish_reason: self.finish_reason,
            estimated: self.counts != CountSource::Reported,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The variant index postcard writes first, and the minor that brought the variant:
    /// both are the wire contract of `PROTOCOL.md`, and reordering a variant is a major
    /// change that this catches.
    fn wire(message: &impl Serialize) -> u8 {
        postcard::to_allocvec(message).expect("encodes")[0]
    }

    /// Each message's wire index and minor are the expected ones, and no message is
    /// newer than this version.
    fn check<M: Serialize + std::fmt::Debug>(cases: &[(M, u8, u16)], since: fn(&M) -> u16) {
        for (message, index, minor) in cases {
            assert_eq!(
                (wire(message), since(message)),
                (*index, *minor),
                "{message:?}"
            );
            assert!(since(message) <= PROTOCOL_MINOR);
        }
    }

    #[test]
    fn client_messages_keep_their_indices_and_minors() {
        let request = GenerateRequest {
            id: 1,
            model: None,
            input: PromptInput::Raw {
                text: String::new(),
                special: false,
            },
            sampling: SamplingParams::default(),
            max_tokens: None,
            stop: Vec::new(),
            logprobs: None,
        };
        let job = ExternalJob {
            engine: String::new(),
            upstream: String::new(),
            model: String::new(),
            request_id: 0,
            started_unix_ms: 0,
            finished_unix_ms: 0,
            usage: Usage::default(),
            timings: Timings::default(),
            finish_reason: FinishReason::Stop,
            counts: CountSource::Reported,
            decode_clock: DecodeClock::None,
            http_status: 200,
        };
        let cases = [
            (
                ClientMessage::Hello(Hello {
                    major: 1,
                    minor: 2,
                    client: String::new(),
                }),
                0,
                0,
            ),
            (ClientMessage::Generate(request.clone()), 1, 0),
            (ClientMessage::Cancel { id: 1 }, 2, 0),
            (
                ClientMessage::Tokenize {
                    id: 1,
                    text: String::new(),
                    special: false,
                },
                3,
                0,
            ),
            (ClientMessage::Status { id: 1 }, 4, 0),
            (ClientMessage::Jobs { id: 1, limit: 1 }, 5, 0),
            (ClientMessage::Models { id: 1 }, 6, 0),
            (ClientMessage::RecordJob { id: 1, job }, 7, 1),
            (ClientMessage::CacheStatus { id: 1 }, 8, 2),
            (
                ClientMessage::GenerateFormatted {
                    request: request.clone(),
                    format: OutputFormat::JsonObject,
                },
                9,
                3,
            ),
            (
                ClientMessage::GenerateFormatted {
                    request: request.clone(),
                    format: OutputFormat::JsonSchema {
                        schema: "{}".into(),
                    },
                },
                9,
                4,
            ),
            (
                ClientMessage::GenerateWith {
                    request,
                    format: OutputFormat::Text,
                    options: vec![GenerateOption::TemplateVariables("{}".into())],
                },
                10,
                7,
            ),
            (ClientMessage::ChatFormat { id: 1 }, 11, 8),
            (ClientMessage::JobEntries { id: 1, limit: 1 }, 12, 10),
        ];
        check(&cases, ClientMessage::since_minor);
    }

    #[test]
    fn generate_options_keep_their_indices() {
        let encode = |o: &GenerateOption| postcard::to_allocvec(o).unwrap();
        assert_eq!(
            encode(&GenerateOption::TemplateVariables("{}".into())),
            [0, 2, b'{', b'}']
        );
        assert_eq!(encode(&GenerateOption::StreamToolCalls), [1]);
        assert_eq!(GenerateOption::StreamToolCalls.since_minor(), 9);
    }

    #[test]
    fn output_formats_keep_their_indices() {
        let encode = |f: &OutputFormat| postcard::to_allocvec(f).unwrap();
        assert_eq!(encode(&OutputFormat::Text), [0]);
        assert_eq!(encode(&OutputFormat::JsonObject), [1]);
        assert_eq!(
            encode(&OutputFormat::JsonSchema {
                schema: "{}".into()
            }),
            [2, 2, b'{', b'}']
        );
    }

    #[test]
    fn server_messages_keep_their_indices_and_minors() {
        let done = DoneEvent {
            id: 1,
            finish_reason: FinishReason::Stop,
            usage: Usage::default(),
            timings: Timings::default(),
        };
        let model = ModelInfo {
            name: String::new(),
            path: String::new(),
            architecture: String::new(),
            quantization: String::new(),
            parameters: 0,
            context_length: 0,
            file_bytes: 0,
        };
        let status = StatusReport {
            daemon_version: String::new(),
            model: model.clone(),
            backend: String::new(),
            device: String::new(),
            resident_bytes: 0,
            uptime_s: 0.0,
            running: 0,
            queued: 0,
            kv_blocks_used: 0,
            kv_blocks_total: 0,
            kv_block_tokens: 16,
            requests_served: 0,
            tokens_generated: 0,
            prompt_tokens_processed: 0,
        };
        let record = JobRecord {
            job: 1,
            request_id: 1,
            client_pid: None,
            client_uid: None,
            model: String::new(),
            engine: String::new(),
            started_unix_ms: 0,
            finished_unix_ms: 0,
            usage: Usage::default(),
            timings: Timings::default(),
            finish_reason: FinishReason::Stop,
            estimated: false,
        };
        let cases = [
            (
                ServerMessage::Welcome(Welcome {
                    major: 1,
                    minor: 2,
                    daemon_version: String::new(),
                    max_frame_bytes: 1,
                }),
                0,
                0,
            ),
            (
                ServerMessage::Token(TokenEvent {
                    id: 1,
                    token: 1,
                    text: String::new(),
                    logprobs: None,
                }),
                1,
                0,
            ),
            (ServerMessage::Done(done), 2, 0),
            (
                ServerMessage::Error(ErrorEvent {
                    id: None,
                    kind: ErrorKind::Internal,
                    message: String::new(),
                }),
                3,
                0,
            ),
            (
                ServerMessage::Tokens {
                    id: 1,
                    tokens: Vec::new(),
                },
                4,
                0,
            ),
            (ServerMessage::Status { id: 1, status }, 5, 0),
            (
                ServerMessage::Jobs {
                    id: 1,
                    jobs: Vec::new(),
                },
                6,
                0,
            ),
            (
                ServerMessage::Models {
                    id: 1,
                    models: vec![model],
                },
                7,
                0,
            ),
            (ServerMessage::Recorded { id: 1, job: record }, 8, 1),
            (
                ServerMessage::Prefilled(PrefillEvent {
                    id: 1,
                    prompt_tokens: 2,
                    cached_tokens: 1,
                }),
                9,
                2,
            ),
            (
                ServerMessage::CacheStatus {
                    id: 1,
                    cache: CacheReport::default(),
                },
                10,
                2,
            ),
            (
                ServerMessage::ToolCall(ToolCallEvent {
                    id: 1,
                    index: 0,
                    call: ToolCall {
                        id: String::new(),
                        name: String::new(),
                        arguments: String::new(),
                    },
                }),
                11,
                5,
            ),
            (
                ServerMessage::Reasoning(ReasoningEvent {
                    id: 1,
                    text: String::new(),
                }),
                12,
                6,
            ),
            (
                ServerMessage::ChatFormat {
                    id: 1,
                    format: ChatFormatReport::default(),
                },
                13,
                8,
            ),
            (
                ServerMessage::ToolCallDelta(ToolCallDeltaEvent {
                    id: 1,
                    index: 0,
                    opening: None,
                    arguments: String::new(),
                }),
                14,
                9,
            ),
            (
                ServerMessage::JobEntries {
                    id: 1,
                    jobs: Vec::new(),
                },
                15,
                10,
            ),
            (
                ServerMessage::TokenBytes(TokenBytesEvent::default()),
                16,
                11,
            ),
        ];
        check(&cases, ServerMessage::since_minor);
    }

    #[test]
    fn error_kinds_are_frozen() {
        // Connection-level errors must reach peers of any version (PROTOCOL.md).
        let kinds = [
            ErrorKind::BadFrame,
            ErrorKind::FrameTooLarge,
            ErrorKind::Handshake,
            ErrorKind::VersionMismatch,
            ErrorKind::Busy,
            ErrorKind::InvalidRequest,
            ErrorKind::ContextOverflow,
            ErrorKind::UnknownModel,
            ErrorKind::DuplicateId,
            ErrorKind::NotAllowed,
            ErrorKind::Engine,
            ErrorKind::ShuttingDown,
            ErrorKind::Internal,
        ];
        for (index, kind) in kinds.into_iter().enumerate() {
            assert_eq!(usize::from(wire(&kind)), index, "{kind:?}");
        }
    }
}
