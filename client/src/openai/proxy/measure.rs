//! Turns what the tap observed about one forwarded request into the job the daemon
//! records: which counts to trust and what each timing means.

use std::time::Duration;

use super::scan::EngineReport;
use crate::protocol::{CountSource, DecodeClock, ExternalJob, FinishReason, Timings, Usage};

/// The kind of endpoint a request went to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Endpoint {
    /// `/v1/chat/completions`, `/v1/completions`, Ollama's `/api/chat`, `/api/generate`.
    Generation,
    /// `/v1/embeddings`: prompt tokens only.
    Embeddings,
}

/// How the reply body is framed, from its `Content-Type`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BodyKind {
    /// One JSON document (a non-streaming reply).
    Json,
    /// `text/event-stream`.
    Sse,
    /// `application/x-ndjson` (Ollama's streams).
    Ndjson,
}

impl BodyKind {
    pub fn from_content_type(content_type: &str) -> Self {
        let mime = content_type
            .split(';')
            .next()
            .unwrap_or_default()
            .trim()
            .to_ascii_lowercase();
        match mime.as_str() {
            "text/event-stream" => BodyKind::Sse,
            "application/x-ndjson" | "application/ndjson" | "application/jsonl" => BodyKind::Ndjson,
            _ => BodyKind::Json,
        }
    }

    pub fn is_stream(self) -> bool {
        self != BodyKind::Json
    }
}

/// How the response ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum End {
    /// The whole body went through.
    Complete,
    /// The upstream's body broke off (or it never answered).
    UpstreamFailed,
    /// The client went away first.
    ClientGone,
    /// The server shut down first.
    Shutdown,
}

/// Who served the request; fixed before it is sent.
#[derive(Debug, Clone)]
pub struct JobMeta {
    pub engine: String,
    pub upstream: String,
    pub model: String,
    pub request_id: u64,
    pub endpoint: Endpoint,
}

/// Everything the tap saw, as integers and durations (never bytes).
#[derive(Debug, Clone)]
pub struct Observed {
    pub started_unix_ms: u64,
    pub finished_unix_ms: u64,
    /// The upstream's status; 0 when it never answered.
    pub status: u16,
    pub kind: BodyKind,
    /// A `Content-Encoding` other than identity: the bytes cannot be read.
    pub compressed: bool,
    pub end: End,
    /// Request sent to first body byte.
    pub first_byte: Option<Duration>,
    /// First body byte to last body byte.
    pub span: Duration,
    /// Request sent to the end of the body.
    pub total: Duration,
    pub report: EngineReport,
    /// Pieces counted in the stream, when it was counted.
    pub pieces: Option<u32>,
}

fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1000.0
}

/// Tokens per second, when there is something to divide.
fn rate(tokens: u32, millis: f64) -> Option<f64> {
    (tokens > 0 && millis > 0.0).then(|| f64::from(tokens) * 1000.0 / millis)
}

pub fn job(meta: JobMeta, seen: &Observed) -> ExternalJob {
    let http_error = seen.status >= 400;
    let finish_reason = match seen.end {
        _ if http_error => FinishReason::Error,
        End::ClientGone => FinishReason::Disconnected,
        End::Shutdown => FinishReason::Shutdown,
        _ if seen.status == 0 => FinishReason::Error,
        End::UpstreamFailed => FinishReason::Error,
        End::Complete => seen.report.finish.unwrap_or(FinishReason::Stop),
    };
    let mut job = ExternalJob {
        engine: meta.engine,
        upstream: meta.upstream,
        model: meta.model,
        request_id: meta.request_id,
        started_unix_ms: seen.started_unix_ms,
        finished_unix_ms: seen.finished_unix_ms,
        usage: Usage::default(),
        timings: Timings::default(),
        finish_reason,
        counts: CountSource::Unknown,
        decode_clock: DecodeClock::None,
        http_status: seen.status,
    };
    // An error answer (or none) is recorded as such, without stats.
    if http_error || seen.status == 0 {
        return job;
    }
    if meta.endpoint == Endpoint::Embeddings {
        if let Some(prompt) = seen.report.prompt_tokens {
            job.usage.prompt_tokens = prompt;
            job.counts = CountSource::Reported;
        }
        return job;
    }
    let (usage, counts) = counts(seen);
    job.usage = usage;
    job.counts = counts;
    let (timings, clock) = timings(seen, usage);
    job.timings = timings;
    job.decode_clock = clock;
    job
}

