//! The load harness behind `sparkd-load` and `tests/load.rs`: many concurrent clients
//! with random requests, some cancelled or hung up on, then checks that every request
//! was accounted for and that the daemon went back to idle (no running or queued work,
//! every KV block free, resident memory back to its level after a warm-up).
//!
//! Why a warm-up: the first burst of load grows the allocator's arenas and the engine's
//! workspace to their high-water mark, and they keep that memory for reuse. Comparing
//! against the cold daemon would call that one-off growth a leak; comparing against the
//! idle level after a warm-up run at the same concurrency shows growth that the later
//! requests themselves leave behind, which is what a leak looks like.

pub mod conn;
pub mod plan;
pub mod report;
pub mod shim;
pub mod socket;

use std::path::Path;
use std::time::{Duration, Instant};

use anyhow::Context;
use spark_client::protocol::{JobRecord, StatusReport};
use spark_client::Client;

use self::plan::PlanShape;
use self::report::{mib, Check, RoundReport};

/// What to run.
#[derive(Debug, Clone)]
pub struct LoadOptions {
    pub clients: usize,
    /// Requests per round.
    pub requests: usize,
    pub shape: PlanShape,
    pub seed: u64,
    /// Warm-up rounds of `requests` each (0: none, and no memory check). The first also
    /// fills the daemon's jobs list when `--keep-jobs` is `requests`, so that the list
    /// weighs the same in the baseline as after every later round.
    pub warmup_rounds: usize,
    /// Soak: repeat rounds until this much time has passed.
    pub duration: Option<Duration>,
    /// Longest wait for any one frame before a request counts as hung.
    pub frame_timeout: Duration,
    /// Allowed growth of idle resident memory after a round over its level after the
    /// warm-up: the larger of this fraction of the baseline and `memory_slack` bytes.
    pub memory_tolerance: f64,
    /// The allocator keeps freed memory in its arenas in chunks of about a megabyte, so
    /// on a small daemon (the synthetic model: ~15 MiB) a round-to-round wobble of
    /// several percent is noise, not a leak.
    pub memory_slack: u64,
}

impl Default for LoadOptions {
    fn default() -> Self {
        Self {
            clients: 64,
            requests: 1000,
            shape: PlanShape::default(),
            seed: 1,
            warmup_rounds: 2,
            duration: None,
            frame_timeout: Duration::from_secs(120),
            memory_tolerance: 0.05,
            memory_slack: 1 << 20,
        }
    }
}

/// Everything a run measured.
#[derive(Debug, Clone, Default)]
pub struct LoadReport {
    pub warmup: Vec<RoundReport>,
    pub rounds: Vec<RoundReport>,
    /// Idle resident memory after the warm-up.
    pub baseline_resident: Option<u64>,
}

impl LoadReport {
    pub fn passed(&self) -> bool {
        self.warmup
            .iter()
            .chain(&self.rounds)
            .all(RoundReport::passed)
    }

    pub fn failed_checks(&self) -> Vec<&Check> {
        self.warmup
            .iter()
            .chain(&self.rounds)
            .flat_map(|r| r.checks.iter().filter(|c| !c.passed))
            .collect()
    }
}

impl std::fmt::Display for LoadReport {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        for r in self.warmup.iter().chain(&self.rounds) {
            write!(f, "{r}")?;
        }
        if let Some(base) = self.baseline_resident {
            writeln!(
                f,
                "memory: idle resident memory after warm-up {} (baseline; see `sparkd-load --help`)",
                mib(base)
            )?;
        }
        let verdict = if self.passed() { "PASS" } else { "FAIL" };
        write!(f, "result: {verdict}")
    }
}

/// Runs the socket load against the daemon on `socket`. `progress` is told about each
/// round as it finishes.
pub async fn run_socket_load(
    socket: &Path,
    opts: &LoadOptions,
    mut progress: impl FnMut(&RoundReport),
) -> anyhow::Result<LoadReport> {
    let control = Client::connect(socket)
        .await
        .context("connecting the control client")?;
    let mut report = LoadReport::default();
    let mut next_id = 1u64;
    let mut round_no = 0;
    for n in 1..=opts.warmup_rounds {
        round_no += 1;
        let label = format!("warm-up {n}");
        let round = socket_round(
            socket,
            &control,
            opts,
            &label,
            next_id,
            opts.requests,
            round_no,
        )
        .await?;
        next_id += opts.requests as u64;
        report.baseline_resident = round.resident_after;
        progress(&round);
        report.warmup.push(round);
    }
    let started = Instant::now();
    loop {
        round_no += 1;
        let label = if opts.duration.is_some() {
            format!("round {}", report.rounds.len() + 1)
        } else {
            "load".to_string()
        };
        let mut round = socket_round(
            socket,
            &control,
            opts,
            &label,
            next_id,
            opts.requests,
            round_no,
        )
        .await?;
        next_id += opts.requests as u64;
        if let (Some(base), Some(now)) = (report.baseline_resident, round.resident_after) {
            round.checks.push(memory_check(
                base,
                now,
                opts.memory_tolerance,
                opts.memory_slack,
            ));
        }
        progress(&round);
        report.rounds.push(round);
        match opts.duration {
            Some(d) if started.elapsed() < d => continue,
            _ => break,
        }
    }
    Ok(report)
}

