//! The proxy's memory of forwarded jobs: the recorder that reports each one to the
//! daemon, a small ring of recent ones (kept whether the daemon took them or not), and
//! their merge into `/v1/jobs`.

use std::collections::VecDeque;
use std::sync::{Arc, Mutex, OnceLock};

use serde::Serialize;
use tokio::sync::mpsc::UnboundedReceiver;

use crate::openai::backend::Backend;
use crate::openai::metrics::Metrics;
use crate::protocol::{CountSource, DecodeClock, ExternalJob, JobEntry, JobRecord};

/// Forwarded jobs the proxy remembers itself.
pub const KEEP_JOBS: usize = 256;

/// A job as `/v1/jobs` shows it: the daemon's record, plus what the proxy knows about
/// the jobs it forwarded (absent on the daemon's own jobs).
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct JobView {
    #[serde(flatten)]
    pub record: JobRecord,
    /// Prompt tokens the daemon took from its prefix cache: `null` on forwarded jobs,
    /// as on `/v1/jobs` without the proxy.
    pub cached_tokens: Option<u32>,
    /// The upstream's URL.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub upstream: Option<String>,
    /// Where the counts came from (`estimated` says only whether they were reported).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub counts: Option<CountSource>,
    /// What `timings.decode_ms` measures: `Engine`, `Stream`, `Request` (a lower bound
    /// including prefill) or `None`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub decode_clock: Option<DecodeClock>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub http_status: Option<u16>,
    /// False when the daemon was unreachable and only the proxy knows the job.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub recorded_by_daemon: Option<bool>,
}

#[derive(Debug, Clone)]
struct Entry {
    record: JobRecord,
    in_daemon: bool,
    upstream: String,
    counts: CountSource,
    decode_clock: DecodeClock,
    http_status: u16,
}

impl Entry {
    fn view(&self, record: JobRecord) -> JobView {
        JobView {
            record,
            cached_tokens: None,
            upstream: Some(self.upstream.clone()),
            counts: Some(self.counts),
            decode_clock: Some(self.decode_clock),
            http_status: Some(self.http_status),
            recorded_by_daemon: Some(self.in_daemon),
        }
    }

    /// The daemon's record of this very job (job numbers restart with the daemon, so
    /// the start time and request id must match too).
    fn is(&self, record: &JobRecord) -> bool {
        self.in_daemon
            && self.record.job == record.job
            && self.record.engine == record.engine
            && self.record.started_unix_ms == record.started_unix_ms
            && self.record.request_id == record.request_id
    }
}

#[derive(Debug, Default)]
pub struct JobLog {
    entries: Mutex<VecDeque<Entry>>,
    /// The HTTP server's metrics, once the router is built around the proxy.
    metrics: OnceLock<Arc<Metrics>>,
}

impl JobLog {
    /// Counts every job pushed from now on in `metrics` too (the first call wins).
    pub fn report_to(&self, metrics: Arc<Metrics>) {
        let _ = self.metrics.set(metrics);
    }

    /// Remembers `job`; `recorded` is the daemon's record of it, if the daemon took it.
    pub fn push(&self, job: &ExternalJob, recorded: Option<JobRecord>) {
        if let Some(metrics) = self.metrics.get() {
            metrics.record_forwarded(job);
        }
        let in_daemon = recorded.is_some();
        // Job 0: never numbered by a daemon. The client is this process.
        let record = recorded.unwrap_or_else(|| {
            job.to_record(0, Some(std::process::id()), Some(crate::current_uid()))
        });
        let entry = Entry {
            record,
            in_daemon,
            upstream: job.upstream.clone(),
            counts: job.counts,
            decode_clock: job.decode_clock,
            http_status: job.http_status,
        };
        let mut entries = self.entries.lock().unwrap_or_else(|e| e.into_inner());
        if entries.len() >= KEEP_JOBS {
            entries.pop_front();
        }
        entries.push_back(entry);
    }

    /// The daemon's jobs (`None`: the daemon is unreachable) with the forwarded ones
    /// annotated, plus forwarded jobs the daemon never saw; newest first, at most
    /// `limit`.
    pub fn merge(&self, daemon: Option<Vec<JobEntry>>, limit: usize) -> Vec<JobView> {
        let entries = self.entries.lock().unwrap_or_else(|e| e.into_inner());
        let mut views: Vec<JobView> = match daemon {
            Some(records) => {
                let mut views: Vec<JobView> = records
                    .into_iter()
                    .map(|job| match entries.iter().find(|e| e.is(&job.record)) {
                        Some(entry) => entry.view(job.record),
                        None => plain(job),
                    })
                    .collect();
                views.extend(
                    entries
                        .iter()
                        .filter(|e| !e.in_daemon)
                        .map(|e| e.view(e.record.clone())),
                );
                views
            }
            None => entries.iter().map(|e| e.view(e.record.clone())).collect(),
        };
        drop(entries);
        // Stable: the daemon's own order stands among equal times.
        views.sort_by_key(|v| std::cmp::Reverse(v.record.finished_unix_ms));
        views.truncate(limit);
        views
    }
}

