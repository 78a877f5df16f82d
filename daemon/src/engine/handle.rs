//! The engine's public face: starts the engine thread and implements [`Engine`] for the
//! server. Requests are validated, templated and tokenized here, on the caller's
//! thread, so that a bad request is refused at once and the engine thread only ever
//! sees work it can run.

use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::mpsc::{channel, Sender};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant, SystemTime};

use spark_client::limits::check_options;
use spark_client::protocol::{
    CacheReport, ChatFormatReport, ErrorEvent, ErrorKind, ExternalJob, FinishReason,
    GenerateOption, GenerateRequest, JobEntry, JobRecord, ModelInfo, OutputFormat, PromptInput,
    StatusReport, TokenPiece,
};

use crate::backend::{Backend, CpuBackend, DeviceReport};
use crate::model::{Model, BLOCK_TOKENS};
use crate::text::constraint::JsonConstraint;
use crate::text::reasoning::{prompt_opens_thinking, ReasoningSplitter, ThinkTags};
use crate::text::schema::Schema;
use crate::text::tools::prompt::TemplateTools;
use crate::text::tools::watch::CallWatcher;
use crate::text::tools::{CallMode, CallSyntax, ToolSet};
use crate::text::{
    sampler, ChatTemplate, PlainMarks, Sampler, StopMatcher, StreamDecoder, TemplateVars,
    TextError, Tokenizer, TokenizerSpec,
};

use super::api::{ClientInfo, ConnId, Engine, Submission};
use super::core::{Command, EngineCore, EngineLimits, EngineParts};
use super::jobs::{unix_ms, Shared};
use super::sequence::{SeqTimings, Sequence};

/// How long a step that carries decodes should take by default: a decoding stream
/// waits at most about this long for its next token while long prompts are absorbed.
pub const DEFAULT_STEP_TARGET_MS: u64 = 100;

#[derive(Debug, Clone)]
pub struct EngineConfig {
    /// The name clients use for the model (`GenerateRequest::model`).
    pub model_name: String,
    pub threads: usize,
    /// KV cache size in tokens, shared by all sequences.
    pub kv_tokens: usize,
    /// Cap on prompt + completion per request; the model's context when larger.
    pub context_limit: Option<usize>,
    pub max_running: usize,
    /// Requests waiting beyond the running ones; past this, `Busy`.
    pub max_queued: usize,
    pub step_tokens: usize,
    /// Requests one client uid may have running or queued; `None`: no per-user cap.
    pub max_per_uid: Option<usize>,
    pub keep_jobs: usize,
    /// Replaces the model's own chat template.
    pub chat_template: Option<String>,
    /// Variables every chat's template sees (`--chat-template-kwargs`); a request's own
    /// override them name by name.
    pub chat_template_vars: TemplateVars,
    /// Reuse the KV blocks of earlier prompts that start the same way.
    pub prefix_cache: bool,
    /// How long a step carrying decodes should take (prompt chunks are sized to it);
    /// `None`: chunks of `step_tokens`.
    pub step_target: Option<Duration>,
}

impl EngineConfig {
    pub fn new(model_name: impl Into<String>) -> Self {
        EngineConfig {
            model_name: model_name.into(),
            threads: crate::backend::cpu::physical_cores(),
            kv_tokens: 16 * 1024,
            context_limit: None,
            max_running: 16,
            max_queued: 64,
            step_tokens: 512,
            max_per_uid: None,
            keep_jobs: 1000,
            chat_template: None,
            chat_template_vars: TemplateVars::default(),
            prefix_cache: true,
            step_target: Some(Duration::from_millis(DEFAULT_STEP_TARGET_MS)),
        }
    }
}

#[derive(Debug, thiserror::Error)]
pub enum EngineError {
    #[error("tokenizer: {0}")]
    Tokenizer(TextError),
    #[error("chat template: {0}")]
    Template(TextError),
    #[error("cannot start the engine thread: {0}")]
    Thread(std::io::Error),
}

/// The admission limits that SIGHUP may change while the engine runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct QueueLimits {
    pub max_queued: usize,
    pub max_per_uid: Option<usize>,
}

