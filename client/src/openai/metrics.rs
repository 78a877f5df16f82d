//! Counters and histograms for `GET /metrics`, rendered in the Prometheus text format.
//!
//! Hand-written rather than a metrics crate: a handful of series, one mutex, no global
//! registry. Label values come from a fixed set (route patterns, error kinds), so series
//! cannot grow without bound.

use std::collections::BTreeMap;
use std::fmt::Write;
use std::sync::{Mutex, MutexGuard};

use crate::protocol::{
    CacheReport, DecodeClock, DoneEvent, ExternalJob, PrefillEvent, StatusReport,
};

/// Time to first token, seconds.
const TTFT_BUCKETS: &[f64] = &[0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0];
/// Decode rate, tokens per second.
const DECODE_TPS_BUCKETS: &[f64] = &[1.0, 2.0, 5.0, 10.0, 20.0, 50.0, 100.0, 200.0, 500.0, 1000.0];

#[derive(Debug, Default)]
pub struct Metrics {
    inner: Mutex<Inner>,
}

#[derive(Debug)]
struct Inner {
    /// (endpoint, HTTP status) -> count.
    requests: BTreeMap<(String, u16), u64>,
    errors: BTreeMap<&'static str, u64>,
    prompt_tokens: u64,
    /// Of `prompt_tokens`, those the daemon took from its prefix cache.
    prompt_tokens_cached: u64,
    completion_tokens: u64,
    ttft_seconds: Histogram,
    decode_tps: Histogram,
    /// Jobs the proxy forwarded to other engines, by engine name.
    forwarded: BTreeMap<String, Forwarded>,
}

/// One upstream engine's forwarded jobs, as the proxy measured them.
#[derive(Debug)]
struct Forwarded {
    requests: u64,
    prompt_tokens: u64,
    completion_tokens: u64,
    ttft_seconds: Histogram,
    decode_tps: Histogram,
}

impl Default for Forwarded {
    fn default() -> Self {
        Self {
            requests: 0,
            prompt_tokens: 0,
            completion_tokens: 0,
            ttft_seconds: Histogram::new(TTFT_BUCKETS),
            decode_tps: Histogram::new(DECODE_TPS_BUCKETS),
        }
    }
}

impl Default for Inner {
    fn default() -> Self {
        Self {
            requests: BTreeMap::new(),
            errors: BTreeMap::new(),
            prompt_tokens: 0,
            prompt_tokens_cached: 0,
            completion_tokens: 0,
            ttft_seconds: Histogram::new(TTFT_BUCKETS),
            decode_tps: Histogram::new(DECODE_TPS_BUCKETS),
            forwarded: BTreeMap::new(),
        }
    }
}

#[derive(Debug)]
struct Histogram {
    bounds: &'static [f64],
    /// Per bucket, not cumulative; the last one is `+Inf`.
    counts: Vec<u64>,
    sum: f64,
    count: u64,
}

impl Histogram {
    fn new(bounds: &'static [f64]) -> Self {
        Self {
            bounds,
            counts: vec![0; bounds.len() + 1],
            sum: 0.0,
            count: 0,
        }
    }

    fn observe(&mut self, value: f64) {
        if !value.is_finite() {
            return;
        }
        let bucket = self
            .bounds
            .iter()
            .position(|&b| value <= b)
            .unwrap_or(self.bounds.len());
        self.counts[bucket] += 1;
        self.sum += value;
        self.count += 1;
    }

    fn render(&self, out: &mut String, name: &str, help: &str) {
        header(out, name, "histogram", help);
        self.render_series(out, name, "");
    }

    /// The series' lines without the header; `labels` (`engine="llama"`) go before `le`.
    fn render_series(&self, out: &mut String, name: &str, labels: &str) {
        let sep = if labels.is_empty() { "" } else { "," };
        let mut cumulative = 0;
        for (i, count) in self.counts.iter().enumerate() {
            cumulative += count;
            let le = self
                .bounds
                .get(i)
                .map_or_else(|| "+Inf".to_string(), |b| b.to_string());
            let _ = writeln!(
                out,
                "{name}_bucket{{{labels}{sep}le=\"{le}\"}} {cumulative}"
            );
        }
        let braced = if labels.is_empty() {
            String::new()
        } else {
            format!("{{{labels}}}")
        };
        let _ = writeln!(out, "{name}_sum{braced} {}", self.sum);
        let _ = writeln!(out, "{name}_count{braced} {}", self.count);
    }
}

impl Metrics {
    fn lock(&self) -> MutexGuard<'_, Inner> {
        // A panic while holding this lock cannot leave counters inconsistent in a way that
        // matters, so keep counting rather than poisoning every later request.
        self.inner
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    pub fn record_request(&self, endpoint: &str, status: u16) {
        *self
            .lock()
            .requests
            .entry((endpoint.to_string(), status))
            .or_insert(0) += 1;
    }

