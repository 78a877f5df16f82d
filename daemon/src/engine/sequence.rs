//! One request inside the engine: its tokens, KV blocks, sampler, text pipeline, reply
//! channel and its own timings. Nothing about a request lives outside its sequence.

use std::time::{Duration, Instant};

use spark_client::protocol::{
    DoneEvent, ErrorEvent, ErrorKind, FinishReason, PrefillEvent, ReasoningEvent, ServerMessage,
    Timings, TokenBytesEvent, TokenEvent, ToolCall, ToolCallDeltaEvent, ToolCallEvent, Usage,
};
use tokio::sync::mpsc::UnboundedSender;

use crate::model::BlockTable;
use crate::text::constraint::JsonConstraint;
use crate::text::reasoning::ReasoningSplitter;
use crate::text::tools::watch::{CallConstraint, CallDelta, CallWatcher};
use crate::text::{Sampler, StopMatcher, StreamDecoder};

use super::api::{ClientInfo, ConnId};

/// Engine-side clock readings and step durations of one request. Step durations are
/// booked by the engine on every sequence that took part in the step, so they are this
/// request's own figures however many others shared the step.
#[derive(Debug, Clone, Default)]
pub struct SeqTimings {
    pub arrived: Option<Instant>,
    pub admitted: Option<Instant>,
    pub first_token: Option<Instant>,
    pub last_token: Option<Instant>,
    pub prefill: Duration,
    pub decode: Duration,
}

impl SeqTimings {
    /// The wire form, for `prefilled_tokens` prompt tokens run through the model (those
    /// taken from the prefix cache are not) and `completion_tokens` generated. Rates are
    /// only given when they have a meaning: no decode rate with fewer than two tokens,
    /// no prefill rate without prefill work.
    pub fn report(&self, prefilled_tokens: u32, completion_tokens: u32) -> Timings {
        let ms = |d: Duration| d.as_secs_f64() * 1e3;
        let arrived = self.arrived;
        let since_arrival = |t: Option<Instant>| match (arrived, t) {
            (Some(a), Some(t)) => Some(ms(t.saturating_duration_since(a))),
            _ => None,
        };
        let prefill_ms = ms(self.prefill);
        let decode_ms = ms(self.decode);
        Timings {
            queue_ms: since_arrival(self.admitted).unwrap_or_else(|| {
                // Never admitted: it waited from arrival until now.
                arrived.map_or(0.0, |a| ms(a.elapsed()))
            }),
            ttft_ms: since_arrival(self.first_token),
            prefill_ms,
            generation_ms: match (self.first_token, self.last_token) {
                (Some(f), Some(l)) => ms(l.saturating_duration_since(f)),
                _ => 0.0,
            },
            decode_ms,
            decode_tps: (completion_tokens >= 2 && decode_ms > 0.0)
                .then(|| (completion_tokens - 1) as f64 / decode_ms * 1e3),
            prefill_tps: (prefilled_tokens > 0 && prefill_ms > 0.0)
                .then(|| prefilled_tokens as f64 / prefill_ms * 1e3),
        }
    }
}

/// What a sequence's next token must satisfy: its JSON output, or the tool call being
/// written. (Over the two fields, so the sampler can borrow the rest of the sequence.)
pub fn active_constraint<'a>(
    json: &'a mut Option<JsonConstraint>,
    tools: &'a mut Option<CallWatcher>,
) -> Option<CallConstraint<'a>> {
    match (json, tools) {
        (Some(json), _) => Some(CallConstraint::Json(json)),
        (None, Some(tools)) => tools.constraint(),
        (None, None) => None,
    }
}

pub struct Sequence {
    pub job: u64,
    pub conn: ConnId,
    pub request_id: u64,
    pub client: ClientInfo,
    /// Prompt followed by every generated token.
    pub tokens: Vec<u32>,
    pub n_prompt: usize,
    /// Positions whose K/V are in the cache; the next step feeds `tokens[n_cached..]`.
    pub n_cached: usize,
    /// Prompt positions taken from the prefix cache when last admitted, not computed.
    pub n_reused: usize,
    pub max_tokens: usize,
    pub table: BlockTable,
    pub sampler: Sampler,
    pub decoder: StreamDecoder,
    pub stop: StopMatcher,
    /// JSON output: what the text so far allows next.
    pub json: Option<JsonConstraint>,
    /// A chat with tools: the calls in the answer, and the constraint of the one being
    /// written.
    pub tools: Option<CallWatcher>,
    /// A chat answer whose reasoning goes apart (the client asked for it).
    pub reasoning: Option<ReasoningSplitter>,
    pub logprobs: Option<u8>,
    /// Each token with logprobs is preceded by a `TokenBytes` event (the client reads
    /// protocol 1.11).
    pub token_bytes: bool,
    pub events: UnboundedSender<ServerMessage>,
    pub timings: SeqTimings,
    pub started_unix_ms: u64,
    /// Set once the sequence must leave the batch; the engine sends `Done` then.
    pub finish: Option<FinishReason>,
}