pub struct EngineHandle {
    commands: Mutex<Sender<Command>>,
    queue_limits: std::sync::RwLock<QueueLimits>,
    model: Arc<Model>,
    tokenizer: Arc<Tokenizer>,
    template: Option<ChatTemplate>,
    /// The tags the model thinks in, and those of them that are control tokens.
    think: ThinkTags,
    think_controls: Vec<u32>,
    shared: Arc<Shared>,
    config: EngineConfig,
    context: usize,
    /// Positions the whole KV cache holds: no single prompt may need more.
    kv_capacity: usize,
    next_job: AtomicU64,
    in_flight: Arc<AtomicUsize>,
    started: Instant,
    report: Arc<dyn DeviceReport>,
    thread: Mutex<Option<JoinHandle<()>>>,
}

/// A request's prompt, ready for the engine.
pub struct Prompt {
    pub tokens: Vec<u32>,
    /// Rendered from chat messages (not a raw prompt).
    pub chat: bool,
    /// The chat template left the model inside its thinking (see
    /// [`prompt_opens_thinking`]).
    pub opens_thinking: bool,
}

fn invalid(id: u64, kind: ErrorKind, message: impl Into<String>) -> ErrorEvent {
    ErrorEvent {
        id: Some(id),
        kind,
        message: message.into(),
    }
}

/// The template variables a submission's options give (none without the option).
fn request_template_vars(sub: &Submission) -> Result<TemplateVars, ErrorEvent> {
    let refuse = |message: String| invalid(sub.request.id, ErrorKind::InvalidRequest, message);
    // The caps a client checks before sending: each kind once, within its size.
    check_options(&sub.options).map_err(refuse)?;
    let mut vars = TemplateVars::default();
    for option in &sub.options {
        match option {
            GenerateOption::TemplateVariables(json) => {
                vars = TemplateVars::parse(json).map_err(|e| refuse(e.to_string()))?;
            }
            GenerateOption::StreamToolCalls => {}
        }
    }
    Ok(vars)
}

impl EngineHandle {
    /// Starts the engine on the CPU backend.
    pub fn start(model: Model, config: EngineConfig) -> Result<Arc<Self>, EngineError> {
        let model = Arc::new(model);
        let backend = CpuBackend::new(
            model.clone(),
            config.kv_tokens.max(BLOCK_TOKENS),
            config.threads,
        );
        Self::start_with_backend(model, Box::new(backend), config)
    }

    /// Starts the engine on `backend`, which must have been built for `model`; its KV
    /// cache size is the backend's, `config.kv_tokens` and `config.threads` are not used.
    pub fn start_with_backend(
        model: Arc<Model>,
        backend: Box<dyn Backend>,
        config: EngineConfig,
    ) -> Result<Arc<Self>, EngineError> {
        let spec =
            TokenizerSpec::from_gguf(model.file.metadata()).map_err(EngineError::Tokenizer)?;
        let tokenizer = Arc::new(Tokenizer::new(spec).map_err(EngineError::Tokenizer)?);
        let template = match &config.chat_template {
            Some(src) => Some(ChatTemplate::new(src).map_err(EngineError::Template)?),
            None => {
                ChatTemplate::from_gguf(model.file.metadata()).map_err(EngineError::Template)?
            }
        };
        let think = ThinkTags::of_vocabulary(&tokenizer);
        let think_controls = think.control_ids(&tokenizer);
        let context = config
            .context_limit
            .map_or(model.config.context_length, |c| {
                c.min(model.config.context_length)
            });
        let shared = Arc::new(Shared::new(config.model_name.clone(), config.keep_jobs));
        let kv_capacity = backend.kv_total_blocks() * BLOCK_TOKENS;
        let threads = backend.threads();
        let report = backend.report();
        let (tx, rx) = channel();
        let in_flight = Arc::new(AtomicUsize::new(0));
        let parts = EngineParts {
            model: model.clone(),
            tokenizer: tokenizer.clone(),
            backend,
            limits: EngineLimits {
                max_running: config.max_running.max(1),
                step_tokens: config.step_tokens.max(1),
                prefix_cache: config.prefix_cache,
                step_target: config.step_target,
            },
        };
        let core = EngineCore::new(parts, rx, shared.clone(), in_flight.clone());
        let thread = std::thread::Builder::new()
            .name("sparkd-engine".into())
            .spawn(move || core.run())
            .map_err(EngineError::Thread)?;
        tracing::info!(
            model = %config.model_name,
            backend = report.backend(),
            threads,
            kv_tokens = kv_capacity,
            prefix_cache = config.prefix_cache,
            context,
            "engine started"
        );
        match &template {
            Some(t) if !t.system_role() => tracing::info!(
                tools = ?t.tools(),
                "the chat template has no system role: system messages go in front of the next user message"
            ),
            Some(t) => tracing::info!(tools = ?t.tools(), "chat template"),
            None => {
                tracing::info!("no chat template: chat requests are refused, raw prompts served")
            }
        }
        Ok(Arc::new(EngineHandle {
            commands: Mutex::new(tx),
            queue_limits: std::sync::RwLock::new(QueueLimits {
                max_queued: config.max_queued,
                max_per_uid: config.max_per_uid,
            }),
            model,
            think,
            think_controls,
            tokenizer,
            template,
            shared,
            config,
            context,
            kv_capacity,
            next_job: AtomicU64::new(1),
            in_flight,
            started: Instant::now(),
            report,
            thread: Mutex::new(Some(thread)),
        }))
    }