    pub fn record_error(&self, kind: &'static str) {
        *self.lock().errors.entry(kind).or_insert(0) += 1;
    }

    /// Books one finished generation's counts and timings, and how its prompt was read
    /// when the daemon said.
    pub fn record_done(&self, done: &DoneEvent, prefill: Option<&PrefillEvent>) {
        let mut inner = self.lock();
        inner.prompt_tokens += u64::from(done.usage.prompt_tokens);
        inner.prompt_tokens_cached += prefill.map_or(0, |p| u64::from(p.cached_tokens));
        inner.completion_tokens += u64::from(done.usage.completion_tokens);
        if let Some(ttft_ms) = done.timings.ttft_ms {
            inner.ttft_seconds.observe(ttft_ms / 1000.0);
        }
        if let Some(tps) = done.timings.decode_tps {
            inner.decode_tps.observe(tps);
        }
    }

    /// Books one job the proxy forwarded to another engine. Decode rates go into the
    /// histogram only when they are real ones (the engine's own clock, or first to last
    /// body byte of a stream), not a whole request's lower bound.
    pub fn record_forwarded(&self, job: &ExternalJob) {
        let mut inner = self.lock();
        let f = inner.forwarded.entry(job.engine.clone()).or_default();
        f.requests += 1;
        f.prompt_tokens += u64::from(job.usage.prompt_tokens);
        f.completion_tokens += u64::from(job.usage.completion_tokens);
        if let Some(ttft_ms) = job.timings.ttft_ms {
            f.ttft_seconds.observe(ttft_ms / 1000.0);
        }
        let real_rate = matches!(job.decode_clock, DecodeClock::Engine | DecodeClock::Stream);
        if let (true, Some(tps)) = (real_rate, job.timings.decode_tps) {
            f.decode_tps.observe(tps);
        }
    }

    /// The exposition text; `status` and `cache` are the daemon's answers at scrape time,
    /// if it answered (`cache` needs a daemon of protocol 1.2 or later).
    pub fn render(&self, status: Option<&StatusReport>, cache: Option<&CacheReport>) -> String {
        let inner = self.lock();
        let mut out = String::new();

        header(
            &mut out,
            "sparkd_openai_requests_total",
            "counter",
            "HTTP requests by endpoint and status.",
        );
        for ((endpoint, status), count) in &inner.requests {
            let _ = writeln!(
                out,
                "sparkd_openai_requests_total{{endpoint=\"{}\",status=\"{status}\"}} {count}",
                escape(endpoint)
            );
        }
        header(
            &mut out,
            "sparkd_openai_errors_total",
            "counter",
            "Failed requests by error kind.",
        );
        for (kind, count) in &inner.errors {
            let _ = writeln!(
                out,
                "sparkd_openai_errors_total{{kind=\"{}\"}} {count}",
                escape(kind)
            );
        }
        header(
            &mut out,
            "sparkd_openai_prompt_tokens_total",
            "counter",
            "Prompt tokens of finished generations.",
        );
        let _ = writeln!(
            out,
            "sparkd_openai_prompt_tokens_total {}",
            inner.prompt_tokens
        );
        header(
            &mut out,
            "sparkd_openai_prompt_tokens_cached_total",
            "counter",
            "Prompt tokens of finished generations that the daemon took from its prefix cache.",
        );
        let _ = writeln!(
            out,
            "sparkd_openai_prompt_tokens_cached_total {}",
            inner.prompt_tokens_cached
        );
        header(
            &mut out,
            "sparkd_openai_completion_tokens_total",
            "counter",
            "Generated tokens of finished generations.",
        );
        let _ = writeln!(
            out,
            "sparkd_openai_completion_tokens_total {}",
            inner.completion_tokens
        );
        inner.ttft_seconds.render(
            &mut out,
            "sparkd_openai_ttft_seconds",
            "Time to first token, from the daemon's per-request timings.",
        );
        inner.decode_tps.render(
            &mut out,
            "sparkd_openai_decode_tokens_per_second",
            "Decode rate per request, from the daemon's per-request timings.",
        );

        render_forwarded(&mut out, &inner.forwarded);

        header(
            &mut out,
            "sparkd_up",
            "gauge",
            "1 when the daemon answered the status request of this scrape.",
        );
        let _ = writeln!(out, "sparkd_up {}", u8::from(status.is_some()));
        if let Some(s) = status {
            let gauges = [
                (
                    "sparkd_running_requests",
                    "Generations in the running batch.",
                    u64::from(s.running),
                ),
                (
                    "sparkd_queued_requests",
                    "Generations waiting for admission.",
                    u64::from(s.queued),
                ),
                (
                    "sparkd_kv_blocks_used",
                    "KV-cache blocks in use.",
                    u64::from(s.kv_blocks_used),
                ),
                (
                    "sparkd_kv_blocks_total",
                    "KV-cache blocks in all.",
                    u64::from(s.kv_blocks_total),
                ),
            ];
            for (name, help, value) in gauges {
                header(&mut out, name, "gauge", help);
                let _ = writeln!(out, "{name} {value}");
            }
            let counters = [
                (
                    "sparkd_prompt_tokens_total",
                    "Prompt tokens of the daemon's finished generations, since it started.",
                    s.prompt_tokens_processed,
                ),
                (
                    "sparkd_generated_tokens_total",
                    "Tokens the daemon generated, since it started.",
                    s.tokens_generated,
                ),
            ];
            for (name, help, value) in counters {
                header(&mut out, name, "counter", help);
                let _ = writeln!(out, "{name} {value}");
            }
        }
        if let Some(c) = cache {
            let figures = [
                (
                    "sparkd_prefix_cache_blocks",
                    "gauge",
                    "KV-cache blocks holding a cached prefix, held or idle.",
                    u64::from(c.cached_blocks),
                ),
                (
                    "sparkd_prefix_cache_idle_blocks",
                    "gauge",
                    "Cached blocks no running request holds.",
                    u64::from(c.idle_blocks),
                ),
                (
                    "sparkd_prefix_cache_evicted_blocks_total",
                    "counter",
                    "Cached blocks given up for room, since the daemon started.",
                    c.evicted_blocks,
                ),
                (
                    "sparkd_prompt_tokens_reused_total",
                    "counter",
                    "Prompt tokens taken from the prefix cache instead of computed, since the daemon started.",
                    c.prompt_tokens_reused,
                ),
            ];
            for (name, kind, help, value) in figures {
                header(&mut out, name, kind, help);
                let _ = writeln!(out, "{name} {value}");
            }
        }
        out
    }
}

