//! The engine loop: runs on its own thread, owns the compute backend (with its KV cache
//! and buffers) and every sequence, and turns commands into batched forward steps. It
//! does not know which backend runs: the CPU and CUDA ones share [`Backend`].

use std::collections::VecDeque;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::mpsc::{Receiver, RecvTimeoutError};
use std::sync::Arc;
use std::time::{Duration, Instant};

use spark_client::protocol::{
    ErrorKind, FinishReason, ServerMessage, TokenBytesEvent, TokenEvent, TokenLogprobs,
};

use crate::backend::Backend;
use crate::model::{Model, SeqInput, BLOCK_TOKENS};
use crate::text::constraint::JsonFilter;
use crate::text::sampler::TokenFilter;
use crate::text::tools::header::HeaderFilter;
use crate::text::tools::watch::CallConstraint;
use crate::text::tools::CallSyntax;
use crate::text::StreamDecoder;
use crate::text::Tokenizer;

use super::jobs::{CacheLoad, Shared};
use super::scheduler::{plan_step, Pending, StepPacer};
use super::sequence::{active_constraint, Sequence};
use super::ConnId;

/// Test hook: `SPARKD_FAULT_FAIL_STEP=<n>` makes the engine's n-th forward step (counting
/// from 1) fail as if the backend had, so that tests can check what clients see when the
/// engine fails. Read once when the engine starts; unset, it costs one comparison a step.
pub const FAULT_FAIL_STEP_ENV: &str = "SPARKD_FAULT_FAIL_STEP";

/// Test hook: `SPARKD_FAULT_STEP_DELAY_MS=<ms>` makes every forward step take that much
/// longer, as a slow backend would, so that tests of what happens while a request is
/// still generating (a disconnect, a full queue) do not race a tiny model that finishes
/// hundreds of tokens in a few milliseconds. Read once when the engine starts.
pub const FAULT_STEP_DELAY_ENV: &str = "SPARKD_FAULT_STEP_DELAY_MS";

/// How often an idle engine loop still goes round, so that the systemd watchdog (which
/// checks the loop's heartbeat) sees it alive; cheap at 10 wake-ups a second.
const IDLE_HEARTBEAT: Duration = Duration::from_millis(100);

pub enum Command {
    Submit(Box<Sequence>),
    Cancel {
        conn: ConnId,
        request_id: u64,
        reason: FinishReason,
    },
    CancelConnection(ConnId),
    /// Stop admitting; running sequences may finish until `deadline`, then all end.
    Shutdown {
        deadline: Instant,
    },
}

#[derive(Debug, Clone)]
pub struct EngineLimits {
    pub max_running: usize,
    /// Tokens per forward step across the batch (decodes + prompt chunks).
    pub step_tokens: usize,
    /// Reuse the KV blocks of earlier prompts that start the same way.
    pub prefix_cache: bool,
    /// How long a step carrying decodes should take: prompt chunks are sized to it.
    /// `None`: every step takes `step_tokens`.
    pub step_target: Option<Duration>,
}

pub struct EngineCore {
    model: Arc<Model>,
    tokenizer: Arc<Tokenizer>,
    backend: Box<dyn Backend>,
    limits: EngineLimits,
    waiting: VecDeque<Sequence>,
    running: Vec<Sequence>,
    commands: Receiver<Command>,
    shared: Arc<Shared>,
    shutdown: Option<Instant>,
    /// Requests accepted by the handle and not yet retired (the handle's busy check).
    in_flight: Arc<AtomicUsize>,
    fault: FaultHook,
    pacer: StepPacer,
}

/// The state of the `SPARKD_FAULT_*` test hooks.
#[derive(Debug, Default)]
struct FaultHook {
    fail_step: Option<u64>,
    steps: u64,
    step_delay: Option<Duration>,
}

impl FaultHook {
    fn from_env() -> Self {
        let fail_step = std::env::var(FAULT_FAIL_STEP_ENV)
            .ok()
            .and_then(|v| v.trim().parse::<u64>().ok());
        if let Some(n) = fail_step {
            tracing::warn!(
                step = n,
                "test hook {FAULT_FAIL_STEP_ENV} set: forward step {n} will fail"
            );
        }
        let step_delay = std::env::var(FAULT_STEP_DELAY_ENV)
            .ok()
            .and_then(|v| v.trim().parse::<u64>().ok())
            .map(Duration::from_millis);
        if let Some(d) = step_delay {
            tracing::warn!(
                ms = d.as_millis() as u64,
                "test hook {FAULT_STEP_DELAY_ENV} set: every forward step is slowed down"
            );
        }
        Self {
            fail_step,
            steps: 0,
            step_delay,
        }
    }