impl Sequence {
    /// When its next token is the argmax of the logits plus a bias (greedy, no penalty,
    /// no logprobs, any text), that bias: a backend may add it and pick on the device.
    pub fn argmax_bias(&self) -> Option<&[(u32, f32)]> {
        (self.logprobs.is_none() && self.json.is_none() && self.tools_free())
            .then(|| self.sampler.argmax_bias())
            .flatten()
    }

    /// Whether no tool call is being written (its tokens are constrained).
    fn tools_free(&self) -> bool {
        self.tools.as_ref().is_none_or(CallWatcher::is_free)
    }

    /// Sends a tool call the model made; a closed channel means the client has gone.
    pub fn send_tool_call(&mut self, index: u32, call: ToolCall) {
        let event = ToolCallEvent {
            id: self.request_id,
            index,
            call,
        };
        self.send(ServerMessage::ToolCall(event));
    }

    /// Sends a piece of a tool call being written; a closed channel means the client
    /// has gone.
    pub fn send_tool_call_delta(&mut self, delta: CallDelta) {
        let event = ToolCallDeltaEvent {
            id: self.request_id,
            index: delta.index,
            opening: delta.opening,
            arguments: delta.arguments,
        };
        self.send(ServerMessage::ToolCallDelta(event));
    }

    pub fn completion_tokens(&self) -> usize {
        self.tokens.len() - self.n_prompt
    }

    pub fn usage(&self) -> Usage {
        Usage {
            prompt_tokens: self.n_prompt as u32,
            completion_tokens: self.completion_tokens() as u32,
        }
    }

    pub fn in_prefill(&self) -> bool {
        self.n_cached < self.n_prompt
    }

    /// Sends a piece of reasoning; a closed channel means the client has gone.
    pub fn send_reasoning(&mut self, text: String) {
        let event = ReasoningEvent {
            id: self.request_id,
            text,
        };
        self.send(ServerMessage::Reasoning(event));
    }

    /// Sends the raw bytes of the token about to be sent; a closed channel means the
    /// client has gone.
    pub fn send_token_bytes(&mut self, event: TokenBytesEvent) {
        self.send(ServerMessage::TokenBytes(event));
    }

    /// Sends a token event; a closed channel means the client has gone.
    pub fn send_token(&mut self, event: TokenEvent) {
        self.send(ServerMessage::Token(event));
    }

    /// Tells the client how its prompt was read; sent once, before the first token.
    pub fn send_prefilled(&mut self) {
        let event = PrefillEvent {
            id: self.request_id,
            prompt_tokens: self.n_prompt as u32,
            cached_tokens: self.n_reused as u32,
        };
        self.send(ServerMessage::Prefilled(event));
    }

    /// Sends one event of the generation's stream. A closed channel means the client
    /// has gone: the sequence ends as `Disconnected` unless it was already ending.
    fn send(&mut self, message: ServerMessage) {
        if self.events.send(message).is_err() && self.finish.is_none() {
            self.finish = Some(FinishReason::Disconnected);
        }
    }

    pub fn send_error(&self, kind: ErrorKind, message: String) {
        let _ = self.events.send(ServerMessage::Error(ErrorEvent {
            id: Some(self.request_id),
            kind,
            message,
        }));
    }

    pub fn done_event(&self, reason: FinishReason) -> DoneEvent {
        let usage = self.usage();
        DoneEvent {
            id: self.request_id,
            finish_reason: reason,
            usage,
            timings: self.timings.report(
                (self.n_prompt - self.n_reused) as u32,
                usage.completion_tokens,
            ),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn decode_rate_excludes_the_first_token_and_needs_two() {
        let t0 = Instant::now();
        let t = SeqTimings {
            arrived: Some(t0),
            admitted: Some(t0 + Duration::from_millis(5)),
            first_token: Some(t0 + Duration::from_millis(50)),
            last_token: Some(t0 + Duration::from_millis(150)),
            prefill: Duration::from_millis(40),
            decode: Duration::from_millis(90),
        };
        let r = t.report(20, 10);
        assert!((r.queue_ms - 5.0).abs() < 1e-9);
        assert!((r.ttft_ms.unwrap() - 50.0).abs() < 1e-9);
        assert!((r.generation_ms - 100.0).abs() < 1e-9);
        assert!(
            (r.decode_tps.unwrap() - 100.0).abs() < 1e-9,
            "9 tokens in 90 ms"
        );
        assert!((r.prefill_tps.unwrap() - 500.0).abs() < 1e-9);
        assert_eq!(t.report(20, 1).decode_tps, None);
        assert_eq!(t.report(20, 0).decode_tps, None);
    }

    #[test]
    fn a_request_that_never_ran_reports_no_rates() {
        let t = SeqTimings {
            arrived: Some(Instant::now()),
            ..Default::default()
        };
        let r = t.report(0, 0);
        assert_eq!(r.ttft_ms, None);
        assert_eq!(r.decode_tps, None);
        assert_eq!(r.prefill_tps, None);
        assert!(r.queue_ms >= 0.0);
    }
}