/// A metric's name, its help, and how to read its value from one engine's figures.
type Series<T> = (&'static str, &'static str, fn(&Forwarded) -> T);
type HistogramSeries = (&'static str, &'static str, fn(&Forwarded) -> &Histogram);

/// The proxy's series, one per upstream engine (nothing before the first forwarded job).
fn render_forwarded(out: &mut String, forwarded: &BTreeMap<String, Forwarded>) {
    if forwarded.is_empty() {
        return;
    }
    let counters: [Series<u64>; 3] = [
        (
            "sparkd_openai_forwarded_requests_total",
            "Requests forwarded to another engine, by engine.",
            |f| f.requests,
        ),
        (
            "sparkd_openai_forwarded_prompt_tokens_total",
            "Prompt tokens of forwarded requests (reported by the engine, else estimated), by engine.",
            |f| f.prompt_tokens,
        ),
        (
            "sparkd_openai_forwarded_completion_tokens_total",
            "Generated tokens of forwarded requests (reported by the engine, else estimated), by engine.",
            |f| f.completion_tokens,
        ),
    ];
    for (name, help, value) in counters {
        header(out, name, "counter", help);
        for (engine, f) in forwarded {
            let _ = writeln!(out, "{name}{{engine=\"{}\"}} {}", escape(engine), value(f));
        }
    }
    let histograms: [HistogramSeries; 2] = [
        (
            "sparkd_openai_forwarded_ttft_seconds",
            "Time to the first body byte of forwarded streams, by engine.",
            |f| &f.ttft_seconds,
        ),
        (
            "sparkd_openai_forwarded_decode_tokens_per_second",
            "Decode rate of forwarded requests (engine clock or stream bytes), by engine.",
            |f| &f.decode_tps,
        ),
    ];
    for (name, help, histogram) in histograms {
        header(out, name, "histogram", help);
        for (engine, f) in forwarded {
            let labels = format!("engine=\"{}\"", escape(engine));
            histogram(f).render_series(out, name, &labels);
        }
    }
}

fn header(out: &mut String, name: &str, kind: &str, help: &str) {
    let _ = writeln!(out, "# HELP {name} {help}");
    let _ = writeln!(out, "# TYPE {name} {kind}");
}