    /// Counts a forward step, after any delay the hook adds; true for the one that is
    /// to fail.
    fn step_fails(&mut self) -> bool {
        if let Some(d) = self.step_delay {
            std::thread::sleep(d);
        }
        self.steps += 1;
        self.fail_step == Some(self.steps)
    }
}

/// Everything the engine thread owns besides its queues.
pub struct EngineParts {
    pub model: Arc<Model>,
    pub tokenizer: Arc<Tokenizer>,
    pub backend: Box<dyn Backend>,
    pub limits: EngineLimits,
}

impl EngineCore {
    pub fn new(
        parts: EngineParts,
        commands: Receiver<Command>,
        shared: Arc<Shared>,
        in_flight: Arc<AtomicUsize>,
    ) -> Self {
        let EngineParts {
            model,
            tokenizer,
            backend,
            limits,
        } = parts;
        EngineCore {
            model,
            tokenizer,
            backend,
            waiting: VecDeque::new(),
            running: Vec::new(),
            commands,
            shared,
            shutdown: None,
            in_flight,
            fault: FaultHook::from_env(),
            pacer: StepPacer::new(limits.step_target),
            limits,
        }
    }

    /// Runs until shut down and every sequence has ended (or all handles are gone).
    pub fn run(mut self) {
        loop {
            if !self.take_commands() {
                break;
            }
            if let Some(deadline) = self.shutdown {
                for s in self.waiting.iter_mut() {
                    s.finish = Some(FinishReason::Shutdown);
                }
                if Instant::now() >= deadline {
                    for s in self.running.iter_mut() {
                        s.finish.get_or_insert(FinishReason::Shutdown);
                    }
                }
            }
            self.retire_finished();
            if self.shutdown.is_some() && self.running.is_empty() && self.waiting.is_empty() {
                break;
            }
            self.admit();
            // Published before the step, so anyone who has seen a token of a sequence
            // also sees it counted as running.
            self.publish();
            if !self.running.is_empty() {
                self.step();
                self.retire_finished();
            }
            self.publish();
        }
        self.publish();
    }

    /// Applies pending commands; blocks while there is nothing to do. Returns false when
    /// every handle is gone and no work is left.
    fn take_commands(&mut self) -> bool {
        let idle = self.running.is_empty() && self.waiting.is_empty();
        if idle && self.shutdown.is_none() {
            // Wake up now and then so the watchdog sees a live loop while idle.
            match self.commands.recv_timeout(IDLE_HEARTBEAT) {
                Ok(cmd) => self.apply(cmd),
                Err(RecvTimeoutError::Timeout) => {}
                Err(RecvTimeoutError::Disconnected) => return false,
            }
        }
        while let Ok(cmd) = self.commands.try_recv() {
            self.apply(cmd);
        }
        true
    }

    fn apply(&mut self, cmd: Command) {
        match cmd {
            Command::Submit(mut seq) => {
                if self.shutdown.is_some() {
                    seq.finish = Some(FinishReason::Shutdown);
                }
                self.waiting.push_back(*seq);
            }
            Command::Cancel {
                conn,
                request_id,
                reason,
            } => {
                for s in self.running.iter_mut().chain(self.waiting.iter_mut()) {
                    if s.conn == conn && s.request_id == request_id {
                        s.finish.get_or_insert(reason);
                    }
                }
            }
            Command::CancelConnection(conn) => {
                for s in self.running.iter_mut().chain(self.waiting.iter_mut()) {
                    if s.conn == conn {
                        s.finish.get_or_insert(FinishReason::Disconnected);
                    }
                }
            }
            Command::Shutdown { deadline } => {
                tracing::debug!(
                    running = self.running.len(),
                    queued = self.waiting.len(),
                    "engine shutting down"
                );
                self.shutdown = Some(deadline);
            }
        }
    }