    pub fn model(&self) -> &Model {
        &self.model
    }

    pub fn tokenizer(&self) -> &Tokenizer {
        &self.tokenizer
    }

    pub fn shared(&self) -> &Shared {
        &self.shared
    }

    pub fn queue_limits(&self) -> QueueLimits {
        *self.queue_limits.read().unwrap_or_else(|e| e.into_inner())
    }

    /// New admission limits (SIGHUP); requests already admitted are not touched.
    pub fn set_queue_limits(&self, limits: QueueLimits) {
        *self.queue_limits.write().unwrap_or_else(|e| e.into_inner()) = limits;
    }

    fn send(&self, cmd: Command) -> bool {
        self.commands
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .send(cmd)
            .is_ok()
    }

    /// Stops admitting work; running generations may finish until `grace` has passed,
    /// then every open stream gets `Done` with `FinishReason::Shutdown`.
    pub fn shutdown(&self, grace: Duration) {
        self.send(Command::Shutdown {
            deadline: Instant::now() + grace,
        });
    }

    /// Waits for the engine thread to end (after `shutdown`).
    pub fn join(&self) {
        let handle = self.thread.lock().unwrap_or_else(|e| e.into_inner()).take();
        if let Some(h) = handle {
            let _ = h.join();
        }
    }

    /// Turns a request into prompt tokens, or says exactly what is wrong with it. With
    /// `tools` forcing a call, the prompt ends with the call's opening tag.
    /// `request_vars` are the request's own template variables, over the daemon's.
    pub fn prompt_tokens(
        &self,
        req: &GenerateRequest,
        tools: Option<&ToolSet>,
        request_vars: &TemplateVars,
    ) -> Result<Prompt, ErrorEvent> {
        let id = req.id;
        let template = || {
            self.template.as_ref().ok_or_else(|| {
                invalid(
                    id,
                    ErrorKind::InvalidRequest,
                    "this model has no chat template; send a raw prompt or start sparkd with --chat-template",
                )
            })
        };
        let template_error =
            |e: TextError| invalid(id, ErrorKind::InvalidRequest, format!("chat template: {e}"));
        let vars = self.config.chat_template_vars.overridden_by(request_vars);
        let no_messages = || {
            invalid(
                id,
                ErrorKind::InvalidRequest,
                "messages: at least one message is required",
            )
        };
        match &req.input {
            PromptInput::Chat { messages } => {
                if messages.is_empty() {
                    return Err(no_messages());
                }
                let marks = PlainMarks::new();
                let messages = marks.guard_chat(messages, &self.tokenizer);
                let text = template()?
                    .render_prompt(&messages, &vars, &self.tokenizer)
                    .map_err(template_error)?;
                Ok(self.chat_prompt(&text, &marks))
            }
            PromptInput::ChatWithTools {
                messages,
                tools: specs,
                ..
            } => {
                if messages.is_empty() {
                    return Err(no_messages());
                }
                let marks = PlainMarks::new();
                let messages = marks.guard_tool_chat(messages, &self.tokenizer);
                let mut text = template()?
                    .render_tool_prompt(&messages, specs, tools.is_some(), &vars, &self.tokenizer)
                    .map_err(template_error)?;
                // The Llama syntax has no tag: the answer is the call.
                if let Some(prefix) = tools
                    .filter(|t| t.mode == CallMode::Forced)
                    .and_then(|t| t.syntax.forced_prefix())
                {
                    text.push_str(&prefix);
                }
                Ok(self.chat_prompt(&text, &marks))
            }
            PromptInput::Raw { .. } if !request_vars.is_empty() => Err(invalid(
                id,
                ErrorKind::InvalidRequest,
                "chat_template_kwargs: a raw prompt is used as it is, no chat template renders it",
            )),
            PromptInput::Raw { text, special } => Ok(Prompt {
                tokens: self.tokenizer.encode(text, true, *special),
                chat: false,
                opens_thinking: false,
            }),
        }
    }