/// Label-value escaping from the text format: backslash, quote and newline.
fn escape(value: &str) -> String {
    value
        .replace('\\', "\\\\")
        .replace('"', "\\\"")
        .replace('\n', "\\n")
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::protocol::{FinishReason, Timings, Usage};

    fn done(ttft_ms: f64, tps: f64) -> DoneEvent {
        DoneEvent {
            id: 1,
            finish_reason: FinishReason::Stop,
            usage: Usage {
                prompt_tokens: 3,
                completion_tokens: 4,
            },
            timings: Timings {
                ttft_ms: Some(ttft_ms),
                decode_tps: Some(tps),
                ..Timings::default()
            },
        }
    }

    fn line_value(text: &str, prefix: &str) -> f64 {
        let line = text
            .lines()
            .find(|l| l.starts_with(prefix))
            .unwrap_or_else(|| panic!("{prefix} missing"));
        line.rsplit(' ').next().unwrap().parse().unwrap()
    }

    #[test]
    fn histograms_are_cumulative() {
        let m = Metrics::default();
        m.record_done(&done(20.0, 30.0), None); // 0.02 s, 30 tok/s
        m.record_done(&done(700.0, 3000.0), None); // 0.7 s, past the last rate bucket
        let text = m.render(None, None);
        assert_eq!(
            line_value(&text, "sparkd_openai_ttft_seconds_bucket{le=\"0.01\"}"),
            0.0
        );
        assert_eq!(
            line_value(&text, "sparkd_openai_ttft_seconds_bucket{le=\"0.025\"}"),
            1.0
        );
        assert_eq!(
            line_value(&text, "sparkd_openai_ttft_seconds_bucket{le=\"1\"}"),
            2.0
        );
        assert_eq!(
            line_value(&text, "sparkd_openai_ttft_seconds_bucket{le=\"+Inf\"}"),
            2.0
        );
        assert!((line_value(&text, "sparkd_openai_ttft_seconds_sum") - 0.72).abs() < 1e-9);
        assert_eq!(
            line_value(
                &text,
                "sparkd_openai_decode_tokens_per_second_bucket{le=\"1000\"}"
            ),
            1.0
        );
        assert_eq!(
            line_value(&text, "sparkd_openai_decode_tokens_per_second_count"),
            2.0
        );
        assert_eq!(
            line_value(&text, "sparkd_openai_completion_tokens_total"),
            8.0
        );
        assert_eq!(line_value(&text, "sparkd_up"), 0.0);
    }

    #[test]
    fn forwarded_jobs_are_counted_by_engine() {
        let m = Metrics::default();
        assert!(!m.render(None, None).contains("forwarded"));
        let job = |engine: &str, clock, tps| ExternalJob {
            engine: engine.into(),
            upstream: "http://127.0.0.1:1".into(),
            model: "m".into(),
            request_id: 1,
            started_unix_ms: 0,
            finished_unix_ms: 1,
            usage: Usage {
                prompt_tokens: 10,
                completion_tokens: 20,
            },
            timings: Timings {
                ttft_ms: Some(30.0),
                decode_tps: Some(tps),
                ..Timings::default()
            },
            finish_reason: FinishReason::Stop,
            counts: crate::protocol::CountSource::Reported,
            decode_clock: clock,
            http_status: 200,
        };
        m.record_forwarded(&job("vllm", DecodeClock::Stream, 40.0));
        m.record_forwarded(&job("vllm", DecodeClock::Request, 4.0));
        m.record_forwarded(&job("ol\"lama", DecodeClock::Engine, 400.0));
        let text = m.render(None, None);
        let value = |series: &str| line_value(&text, series);
        assert_eq!(
            value("sparkd_openai_forwarded_requests_total{engine=\"vllm\"}"),
            2.0
        );
        assert_eq!(
            value("sparkd_openai_forwarded_completion_tokens_total{engine=\"ol\\\"lama\"}"),
            20.0
        );
        // The whole request's rate (a lower bound) is left out of the histogram.
        assert_eq!(
            value("sparkd_openai_forwarded_decode_tokens_per_second_count{engine=\"vllm\"}"),
            1.0
        );
        assert_eq!(
            value("sparkd_openai_forwarded_decode_tokens_per_second_bucket{engine=\"vllm\",le=\"50\"}"),
            1.0
        );
        assert_eq!(
            value("sparkd_openai_forwarded_ttft_seconds_count{engine=\"vllm\"}"),
            2.0
        );
        // Not mixed into sparkd's own figures.
        assert_eq!(value("sparkd_openai_completion_tokens_total"), 0.0);
    }

    #[test]
    fn requests_and_errors_are_labelled() {
        let m = Metrics::default();
        m.record_request("/v1/models", 200);
        m.record_request("/v1/models", 200);
        m.record_request("/v1/chat/completions", 429);
        m.record_error("busy");
        let text = m.render(None, None);
        assert_eq!(
            line_value(
                &text,
                "sparkd_openai_requests_total{endpoint=\"/v1/models\",status=\"200\"}"
            ),
            2.0
        );
        assert_eq!(
            line_value(
                &text,
                "sparkd_openai_requests_total{endpoint=\"/v1/chat/completions\",status=\"429\"}"
            ),
            1.0
        );
        assert_eq!(
            line_value(&text, "sparkd_openai_errors_total{kind=\"busy\"}"),
            1.0
        );
    }

    #[test]
    fn label_values_are_escaped() {
        assert_eq!(escape("a\"b\\c\nd"), "a\\\"b\\\\c\\nd");
    }
}