fn counts(seen: &Observed) -> (Usage, CountSource) {
    let report = &seen.report;
    if seen.compressed {
        return (Usage::default(), CountSource::Unknown);
    }
    if report.has_counts() {
        let usage = Usage {
            prompt_tokens: report.prompt_tokens.unwrap_or(0),
            completion_tokens: report.completion_tokens.unwrap_or(0),
        };
        return (usage, CountSource::Reported);
    }
    match seen.pieces {
        Some(pieces) => (
            Usage {
                prompt_tokens: 0,
                completion_tokens: pieces,
            },
            CountSource::Estimated,
        ),
        None => (Usage::default(), CountSource::Unknown),
    }
}

fn timings(seen: &Observed, usage: Usage) -> (Timings, DecodeClock) {
    let report = &seen.report;
    let mut t = Timings::default();
    let completion = usage.completion_tokens;
    // Without readable counts there is no rate to give: the durations only.
    let counted = !seen.compressed;
    if let Some(ns) = report.prefill_ns {
        t.prefill_ms = ns as f64 / 1e6;
        t.prefill_tps = rate(usage.prompt_tokens, t.prefill_ms);
    }
    let clock = if seen.kind.is_stream() {
        t.ttft_ms = seen.first_byte.map(ms);
        t.generation_ms = ms(seen.span);
        if let (Some(ns), true) = (report.decode_ns, counted) {
            t.decode_ms = ns as f64 / 1e6;
            t.decode_tps = rate(completion, t.decode_ms);
            DecodeClock::Engine
        } else {
            t.decode_ms = t.generation_ms;
            // The first piece arrives with the first byte: the span decodes the rest.
            if counted {
                t.decode_tps = rate(completion.saturating_sub(1), t.decode_ms);
            }
            DecodeClock::Stream
        }
    } else {
        // A single JSON reply: its first byte comes at the end, so no TTFT.
        t.generation_ms = ms(seen.total);
        if let (Some(ns), true) = (report.decode_ns, counted) {
            t.decode_ms = ns as f64 / 1e6;
            t.decode_tps = rate(completion, t.decode_ms);
            DecodeClock::Engine
        } else {
            t.decode_ms = t.generation_ms;
            if counted {
                t.decode_tps = rate(completion, t.decode_ms);
            }
            DecodeClock::Request
        }
    };
    if completion == 0 && clock != DecodeClock::Engine {
        t.decode_ms = 0.0;
        return (t, DecodeClock::None);
    }
    (t, clock)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn meta(endpoint: Endpoint) -> JobMeta {
        JobMeta {
            engine: "llama".into(),
            upstream: "http://127.0.0.1:8091".into(),
            model: "m".into(),
            request_id: 3,
            endpoint,
        }
    }

    fn observed(kind: BodyKind) -> Observed {
        Observed {
            started_unix_ms: 1_000,
            finished_unix_ms: 3_000,
            status: 200,
            kind,
            compressed: false,
            end: End::Complete,
            first_byte: Some(Duration::from_millis(500)),
            span: Duration::from_millis(1_100),
            total: Duration::from_millis(2_000),
            report: EngineReport::default(),
            pieces: Some(12),
        }
    }

    fn reported(prompt: u32, completion: u32) -> EngineReport {
        EngineReport {
            prompt_tokens: Some(prompt),
            completion_tokens: Some(completion),
            ..EngineReport::default()
        }
    }

    #[test]
    fn a_reported_stream_uses_the_engines_counts_and_the_byte_clock() {
        let mut seen = observed(BodyKind::Sse);
        seen.report = reported(33, 12);
        let job = job(meta(Endpoint::Generation), &seen);
        assert_eq!(
            (job.usage.prompt_tokens, job.usage.completion_tokens),
            (33, 12)
        );
        assert_eq!(
            (job.counts, job.decode_clock),
            (CountSource::Reported, DecodeClock::Stream)
        );
        assert_eq!(job.timings.ttft_ms, Some(500.0));
        assert_eq!(job.timings.decode_ms, 1_100.0);
        // 11 tokens after the first one, over 1.1 s.
        assert!((job.timings.decode_tps.unwrap() - 10.0).abs() < 1e-9);
        assert_eq!(job.finish_reason, FinishReason::Stop);
    }

    #[test]
    fn ollamas_own_durations_replace_the_wall_clock() {
        let mut seen = observed(BodyKind::Ndjson);
        seen.report = EngineReport {
            decode_ns: Some(1_500_000_000),
            prefill_ns: Some(260_000_000),
            finish: Some(FinishReason::Length),
            ..reported(26, 9)
        };
        let job = job(meta(Endpoint::Generation), &seen);
        assert_eq!(job.decode_clock, DecodeClock::Engine);
        assert_eq!(job.timings.decode_ms, 1_500.0);
        assert!((job.timings.decode_tps.unwrap() - 6.0).abs() < 1e-9);
        assert!((job.timings.prefill_tps.unwrap() - 100.0).abs() < 1e-9);
        assert_eq!(job.finish_reason, FinishReason::Length);
    }

    #[test]
    fn a_non_streaming_reply_has_no_ttft_and_a_lower_bound_rate() {
        let mut seen = observed(BodyKind::Json);
        seen.report = reported(33, 10);
        seen.pieces = None;
        let job = job(meta(Endpoint::Generation), &seen);
        assert_eq!(job.decode_clock, DecodeClock::Request);
        assert_eq!(job.timings.ttft_ms, None);
        assert_eq!(job.timings.decode_ms, 2_000.0);
        assert!((job.timings.decode_tps.unwrap() - 5.0).abs() < 1e-9);
    }

    #[test]
    fn no_report_means_estimated_from_pieces_or_unknown() {
        let job_sse = job(meta(Endpoint::Generation), &observed(BodyKind::Sse));
        assert_eq!(
            (job_sse.counts, job_sse.usage.completion_tokens),
            (CountSource::Estimated, 12)
        );
        let mut json = observed(BodyKind::Json);
        json.pieces = None;
        let job_json = job(meta(Endpoint::Generation), &json);
        assert_eq!(job_json.counts, CountSource::Unknown);
        assert_eq!(
            (job_json.decode_clock, job_json.timings.decode_tps),
            (DecodeClock::None, None)
        );
    }

    #[test]
    fn compressed_bodies_get_durations_only() {
        let mut seen = observed(BodyKind::Sse);
        seen.compressed = true;
        seen.pieces = None;
        let job = job(meta(Endpoint::Generation), &seen);
        assert_eq!(job.counts, CountSource::Unknown);
        assert_eq!(job.usage, Usage::default());
        assert_eq!(job.timings.ttft_ms, Some(500.0));
        assert_eq!(
            (job.timings.decode_tps, job.timings.prefill_tps),
            (None, None)
        );
    }

    #[test]
    fn errors_and_endings() {
        let mut seen = observed(BodyKind::Json);
        seen.status = 400;
        seen.report = reported(1, 1);
        let errored = job(meta(Endpoint::Generation), &seen);
        assert_eq!(errored.finish_reason, FinishReason::Error);
        assert_eq!(
            (errored.usage, errored.timings),
            (Usage::default(), Timings::default())
        );
        assert_eq!(errored.http_status, 400);

        let mut gone = observed(BodyKind::Sse);
        gone.end = End::ClientGone;
        assert_eq!(
            job(meta(Endpoint::Generation), &gone).finish_reason,
            FinishReason::Disconnected
        );
        gone.end = End::UpstreamFailed;
        assert_eq!(
            job(meta(Endpoint::Generation), &gone).finish_reason,
            FinishReason::Error
        );
        // No answer at all: an error, unless the client had left first.
        gone.status = 0;
        let unanswered = job(meta(Endpoint::Generation), &gone);
        assert_eq!(
            (unanswered.finish_reason, unanswered.counts),
            (FinishReason::Error, CountSource::Unknown)
        );
        gone.end = End::ClientGone;
        assert_eq!(
            job(meta(Endpoint::Generation), &gone).finish_reason,
            FinishReason::Disconnected
        );
        gone.status = 200;
        gone.end = End::Shutdown;
        assert_eq!(
            job(meta(Endpoint::Generation), &gone).finish_reason,
            FinishReason::Shutdown
        );
    }

    #[test]
    fn embeddings_record_prompt_tokens_only() {
        let mut seen = observed(BodyKind::Json);
        seen.report = reported(2, 0);
        let job = job(meta(Endpoint::Embeddings), &seen);
        assert_eq!(
            (job.usage.prompt_tokens, job.usage.completion_tokens),
            (2, 0)
        );
        assert_eq!(
            (job.counts, job.decode_clock),
            (CountSource::Reported, DecodeClock::None)
        );
        assert_eq!(job.timings, Timings::default());
    }

    #[test]
    fn content_types() {
        assert_eq!(
            BodyKind::from_content_type("text/event-stream"),
            BodyKind::Sse
        );
        assert_eq!(
            BodyKind::from_content_type("Text/Event-Stream; charset=utf-8"),
            BodyKind::Sse
        );
        assert_eq!(
            BodyKind::from_content_type("application/x-ndjson"),
            BodyKind::Ndjson
        );
        assert_eq!(
            BodyKind::from_content_type("application/json; charset=utf-8"),
            BodyKind::Json
        );
    }
}