    /// A rendered chat's tokens: the template's control-token text parsed, the
    /// messages' left as text (see `PlainMarks`).
    fn chat_prompt(&self, rendered: &str, marks: &PlainMarks) -> Prompt {
        let (text, plain) = marks.take(rendered);
        Prompt {
            tokens: self.tokenizer.encode_with_plain(&text, true, &plain),
            chat: true,
            opens_thinking: prompt_opens_thinking(&text, self.think),
        }
    }

    fn build_sequence(&self, sub: Submission) -> Result<Box<Sequence>, ErrorEvent> {
        let req = &sub.request;
        let id = req.id;
        if let Some(name) = &req.model {
            if !self.answers_to(name) {
                return Err(invalid(
                    id,
                    ErrorKind::UnknownModel,
                    format!(
                        "model `{name}` is not loaded (this daemon serves `{}`)",
                        self.config.model_name
                    ),
                ));
            }
        }
        if req.max_tokens == Some(0) {
            return Err(invalid(
                id,
                ErrorKind::InvalidRequest,
                "max_tokens must be at least 1",
            ));
        }
        if let Some(n) = req.logprobs {
            if n > 20 {
                return Err(invalid(
                    id,
                    ErrorKind::InvalidRequest,
                    format!("logprobs: {n} alternatives asked, at most 20"),
                ));
            }
        }
        if req.stop.iter().any(|s| s.is_empty()) {
            return Err(invalid(
                id,
                ErrorKind::InvalidRequest,
                "stop: stop strings must not be empty",
            ));
        }
        sampler::validate(&req.sampling, self.tokenizer.vocab_size())
            .map_err(|e| invalid(id, ErrorKind::InvalidRequest, e.to_string()))?;
        // The schema is checked before the prompt is tokenized: the cheaper refusal.
        let json = match &sub.format {
            OutputFormat::Text => None,
            OutputFormat::JsonObject => Some(JsonConstraint::new()),
            OutputFormat::JsonSchema { schema } => {
                let schema = Schema::compile(schema)
                    .map_err(|e| invalid(id, ErrorKind::InvalidRequest, e.to_string()))?;
                Some(JsonConstraint::with_schema(Arc::new(schema)))
            }
        };
        let tools = match &req.input {
            PromptInput::ChatWithTools {
                tools,
                choice,
                parallel,
                ..
            } => {
                if sub.format != OutputFormat::Text {
                    return Err(invalid(
                        id,
                        ErrorKind::InvalidRequest,
                        "tools cannot be combined with JSON output",
                    ));
                }
                let syntax = self
                    .template
                    .as_ref()
                    .map_or(CallSyntax::Hermes, |t| t.tools().syntax());
                ToolSet::prepare(tools, choice, *parallel, syntax)
                    .map_err(|e| invalid(id, ErrorKind::InvalidRequest, e.to_string()))?
            }
            _ => None,
        };
        let prompt = self.prompt_tokens(req, tools.as_ref(), &request_template_vars(&sub)?)?;
        // A thinking model's reasoning is split from a chat's free answer: not from
        // JSON output or a forced call, which are held to their syntax from the start.
        let reasoning = (sub.split_reasoning
            && prompt.chat
            && json.is_none()
            && tools.as_ref().is_none_or(|t| t.mode == CallMode::Auto))
        .then(|| ReasoningSplitter::new(prompt.opens_thinking, self.think));
        let opens_thinking = prompt.opens_thinking;
        let tokens = prompt.tokens;
        if tokens.is_empty() {
            return Err(invalid(
                id,
                ErrorKind::InvalidRequest,
                "the prompt is empty",
            ));
        }
        let n_prompt = tokens.len();
        let room = self.context.saturating_sub(n_prompt);
        let max_tokens = match req.max_tokens {
            Some(m) if n_prompt + m as usize > self.context => {
                return Err(invalid(
                    id,
                    ErrorKind::ContextOverflow,
                    format!(
                        "prompt of {n_prompt} tokens plus max_tokens {m} exceeds the context of {} tokens",
                        self.context
                    ),
                ))
            }
            Some(m) => m as usize,
            None if room == 0 => {
                return Err(invalid(
                    id,
                    ErrorKind::ContextOverflow,
                    format!("prompt of {n_prompt} tokens fills the context of {} tokens", self.context),
                ))
            }
            None => room,
        };
        let kv_capacity = self.kv_capacity;
        if n_prompt + 1 > kv_capacity {
            return Err(invalid(
                id,
                ErrorKind::ContextOverflow,
                format!(
                    "prompt of {n_prompt} tokens does not fit the KV cache of {kv_capacity} tokens"
                ),
            ));
        }
        let mut sampling = req.sampling.clone();
        if sampling.seed.is_none() {
            sampling.seed = Some(rand::random());
        }
        let sampler = Sampler::new(&sampling, self.tokenizer.vocab_size())
            .map_err(|e| invalid(id, ErrorKind::InvalidRequest, e.to_string()))?;
        Ok(Box::new(Sequence {
            job: self.next_job.fetch_add(1, Ordering::Relaxed),
            conn: sub.conn,
            request_id: id,
            client: sub.client,
            tokens,
            n_prompt,
            n_cached: 0,
            n_reused: 0,
            max_tokens,
            table: Default::default(),
            sampler,
            decoder: StreamDecoder::skipping_control_but(self.think_controls.clone()),
            stop: StopMatcher::new(&req.stop),
            json,
            tools: tools.map(|t| {
                let watcher = CallWatcher::new(t, opens_thinking, self.think);
                if sub.options.contains(&GenerateOption::StreamToolCalls) {
                    watcher.streaming()
                } else {
                    watcher
                }
            }),
            reasoning,
            logprobs: req.logprobs,
            token_bytes: sub.token_bytes,
            events: sub.events,
            timings: SeqTimings {
                arrived: Some(sub.arrived),
                ..Default::default()
            },
            started_unix_ms: unix_ms(SystemTime::now()),
            finish: None,
        }))
    }