    /// Moves waiting sequences into the batch while there is room for their prompts.
    fn admit(&mut self) {
        while self.running.len() < self.limits.max_running {
            let Some(seq) = self.waiting.front_mut() else {
                break;
            };
            if self.limits.prefix_cache {
                // The last token is always computed: its logits pick the next one.
                let reusable = &seq.tokens[..seq.tokens.len().saturating_sub(1)];
                seq.n_cached = self
                    .backend
                    .blocks_mut()
                    .reuse_prefix(&mut seq.table, reusable);
                if prefix_in_progress(&self.running, reusable, seq.n_cached) {
                    self.backend.release(&mut seq.table);
                    seq.n_cached = 0;
                    break;
                }
            }
            // The whole prompt's blocks up front, so an admitted prompt never stalls
            // half-way for lack of memory.
            if self
                .backend
                .reserve(&mut seq.table, seq.tokens.len())
                .is_err()
            {
                self.backend.release(&mut seq.table);
                seq.n_cached = 0;
                break;
            }
            let Some(mut seq) = self.waiting.pop_front() else {
                break;
            };
            seq.n_reused = seq.n_cached.min(seq.n_prompt);
            seq.timings.admitted.get_or_insert_with(Instant::now);
            self.running.push(seq);
        }
    }

    fn step(&mut self) {
        let pending: Vec<Pending> = self
            .running
            .iter()
            .map(|s| Pending {
                tokens: s.tokens.len() - s.n_cached,
            })
            .collect();
        let decoding = pending.iter().filter(|p| p.tokens == 1).count();
        let budget = self.pacer.budget(self.limits.step_tokens, decoding);
        let mut take = plan_step(&pending, budget);
        self.reserve_or_preempt(&mut take);
        if take.iter().all(|&t| t == 0) {
            return;
        }
        let step_tokens: usize = take.iter().sum();
        // `take` follows `running` (preemption removed the same entries from both).
        let prompt_tokens: usize = self
            .running
            .iter()
            .zip(&take)
            .filter(|(s, _)| s.tokens.len() - s.n_cached > 1)
            .map(|(_, &n)| n)
            .sum();

        let batch: Vec<SeqInput<'_>> = self
            .running
            .iter()
            .zip(&take)
            .filter(|(_, &n)| n > 0)
            .map(|(s, &n)| SeqInput {
                table: &s.table,
                tokens: &s.tokens[s.n_cached..s.n_cached + n],
                start_pos: s.n_cached,
                want_logits: s.n_cached + n == s.tokens.len(),
                greedy: s.argmax_bias(),
            })
            .collect();
        let mut result = self.backend.forward(&batch).map_err(|e| e.to_string());
        drop(batch);
        if self.fault.step_fails() {
            result = Err(format!("injected failure ({FAULT_FAIL_STEP_ENV})"));
        }
        let elapsed = match result {
            Ok(d) => d,
            Err(e) => {
                tracing::error!(error = %e, sequences = take.iter().filter(|&&n| n > 0).count(), "forward step failed");
                for (s, &n) in self.running.iter_mut().zip(&take) {
                    if n > 0 {
                        s.send_error(ErrorKind::Engine, format!("engine step failed: {e}"));
                        s.finish.get_or_insert(FinishReason::Error);
                    }
                }
                return;
            }
        };
        self.shared.record_step(elapsed);
        self.pacer.record(step_tokens, prompt_tokens, elapsed);

        // The sequences that pick a token now, by index in `running`, and their rows.
        let mut picking: Vec<(usize, usize)> = Vec::new();
        let mut logit_row = 0;
        for (i, (s, &n)) in self.running.iter_mut().zip(&take).enumerate() {
            if n == 0 {
                continue;
            }
            let was_prefill = s.in_prefill();
            s.n_cached += n;
            if self.limits.prefix_cache {
                self.backend
                    .blocks_mut()
                    .publish_prefix(&mut s.table, &s.tokens[..s.n_cached]);
            }
            if was_prefill {
                s.timings.prefill += elapsed;
            } else {
                s.timings.decode += elapsed;
            }
            if s.n_cached < s.tokens.len() {
                continue;
            }
            if s.finish.is_none() {
                picking.push((i, logit_row));
            }
            logit_row += 1;
        }
        let chosen = choose_tokens(
            &mut self.running,
            self.backend.as_mut(),
            &self.tokenizer,
            &picking,
            logit_row,
            self.model.config.vocab_size,
        );
        let ctx = self.model.config.context_length;
        for (&(i, _), choice) in picking.iter().zip(chosen) {
            let s = &mut self.running[i];
            match choice {
                Some((token, lp)) => emit(s, token, lp, &self.tokenizer, ctx),
                // Its output format allowed no token: already reported by `sample`.
                None if s.finish.is_some() => {}
                // The backend handed over fewer rows than the step asked for: a bug,
                // reported on the request rather than answered with a made-up token.
                None => {
                    tracing::error!(job = s.job, "no logits for a sequence that wanted them");
                    s.send_error(ErrorKind::Engine, "engine step produced no logits".into());
                    s.finish.get_or_insert(FinishReason::Error);
                }
            }
        }
    }