#[allow(clippy::too_many_arguments)]
async fn socket_round(
    socket: &Path,
    control: &Client,
    opts: &LoadOptions,
    label: &str,
    first_id: u64,
    count: usize,
    round_no: u64,
) -> anyhow::Result<RoundReport> {
    let plans = plan::plan(
        opts.seed.wrapping_add(round_no),
        first_id,
        count,
        &opts.shape,
    );
    let (outcomes, stray, elapsed) =
        socket::run_round(socket, opts.clients, plans, opts.frame_timeout).await;
    let mut report = socket::summarize(label, &outcomes, elapsed);
    let (idle, status) = wait_idle(control, Duration::from_secs(30)).await?;
    let jobs = round_jobs(control, first_id, count).await?;
    report.checks = socket::check_round(&outcomes, &stray, &jobs);
    report.checks.push(idle);
    report.resident_after = Some(status.resident_bytes);
    Ok(report)
}

/// The jobs of this process with request ids in `first_id..first_id + count`.
async fn round_jobs(
    control: &Client,
    first_id: u64,
    count: usize,
) -> anyhow::Result<Vec<JobRecord>> {
    // Newest first, so a limit a little above the round size covers it when nothing
    // else ran in between; queries from other clients would only push it further back.
    let limit = u32::try_from(count * 2 + 64).unwrap_or(u32::MAX);
    let me = std::process::id();
    let ids = first_id..first_id + count as u64;
    Ok(control
        .jobs(limit)
        .await
        .context("listing jobs")?
        .into_iter()
        .filter(|j| j.client_pid == Some(me) && ids.contains(&j.request_id))
        .collect())
}

/// Waits until nothing runs or waits and every KV block is free; the check says whether
/// that happened within `limit`.
pub async fn wait_idle(control: &Client, limit: Duration) -> anyhow::Result<(Check, StatusReport)> {
    let start = Instant::now();
    loop {
        let s = control.status().await.context("status")?;
        let idle = s.running == 0 && s.queued == 0 && s.kv_blocks_used == 0;
        if idle || start.elapsed() > limit {
            let detail = format!(
                "running {}, queued {}, KV blocks used {} of {} ({:.2} s after the last request)",
                s.running,
                s.queued,
                s.kv_blocks_used,
                s.kv_blocks_total,
                start.elapsed().as_secs_f64()
            );
            return Ok((Check::new("idle, every KV block free", idle, detail), s));
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// Only growth fails: memory given back is not a leak.
fn memory_check(baseline: u64, now: u64, tolerance: f64, slack: u64) -> Check {
    let change = (now as f64 - baseline as f64) / (baseline as f64).max(1.0);
    let allowed = (baseline as f64 * tolerance).max(slack as f64);
    Check::new(
        format!(
            "resident memory back within max({:.0}%, {}) of post-warm-up",
            tolerance * 100.0,
            mib(slack)
        ),
        now as f64 - baseline as f64 <= allowed,
        format!(
            "{} -> {} ({:+.2}%)",
            mib(baseline),
            mib(now),
            change * 100.0
        ),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn memory_check_fails_only_on_growth_past_both_allowances() {
        let mb = 1u64 << 20;
        assert!(memory_check(100 * mb, 104 * mb, 0.05, mb).passed);
        assert!(!memory_check(100 * mb, 106 * mb, 0.05, mb).passed);
        assert!(
            memory_check(100 * mb, 50 * mb, 0.05, mb).passed,
            "shrinking is fine"
        );
        assert!(
            memory_check(10 * mb, 10 * mb + mb / 2, 0.05, mb).passed,
            "within the slack"
        );
        assert!(!memory_check(10 * mb, 12 * mb, 0.05, mb).passed);
    }
}