    /// Whether a request's `model` names the loaded one: its name, its file's stem, or
    /// its file by any path (`spark` sends a file's absolute path; the daemon may have
    /// been given a relative one).
    fn answers_to(&self, name: &str) -> bool {
        spark_client::models::names_model(name, &self.config.model_name, &self.model.path)
    }

    pub fn model_info(&self) -> ModelInfo {
        let m = &self.model;
        ModelInfo {
            name: self.config.model_name.clone(),
            path: m.path.display().to_string(),
            architecture: m.config.arch.name().into(),
            quantization: m.quantization(),
            parameters: m.parameter_count(),
            context_length: self.context as u32,
            file_bytes: m.file.file_len(),
        }
    }
}

impl Engine for EngineHandle {
    fn submit(&self, sub: Submission) -> Result<(), ErrorEvent> {
        let id = sub.request.id;
        let uid = sub.client.uid;
        let limits = self.queue_limits();
        let limit = self.config.max_running + limits.max_queued;
        // Count first so that concurrent submissions cannot all slip under the limit.
        if self.in_flight.fetch_add(1, Ordering::AcqRel) >= limit {
            self.in_flight.fetch_sub(1, Ordering::AcqRel);
            return Err(invalid(
                id,
                ErrorKind::Busy,
                format!("{limit} requests running or queued, the most it takes"),
            ));
        }
        if let Some(uid) = uid {
            if let Err(n) = self.shared.take_uid_slot(uid, limits.max_per_uid) {
                self.in_flight.fetch_sub(1, Ordering::AcqRel);
                return Err(invalid(
                    id,
                    ErrorKind::Busy,
                    format!(
                        "uid {uid} already has {n} requests running or queued (the per-user limit)"
                    ),
                ));
            }
        }
        let release = || {
            self.in_flight.fetch_sub(1, Ordering::AcqRel);
            if let Some(uid) = uid {
                self.shared.release_uid_slot(uid);
            }
        };
        let seq = match self.build_sequence(sub) {
            Ok(s) => s,
            Err(e) => {
                release();
                return Err(e);
            }
        };
        if !self.send(Command::Submit(seq)) {
            release();
            return Err(invalid(
                id,
                ErrorKind::ShuttingDown,
                "the engine has stopped",
            ));
        }
        Ok(())
    }

    fn cancel(&self, conn: ConnId, request_id: u64, reason: FinishReason) {
        self.send(Command::Cancel {
            conn,
            request_id,
            reason,
        });
    }

    fn cancel_connection(&self, conn: ConnId) {
        self.send(Command::CancelConnection(conn));
    }