    /// Makes sure every planned sequence has KV blocks for its new tokens. When the pool
    /// runs dry, the most recently admitted other sequence is preempted: its blocks are
    /// freed and it goes back to the front of the queue to be recomputed later.
    fn reserve_or_preempt(&mut self, take: &mut [usize]) {
        let mut i = 0;
        while i < self.running.len() {
            if take[i] == 0 {
                i += 1;
                continue;
            }
            let need = self.running[i].n_cached + take[i];
            if self
                .backend
                .reserve(&mut self.running[i].table, need)
                .is_ok()
            {
                i += 1;
                continue;
            }
            // Preempt the newest sequence that is not `i` itself.
            let victim = (0..self.running.len())
                .rev()
                .find(|&j| j != i && self.running[j].table.capacity() > 0);
            match victim {
                Some(j) => {
                    let mut v = self.running.remove(j);
                    self.backend.release(&mut v.table);
                    v.n_cached = 0;
                    tracing::debug!(
                        job = v.job,
                        "KV cache full: sequence preempted for recompute"
                    );
                    self.waiting.push_front(v);
                    // `take` follows `running`; drop the victim's entry too.
                    for k in j..take.len() - 1 {
                        take[k] = take[k + 1];
                    }
                    if let Some(last) = take.last_mut() {
                        *last = 0;
                    }
                    if j < i {
                        i -= 1;
                    }
                }
                None => {
                    let s = &mut self.running[i];
                    s.send_error(ErrorKind::Engine, "KV cache exhausted".into());
                    s.finish.get_or_insert(FinishReason::Length);
                    take[i] = 0;
                    i += 1;
                }
            }
        }
    }

    /// Sends `Done` for every ended sequence, frees its blocks and books the job.
    fn retire_finished(&mut self) {
        let mut k = 0;
        while k < self.running.len() {
            if self.running[k].finish.is_some() {
                let s = self.running.swap_remove(k);
                self.retire(s);
            } else {
                k += 1;
            }
        }
        let mut k = 0;
        while k < self.waiting.len() {
            if self.waiting[k].finish.is_some() {
                if let Some(s) = self.waiting.remove(k) {
                    self.retire(s);
                }
            } else {
                k += 1;
            }
        }
    }

    fn retire(&mut self, mut s: Sequence) {
        self.backend.release(&mut s.table);
        let reason = s.finish.unwrap_or(FinishReason::Error);
        let done = s.done_event(reason);
        self.shared.record_job(&s, &done, self.model_name());
        tracing::debug!(
            job = s.job,
            reason = reason.as_str(),
            prompt_tokens = done.usage.prompt_tokens,
            reused_prompt_tokens = s.n_reused,
            completion_tokens = done.usage.completion_tokens,
            "sequence finished"
        );
        let _ = s.events.send(ServerMessage::Done(done));
        self.in_flight.fetch_sub(1, Ordering::AcqRel);
        if let Some(uid) = s.client.uid {
            self.shared.release_uid_slot(uid);
        }
    }

    fn model_name(&self) -> &str {
        self.shared.model_name()
    }

    fn publish(&self) {
        let blocks = self.backend.blocks();
        let cache = CacheLoad {
            cached_blocks: blocks.cached_blocks(),
            idle_blocks: blocks.idle_blocks(),
            evicted_blocks: blocks.evicted_blocks(),
        };
        self.shared.set_load(
            self.running.len(),
            self.waiting.len(),
            self.backend.kv_used_blocks(),
            self.backend.kv_total_blocks(),
            cache,
        );
    }
}

