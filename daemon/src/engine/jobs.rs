//! State the engine thread publishes for everyone else: load figures for `Status`, the
//! totals, and the ring of recently finished jobs (counts and timings, never text).

use std::collections::{HashMap, VecDeque};
use std::sync::Mutex;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use spark_client::protocol::{DoneEvent, JobEntry, JobRecord};

use super::sequence::Sequence;

#[derive(Debug, Default, Clone, Copy)]
pub struct Load {
    pub running: usize,
    pub queued: usize,
    pub kv_used: usize,
    pub kv_total: usize,
    pub requests_served: u64,
    pub tokens_generated: u64,
    pub prompt_tokens: u64,
    /// Of `prompt_tokens`, those taken from the prefix cache.
    pub prompt_tokens_reused: u64,
    pub steps: u64,
    pub cache: CacheLoad,
}

/// The prefix cache's figures as of the engine's last pass.
#[derive(Debug, Default, Clone, Copy)]
pub struct CacheLoad {
    pub cached_blocks: usize,
    pub idle_blocks: usize,
    pub evicted_blocks: u64,
}

pub struct Shared {
    model_name: String,
    keep_jobs: usize,
    load: Mutex<Load>,
    jobs: Mutex<VecDeque<JobEntry>>,
    /// When the engine loop last went round; the watchdog's evidence of life.
    heartbeat: Mutex<Instant>,
    /// Requests running or queued per client uid, for the per-user limit.
    per_uid: Mutex<HashMap<u32, usize>>,
}

pub fn unix_ms(t: SystemTime) -> u64 {
    t.duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as u64)
}

impl Shared {
    pub fn new(model_name: String, keep_jobs: usize) -> Self {
        Shared {
            model_name,
            keep_jobs,
            load: Mutex::new(Load::default()),
            jobs: Mutex::new(VecDeque::new()),
            heartbeat: Mutex::new(Instant::now()),
            per_uid: Mutex::new(HashMap::new()),
        }
    }

    pub fn model_name(&self) -> &str {
        &self.model_name
    }

    pub fn load(&self) -> Load {
        *self.load.lock().unwrap_or_else(|e| e.into_inner())
    }

    pub fn heartbeat(&self) -> Instant {
        *self.heartbeat.lock().unwrap_or_else(|e| e.into_inner())
    }

    pub(crate) fn set_load(
        &self,
        running: usize,
        queued: usize,
        kv_used: usize,
        kv_total: usize,
        cache: CacheLoad,
    ) {
        let mut l = self.load.lock().unwrap_or_else(|e| e.into_inner());
        l.running = running;
        l.queued = queued;
        l.kv_used = kv_used;
        l.kv_total = kv_total;
        l.cache = cache;
        drop(l);
        *self.heartbeat.lock().unwrap_or_else(|e| e.into_inner()) = Instant::now();
    }

    pub(crate) fn record_step(&self, _elapsed: Duration) {
        self.load.lock().unwrap_or_else(|e| e.into_inner()).steps += 1;
    }

    pub(crate) fn record_job(&self, s: &Sequence, done: &DoneEvent, model: &str) {
        {
            let mut l = self.load.lock().unwrap_or_else(|e| e.into_inner());
            l.requests_served += 1;
            l.tokens_generated += done.usage.completion_tokens as u64;
            l.prompt_tokens += done.usage.prompt_tokens as u64;
            l.prompt_tokens_reused += s.n_reused as u64;
        }
        let record = JobRecord {
            job: s.job,
            request_id: s.request_id,
            client_pid: s.client.pid,
            client_uid: s.client.uid,
            model: model.to_string(),
            engine: "sparkd".into(),
            started_unix_ms: s.started_unix_ms,
            finished_unix_ms: unix_ms(SystemTime::now()),
            usage: done.usage,
            timings: done.timings,
            finish_reason: done.finish_reason,
            estimated: false,
        };
        // A request that never got in had no prompt read, from the cache or otherwise.
        let cached_tokens = s.timings.admitted.map(|_| s.n_reused as u32);
        self.push_job(JobEntry {
            record,
            cached_tokens,
        });
    }

    /// Books a job another engine served. It counts in the jobs list only: the load
    /// totals are this daemon's own work.
    pub(crate) fn record_external(&self, record: JobRecord) {
        self.push_job(JobEntry::from(record));
    }

    fn push_job(&self, entry: JobEntry) {
        let mut jobs = self.jobs.lock().unwrap_or_else(|e| e.into_inner());
        if jobs.len() >= self.keep_jobs.max(1) {
            jobs.pop_front();
        }
        jobs.push_back(entry);
    }

    /// Counts a new request of `uid` unless it already has `limit` in flight; returns
    /// the count it had when refused.
    pub(crate) fn take_uid_slot(&self, uid: u32, limit: Option<usize>) -> Result<(), usize> {
        let mut map = self.per_uid.lock().unwrap_or_else(|e| e.into_inner());
        let n = map.entry(uid).or_insert(0);
        if limit.is_some_and(|l| *n >= l) {
            return Err(*n);
        }
        *n += 1;
        Ok(())
    }

    pub(crate) fn release_uid_slot(&self, uid: u32) {
        let mut map = self.per_uid.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(n) = map.get_mut(&uid) {
            *n = n.saturating_sub(1);
            if *n == 0 {
                map.remove(&uid);
            }
        }
    }

    /// Most recent first.
    pub fn recent_jobs(&self, limit: usize) -> Vec<JobEntry> {
        let jobs = self.jobs.lock().unwrap_or_else(|e| e.into_inner());
        jobs.iter().rev().take(limit).cloned().collect()
    }
}

#[cfg(test)]
mod tests {
    use spark_client::protocol::{FinishReason, JobRecord, Timings, Usage};

    use super::Shared;

    fn record(job: u64, engine: &str) -> JobRecord {
        JobRecord {
            job,
            request_id: job,
            client_pid: None,
            client_uid: None,
            model: "m".into(),
            engine: engine.into(),
            started_unix_ms: job,
            finished_unix_ms: job,
            usage: Usage {
                prompt_tokens: 5,
                completion_tokens: 7,
            },
            timings: Timings::default(),
            finish_reason: FinishReason::Stop,
            estimated: false,
        }
    }

    #[test]
    fn external_jobs_join_the_ring_but_not_the_daemons_totals() {
        let shared = Shared::new("m".into(), 2);
        for n in 1..=3 {
            shared.record_external(record(n, "ollama"));
        }
        let jobs: Vec<u64> = shared
            .recent_jobs(10)
            .iter()
            .map(|j| j.record.job)
            .collect();
        assert_eq!(
            jobs,
            [3, 2],
            "newest first, the oldest dropped past keep_jobs"
        );
        let load = shared.load();
        assert_eq!(
            (
                load.requests_served,
                load.tokens_generated,
                load.prompt_tokens
            ),
            (0, 0, 0)
        );
    }
}