    fn tokenize(&self, text: &str, special: bool) -> Result<Vec<TokenPiece>, ErrorEvent> {
        Ok(self
            .tokenizer
            .encode(text, false, special)
            .into_iter()
            .map(|id| TokenPiece {
                id,
                piece: self.tokenizer.piece(id),
            })
            .collect())
    }

    fn status(&self) -> StatusReport {
        let load = self.shared.load();
        StatusReport {
            daemon_version: env!("CARGO_PKG_VERSION").into(),
            model: self.model_info(),
            backend: self.report.backend().into(),
            device: self.report.device(),
            resident_bytes: resident_bytes(),
            uptime_s: self.started.elapsed().as_secs_f64(),
            running: load.running as u32,
            queued: load.queued as u32,
            kv_blocks_used: load.kv_used as u32,
            kv_blocks_total: load.kv_total as u32,
            kv_block_tokens: BLOCK_TOKENS as u32,
            requests_served: load.requests_served,
            tokens_generated: load.tokens_generated,
            prompt_tokens_processed: load.prompt_tokens,
        }
    }

    fn chat_format(&self) -> ChatFormatReport {
        let template = self.template.as_ref();
        ChatFormatReport {
            template: template.is_some(),
            tools: template
                .map_or(TemplateTools::Described, ChatTemplate::tools)
                .name()
                .into(),
            system_role: template.is_none_or(ChatTemplate::system_role),
            think_open: self.think.open.into(),
            think_close: self.think.close.into(),
            variables: template.map_or_else(Vec::new, |t| t.variables().to_vec()),
        }
    }

    fn cache_status(&self) -> CacheReport {
        let load = self.shared.load();
        CacheReport {
            enabled: self.config.prefix_cache,
            cached_blocks: load.cache.cached_blocks as u32,
            idle_blocks: load.cache.idle_blocks as u32,
            evicted_blocks: load.cache.evicted_blocks,
            prompt_tokens_reused: load.prompt_tokens_reused,
        }
    }

    fn jobs(&self, limit: usize) -> Vec<JobEntry> {
        self.shared.recent_jobs(limit)
    }

    fn models(&self) -> Vec<ModelInfo> {
        vec![self.model_info()]
    }

    fn record_external(&self, mut job: ExternalJob, client: ClientInfo) -> JobRecord {
        // The ring keeps up to `keep_jobs` records: a client must not make it hold
        // megabytes of names.
        for name in [&mut job.engine, &mut job.model] {
            truncate_name(name);
        }
        let number = self.next_job.fetch_add(1, Ordering::Relaxed);
        let record = job.to_record(number, client.pid, client.uid);
        self.shared.record_external(record.clone());
        record
    }
}

/// Longest engine or model name a forwarded job keeps, in bytes.
const MAX_EXTERNAL_NAME: usize = 256;

/// Cuts `name` to `MAX_EXTERNAL_NAME` bytes at a character boundary.
fn truncate_name(name: &mut String) {
    if name.len() > MAX_EXTERNAL_NAME {
        let cut = (0..=MAX_EXTERNAL_NAME)
            .rev()
            .find(|&i| name.is_char_boundary(i))
            .unwrap_or(0);
        name.truncate(cut);
    }
}

/// This process's resident memory (mapped model pages that were touched included).
pub fn resident_bytes() -> u64 {
    use sysinfo::{Pid, ProcessRefreshKind, ProcessesToUpdate, System};
    let pid = Pid::from_u32(std::process::id());
    let mut sys = System::new();
    sys.refresh_processes_specifics(
        ProcessesToUpdate::Some(&[pid]),
        true,
        ProcessRefreshKind::nothing().with_memory(),
    );
    sys.process(pid).map_or(0, |p| p.memory())
}

#[cfg(test)]
mod tests {
    use super::{truncate_name, MAX_EXTERNAL_NAME};

    #[test]
    fn external_names_are_cut_at_a_character_boundary() {
        let mut short = "llama3.2:latest".to_string();
        truncate_name(&mut short);
        assert_eq!(short, "llama3.2:latest");
        // 'é' is two bytes: the limit falls inside one.
        let mut long = format!("a{}", "é".repeat(MAX_EXTERNAL_NAME));
        truncate_name(&mut long);
        assert!(long.len() <= MAX_EXTERNAL_NAME && long.len() >= MAX_EXTERNAL_NAME - 1);
        assert!(long.starts_with("aé"));
    }
}