/// True when a running prompt is still computing whole blocks that a prompt starting
/// with `reusable` (of which `reused` positions came from the cache) could take once
/// they are done. Such a prompt waits for them rather than computing them a second
/// time beside them: requests sent together with one long system prompt compute it
/// once. The wait ends within that prompt's prefill, or when it leaves the batch.
fn prefix_in_progress(running: &[Sequence], reusable: &[u32], reused: usize) -> bool {
    running.iter().any(|r| {
        let common = r.tokens[..r.n_prompt]
            .iter()
            .zip(reusable)
            .take_while(|(a, b)| a == b)
            .count();
        let shareable = common / BLOCK_TOKENS * BLOCK_TOKENS;
        shareable > reused && r.n_cached < shareable
    })
}

/// One sequence's next token (and its logprobs, when asked for) from its logit row.
/// `None` when its output format allows no token here: the sequence ends with an error.
fn sample(
    s: &mut Sequence,
    logits: &mut [f32],
    tok: &Tokenizer,
) -> Option<(u32, Option<TokenLogprobs>)> {
    let (mut json, mut header);
    let filter: Option<&mut dyn TokenFilter> = match active_constraint(&mut s.json, &mut s.tools) {
        Some(CallConstraint::Json(constraint)) => {
            json = JsonFilter {
                constraint,
                tokenizer: tok,
            };
            Some(&mut json)
        }
        Some(CallConstraint::Header(call_header)) => {
            header = HeaderFilter {
                header: call_header,
                tokenizer: tok,
            };
            Some(&mut header)
        }
        None => None,
    };
    // Logprobs describe the model's own distribution, before penalties and temperature.
    let choice = match s.logprobs {
        Some(n) => s
            .sampler
            .sample_with_logprobs(logits, &s.tokens, n as usize, tok, filter)
            .map(|(token, lp)| (token, Some(lp))),
        None => s
            .sampler
            .sample_filtered(logits, &s.tokens, filter)
            .map(|token| (token, None)),
    };
    if choice.is_none() {
        s.send_error(
            ErrorKind::Engine,
            "no token of this model's vocabulary can continue the JSON output".into(),
        );
        s.finish.get_or_insert(FinishReason::Error);
    }
    choice
}

/// The next token of each `(running index, logit row)` in `picking` (increasing in
/// both), in that order (`None` where the backend has no such row): a plain greedy
/// request's from the backend where it made the pick itself, the others sampled from
/// their rows on the backend's host threads (a sampled row over a 128k vocabulary costs
/// the host 0.6 to 1.5 ms, so a batch of 32 sampled on one thread would keep a GPU
/// waiting far longer than its step took).
fn choose_tokens(
    running: &mut [Sequence],
    backend: &mut dyn Backend,
    tok: &Tokenizer,
    picking: &[(usize, usize)],
    rows: usize,
    vocab: usize,
) -> Vec<Option<(u32, Option<TokenLogprobs>)>> {
    let mut chosen: Vec<Option<(u32, Option<TokenLogprobs>)>> = picking
        .iter()
        .map(|&(i, row)| {
            running[i]
                .argmax_bias()
                .and_then(|_| backend.greedy_pick(row))
                .map(|t| (t, None))
        })
        .collect();

    /// A row to sample: the sequence, its logits, where its choice goes.
    struct Task<'a> {
        seq: &'a mut Sequence,
        logits: &'a mut [f32],
        out: &'a mut Option<(u32, Option<TokenLogprobs>)>,
    }
    let (all_rows, host) = backend.logit_rows_mut(rows);
    let mut rows_left = all_rows.chunks_mut(vocab.max(1));
    let mut seqs_left = running.iter_mut().enumerate();
    let (mut next_row, mut next_seq) = (0, 0);
    let mut tasks = Vec::new();
    for (&(i, row), out) in picking.iter().zip(chosen.iter_mut()) {
        if out.is_some() {
            continue;
        }
        // Both advance monotonically: skip to this task's sequence and row.
        let Some(logits) = rows_left.nth(row - next_row) else {
            break;
        };
        let Some((_, seq)) = seqs_left.nth(i - next_seq) else {
            break;
        };
        (next_row, next_seq) = (row + 1, i + 1);
        tasks.push(std::sync::Mutex::new(Task { seq, logits, out }));
    }
    // Each task's lock is taken once, by the one thread that runs it.
    let run = |t: usize| {
        let mut task = tasks[t].lock().unwrap_or_else(|e| e.into_inner());
        let Task { seq, logits, out } = &mut *task;
        **out = sample(seq, logits, tok);
    };
    host.for_each_task(tasks.len(), &run);
    drop(tasks);
    chosen
}

