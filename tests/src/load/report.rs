//! What a load run measured and which checks passed, and how that is printed.

use std::fmt;
use std::time::Duration;

/// One pass/fail verdict with the evidence behind it.
#[derive(Debug, Clone)]
pub struct Check {
    pub name: String,
    pub passed: bool,
    pub detail: String,
}

impl Check {
    pub fn new(name: impl Into<String>, passed: bool, detail: impl Into<String>) -> Self {
        Self {
            name: name.into(),
            passed,
            detail: detail.into(),
        }
    }

    /// Passes when `problems` is empty; otherwise shows the first few.
    pub fn from_problems(name: &str, ok_detail: String, problems: &[String]) -> Self {
        if problems.is_empty() {
            return Check::new(name, true, ok_detail);
        }
        let shown: Vec<&str> = problems.iter().take(5).map(String::as_str).collect();
        let more = problems.len().saturating_sub(shown.len());
        let mut detail = format!("{} problem(s): {}", problems.len(), shown.join("; "));
        if more > 0 {
            detail.push_str(&format!("; and {more} more"));
        }
        Check::new(name, false, detail)
    }
}

impl fmt::Display for Check {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let verdict = if self.passed { "PASS" } else { "FAIL" };
        write!(f, "  [{verdict}] {}: {}", self.name, self.detail)
    }
}

/// Nearest-rank percentiles of a set of durations, in milliseconds.
#[derive(Debug, Clone, Copy, Default)]
pub struct Percentiles {
    pub count: usize,
    pub p50_ms: f64,
    pub p99_ms: f64,
    pub max_ms: f64,
}

impl Percentiles {
    pub fn of(values: impl IntoIterator<Item = f64>) -> Self {
        let mut v: Vec<f64> = values.into_iter().filter(|x| x.is_finite()).collect();
        if v.is_empty() {
            return Self::default();
        }
        v.sort_by(f64::total_cmp);
        let rank = |q: f64| v[((q * v.len() as f64).ceil() as usize).clamp(1, v.len()) - 1];
        Self {
            count: v.len(),
            p50_ms: rank(0.50),
            p99_ms: rank(0.99),
            max_ms: v[v.len() - 1],
        }
    }

    pub fn of_durations(values: impl IntoIterator<Item = Duration>) -> Self {
        Self::of(values.into_iter().map(|d| d.as_secs_f64() * 1e3))
    }
}

impl fmt::Display for Percentiles {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.count == 0 {
            return f.write_str("n/a");
        }
        write!(
            f,
            "p50 {:.1} ms, p99 {:.1} ms, max {:.1} ms (n={})",
            self.p50_ms, self.p99_ms, self.max_ms, self.count
        )
    }
}

/// One round of requests: its figures and its checks.
#[derive(Debug, Clone, Default)]
pub struct RoundReport {
    pub label: String,
    pub requests: usize,
    pub elapsed: Duration,
    /// Tokens the clients received.
    pub tokens: u64,
    /// How the requests ended, as (what, count).
    pub endings: Vec<(String, usize)>,
    /// Request to first token, as the client measured it.
    pub ttft_client: Percentiles,
    /// The daemon's own `ttft_ms` from each `Done`.
    pub ttft_engine: Percentiles,
    /// Idle resident memory of the daemon after the round.
    pub resident_after: Option<u64>,
    pub checks: Vec<Check>,
}

impl RoundReport {
    pub fn passed(&self) -> bool {
        self.checks.iter().all(|c| c.passed)
    }

    pub fn requests_per_s(&self) -> f64 {
        self.requests as f64 / self.elapsed.as_secs_f64().max(1e-9)
    }

    pub fn tokens_per_s(&self) -> f64 {
        self.tokens as f64 / self.elapsed.as_secs_f64().max(1e-9)
    }
}

impl fmt::Display for RoundReport {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        writeln!(
            f,
            "{}: {} requests in {:.2} s: {:.1} requests/s, {} tokens, {:.0} tokens/s",
            self.label,
            self.requests,
            self.elapsed.as_secs_f64(),
            self.requests_per_s(),
            self.tokens,
            self.tokens_per_s()
        )?;
        let endings: Vec<String> = self
            .endings
            .iter()
            .map(|(what, n)| format!("{what} {n}"))
            .collect();
        writeln!(f, "  endings: {}", endings.join(", "))?;
        writeln!(f, "  TTFT (client): {}", self.ttft_client)?;
        writeln!(f, "  TTFT (daemon): {}", self.ttft_engine)?;
        if let Some(rss) = self.resident_after {
            writeln!(
                f,
                "  daemon resident memory when idle after it: {}",
                mib(rss)
            )?;
        }
        for check in &self.checks {
            writeln!(f, "{check}")?;
        }
        Ok(())
    }
}

pub fn mib(bytes: u64) -> String {
    format!("{:.1} MiB", bytes as f64 / (1 << 20) as f64)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn nearest_rank_percentiles() {
        let p = Percentiles::of((1..=100).map(f64::from));
        assert_eq!(
            (p.p50_ms, p.p99_ms, p.max_ms, p.count),
            (50.0, 99.0, 100.0, 100)
        );
        let one = Percentiles::of([7.0]);
        assert_eq!((one.p50_ms, one.p99_ms), (7.0, 7.0));
        assert_eq!(Percentiles::of([]).count, 0);
    }

    #[test]
    fn a_check_with_problems_fails_and_shows_a_few() {
        let problems: Vec<String> = (0..8).map(|i| format!("p{i}")).collect();
        let c = Check::from_problems("x", "fine".into(), &problems);
        assert!(!c.passed);
        assert!(c.detail.contains("8 problem(s)") && c.detail.contains("and 3 more"));
        assert!(Check::from_problems("x", "fine".into(), &[]).passed);
    }
}