/// A job of the daemon's own, as it listed it.
fn plain(job: JobEntry) -> JobView {
    JobView {
        record: job.record,
        cached_tokens: job.cached_tokens,
        upstream: None,
        counts: None,
        decode_clock: None,
        http_status: None,
        recorded_by_daemon: None,
    }
}

/// Reports each finished forwarded job to the daemon and remembers it. Runs until every
/// tap and the proxy are gone.
pub async fn record_jobs(
    mut jobs: UnboundedReceiver<ExternalJob>,
    backend: Arc<dyn Backend>,
    log: Arc<JobLog>,
) {
    while let Some(job) = jobs.recv().await {
        // A daemon that is down (or too old) does not stop the proxy: the job stays here.
        let recorded = backend.record_job(job.clone()).await.ok();
        log.push(&job, recorded);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::protocol::{FinishReason, Timings, Usage};

    fn external(request_id: u64, finished: u64) -> ExternalJob {
        ExternalJob {
            engine: "llama".into(),
            upstream: "http://127.0.0.1:8091".into(),
            model: "m".into(),
            request_id,
            started_unix_ms: finished - 10,
            finished_unix_ms: finished,
            usage: Usage {
                prompt_tokens: 1,
                completion_tokens: 2,
            },
            timings: Timings::default(),
            finish_reason: FinishReason::Stop,
            counts: CountSource::Reported,
            decode_clock: DecodeClock::Stream,
            http_status: 200,
        }
    }

    /// A job the daemon ran itself, 12 of its prompt tokens from the cache.
    fn own(job: u64, finished: u64) -> JobEntry {
        JobEntry {
            record: JobRecord {
                engine: "sparkd".into(),
                ..external(job, finished).to_record(job, None, None)
            },
            cached_tokens: Some(12),
        }
    }

    #[test]
    fn merge_annotates_forwarded_jobs_and_adds_those_the_daemon_missed() {
        let log = JobLog::default();
        let taken = external(1, 100);
        let taken_record = taken.to_record(7, Some(1), Some(2));
        log.push(&taken, Some(taken_record.clone()));
        log.push(&external(2, 300), None);
        // The daemon's list: its own job 8 and the forwarded job 7, newest first.
        let daemon = vec![own(8, 200), taken_record.clone().into()];
        let merged = log.merge(Some(daemon), 10);
        let order: Vec<(u64, &str)> = merged
            .iter()
            .map(|v| (v.record.finished_unix_ms, v.record.engine.as_str()))
            .collect();
        assert_eq!(order, [(300, "llama"), (200, "sparkd"), (100, "llama")]);
        assert_eq!(merged[0].recorded_by_daemon, Some(false));
        assert_eq!(merged[0].record.job, 0);
        assert_eq!(
            (merged[1].upstream.as_ref(), merged[1].cached_tokens),
            (None, Some(12))
        );
        assert_eq!(merged[2].cached_tokens, None);
        assert_eq!(merged[2].record, taken_record);
        assert_eq!(merged[2].decode_clock, Some(DecodeClock::Stream));
        assert_eq!(merged[2].recorded_by_daemon, Some(true));
        assert_eq!(log.merge(Some(vec![own(8, 200)]), 1).len(), 1);
    }

    #[test]
    fn without_the_daemon_the_proxys_own_jobs_remain() {
        let log = JobLog::default();
        for n in 0..(KEEP_JOBS as u64 + 5) {
            log.push(&external(n, 1_000 + n), None);
        }
        let merged = log.merge(None, 1_000);
        assert_eq!(merged.len(), KEEP_JOBS);
        assert_eq!(merged[0].record.request_id, KEEP_JOBS as u64 + 4);
        // A record from another daemon life with the same number is not annotated.
        let stranger = JobRecord {
            started_unix_ms: 1,
            ..external(3, 50).to_record(0, None, None)
        };
        let merged = log.merge(Some(vec![stranger.into()]), 1_000);
        assert!(merged
            .iter()
            .any(|v| v.record.started_unix_ms == 1 && v.upstream.is_none()));
    }

    #[test]
    fn views_serialise_flat_with_the_extras_only_when_known() {
        let log = JobLog::default();
        log.push(&external(1, 100), None);
        let forwarded = serde_json::to_value(&log.merge(None, 1)[0]).unwrap();
        assert_eq!(forwarded["engine"], "llama");
        assert_eq!(forwarded["upstream"], "http://127.0.0.1:8091");
        assert_eq!(forwarded["decode_clock"], "Stream");
        assert_eq!(forwarded["usage"]["completion_tokens"], 2);
        assert!(forwarded["cached_tokens"].is_null());
        let own = serde_json::to_value(plain(own(1, 100))).unwrap();
        assert!(own.get("upstream").is_none() && own.get("decode_clock").is_none());
        assert_eq!(own["cached_tokens"], 12);
    }
}