/// The bytes of `token` a tool-call watcher reads: a control token's only when it is a
/// call tag of the syntax (some vocabularies make `<tool_call>` one; `[TOOL_CALLS]` is
/// one in Mistral's) or the text stream shows it (a thinking tag), as the stream drops
/// the others.
pub(super) fn tool_watch_bytes<'t>(
    tok: &'t Tokenizer,
    token: u32,
    syntax: CallSyntax,
    decoder: &StreamDecoder,
) -> &'t [u8] {
    let bytes = tok.token_bytes(token);
    if !decoder.renders(tok, token) && !syntax.is_tag(bytes) {
        &[]
    } else {
        bytes
    }
}

/// Appends the chosen `token` to `s` and streams it (with its text, once whole and clear
/// of stop strings), ending the sequence on an end-of-generation token, a stop string,
/// `max_tokens` or the context.
fn emit(s: &mut Sequence, token: u32, lp: Option<TokenLogprobs>, tok: &Tokenizer, ctx: usize) {
    let now = Instant::now();
    if s.timings.first_token.is_none() {
        s.timings.first_token = Some(now);
        s.send_prefilled();
    }
    s.timings.last_token = Some(now);
    s.tokens.push(token);
    if let Some(json) = &mut s.json {
        json.advance(tok, token);
    }

    let mut text = String::new();
    let eog = tok.is_eog(token);
    if !eog {
        let delta = match &mut s.tools {
            None => s.decoder.push(tok, token),
            Some(tools) => {
                let watched = tools.push(tool_watch_bytes(tok, token, tools.syntax(), &s.decoder));
                let first = tools.calls() - watched.calls.len() as u32;
                for delta in watched.deltas {
                    s.send_tool_call_delta(delta);
                }
                for (index, call) in (first..).zip(watched.calls) {
                    s.send_tool_call(index, call);
                }
                if watched.end {
                    s.finish.get_or_insert(FinishReason::Stop);
                }
                s.decoder.push_bytes(&watched.text)
            }
        };
        let out = s.stop.push(&delta);
        text.push_str(&out.text);
        if out.stopped {
            s.finish = Some(FinishReason::Stop);
        }
    } else {
        s.finish = Some(FinishReason::Stop);
    }
    if s.finish.is_none() && s.json.as_ref().is_some_and(|j| j.is_done()) {
        s.finish = Some(FinishReason::Stop);
    }
    if s.finish.is_none() && (s.completion_tokens() >= s.max_tokens || s.tokens.len() >= ctx) {
        s.finish = Some(FinishReason::Length);
    }
    if s.finish.is_some() && !s.stop.is_stopped() {
        // Ending for a reason other than a stop string: release text held back as a
        // possible stop-string prefix or an unfinished tool call, and any incomplete
        // character (lossily).
        if let Some(tools) = &mut s.tools {
            let held = tools.finish();
            let delta = s.decoder.push_bytes(&held);
            text.push_str(&s.stop.push(&delta).text);
        }
        let tail = s.decoder.finish();
        text.push_str(&s.stop.push(&tail).text);
        text.push_str(&s.stop.finish());
    }
    if let Some(splitter) = &mut s.reasoning {
        let mut split = splitter.push(&text);
        if s.finish.is_some() {
            let last = splitter.finish();
            split.reasoning.push_str(&last.reasoning);
            split.content.push_str(&last.content);
        }
        if !split.reasoning.is_empty() {
            s.send_reasoning(split.reasoning);
        }
        text = split.content;
    }
    if let Some(lp) = lp.as_ref().filter(|_| s.token_bytes) {
        // Each token as `top` shows it, a control token as its text (`<|im_end|>`)
        // though the text stream leaves it out: the chosen token reads as the same
        // token among its alternatives.
        s.send_token_bytes(TokenBytesEvent {
            id: s.request_id,
            bytes: tok.token_bytes(token).to_vec(),
            top: lp
                .top
                .iter()
                .map(|(t, ..)| tok.token_bytes(*t).to_vec())
                .collect(),
        });
    }
    let event = TokenEvent {
        id: s.request_id,
        token,
        text,
        logprobs: lp,
    };
    s.send_token(event);
}
