//! A round of requests over the daemon's socket: concurrent clients, each on its own raw
//! connection, running the planned requests one after another; then the checks.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use spark_client::protocol::{
    ClientMessage, DoneEvent, ErrorEvent, ErrorKind, FinishReason, JobRecord, PrefillEvent,
    ServerMessage, TokenBytesEvent,
};

use super::conn::Conn;
use super::plan::{Action, Planned};
use super::report::{Check, Percentiles, RoundReport};

/// How a request ended, as its client saw it.
#[derive(Debug, Clone)]
pub enum Ending {
    Done(DoneEvent),
    /// An engine failure: its `Error`, then its `Done`.
    Failed {
        error: ErrorEvent,
        done: DoneEvent,
    },
    /// Refused before it started: an `Error` and no `Done`.
    Rejected(ErrorEvent),
    /// The client dropped the connection, as planned.
    HungUp,
    /// The connection broke or went silent: the request never got its ending.
    Broken(String),
}

#[derive(Debug, Clone)]
pub struct Outcome {
    pub id: u64,
    pub action: Action,
    pub max_tokens: u32,
    /// Token frames received.
    pub tokens: u32,
    /// Request sent to first token received.
    pub ttft: Option<Duration>,
    pub ending: Ending,
    /// Frames that broke the protocol's rules for this request.
    pub violations: Vec<String>,
}

/// Runs `plans` over `clients` concurrent connections; returns each request's outcome
/// (in id order), stray frames seen by the end-of-run barriers, and the wall time.
pub async fn run_round(
    socket: &Path,
    clients: usize,
    plans: Vec<Planned>,
    timeout: Duration,
) -> (Vec<Outcome>, Vec<String>, Duration) {
    let plans = Arc::new(plans);
    let next = Arc::new(AtomicUsize::new(0));
    let started = Instant::now();
    let workers: Vec<_> = (0..clients.max(1))
        .map(|worker| {
            let plans = Arc::clone(&plans);
            let next = Arc::clone(&next);
            let socket = socket.to_path_buf();
            tokio::spawn(async move { run_worker(worker, socket, plans, next, timeout).await })
        })
        .collect();
    let mut outcomes = Vec::new();
    let mut stray = Vec::new();
    for w in workers {
        match w.await {
            Ok((o, s)) => {
                outcomes.extend(o);
                stray.extend(s);
            }
            Err(e) => stray.push(format!("a client task failed: {e}")),
        }
    }
    let elapsed = started.elapsed();
    outcomes.sort_by_key(|o| o.id);
    (outcomes, stray, elapsed)
}

async fn run_worker(
    worker: usize,
    socket: PathBuf,
    plans: Arc<Vec<Planned>>,
    next: Arc<AtomicUsize>,
    timeout: Duration,
) -> (Vec<Outcome>, Vec<String>) {
    let mut conn: Option<Conn> = None;
    let mut outcomes = Vec::new();
    loop {
        let i = next.fetch_add(1, Ordering::Relaxed);
        let Some(plan) = plans.get(i) else { break };
        outcomes.push(run_one(&socket, &mut conn, plan, timeout).await);
    }
    // Barrier: a query answered on the connection after every request ended. Anything
    // else arriving first is a frame the daemon should not have sent (a second `Done`...).
    let mut stray = Vec::new();
    if let Some(mut c) = conn {
        let id = u64::MAX - worker as u64;
        if let Err(e) = c.send(ClientMessage::Status { id }).await {
            stray.push(format!("client {worker}: barrier: {e}"));
        } else {
            loop {
                match c.recv(timeout).await {
                    Ok(ServerMessage::Status { id: got, .. }) if got == id => break,
                    Ok(other) => stray.push(format!("client {worker}: stray frame {other:?}")),
                    Err(e) => {
                        stray.push(format!("client {worker}: barrier: {e}"));
                        break;
                    }
                }
            }
        }
    }
    (outcomes, stray)
}

async fn run_one(
    socket: &Path,
    slot: &mut Option<Conn>,
    plan: &Planned,
    timeout: Duration,
) -> Outcome {
    let req = &plan.request;
    let mut outcome = Outcome {
        id: req.id,
        action: plan.action,
        max_tokens: req.max_tokens.unwrap_or(u32::MAX),
        tokens: 0,
        ttft: None,
        ending: Ending::HungUp,
        violations: Vec::new(),
    };
    if slot.is_none() {
        match Conn::connect(socket, timeout).await {
            Ok(c) => *slot = Some(c),
            Err(e) => {
                outcome.ending = Ending::Broken(format!("connect: {e}"));
                return outcome;
            }
        }
    }
    let Some(conn) = slot.as_mut() else {
        unreachable!("connected just above")
    };
    let sent = Instant::now();
    let mut result = conn.send(ClientMessage::Generate(req.clone())).await;
    match plan.action {
        Action::Cancel { after: 0 } if result.is_ok() => {
            result = conn.send(ClientMessage::Cancel { id: req.id }).await;
        }
        Action::Disconnect { after: 0 } => {
            *slot = None;
            return outcome;
        }
        _ => {}
    }
    if let Err(e) = result {
        *slot = None;
        outcome.ending = Ending::Broken(format!("send: {e}"));
        return outcome;
    }
    let mut engine_error: Option<ErrorEvent> = None;
    let mut prefill: Option<PrefillEvent> = None;
    // The raw bytes of the next token (logprobs requests: the harness speaks 1.11+).
    let mut token_bytes: Option<TokenBytesEvent> = None;
    loop {
        let frame = match conn.recv(timeout).await {
            Ok(frame) => frame,
            Err(e) => {
                *slot = None;
                outcome.ending = Ending::Broken(e.to_string());
                return outcome;
            }
        };
        match frame {
            ServerMessage::Prefilled(p) if p.id == req.id => {
                if prefill.is_some() || outcome.tokens > 0 {
                    outcome
                        .violations
                        .push(format!("Prefilled not once before the first token: {p:?}"));
                }
                if p.cached_tokens >= p.prompt_tokens {
                    outcome
                        .violations
                        .push(format!("more of the prompt cached than it has: {p:?}"));
                }
                prefill = Some(p);
            }
            ServerMessage::TokenBytes(b) if b.id == req.id => {
                let alternatives = req.logprobs.map(usize::from);
                if alternatives != Some(b.top.len()) {
                    outcome.violations.push(format!(
                        "TokenBytes with {} alternatives for a request with logprobs {:?}",
                        b.top.len(),
                        req.logprobs
                    ));
                }
                if token_bytes.replace(b).is_some() {
                    outcome
                        .violations
                        .push("two TokenBytes before a token".into());
                }
            }
            ServerMessage::Token(t) if t.id == req.id => {
                if prefill.is_none() {
                    outcome.violations.push("a token before Prefilled".into());
                }
                if token_bytes.take().is_some() != req.logprobs.is_some() {
                    outcome.violations.push(format!(
                        "a token with logprobs {:?} {} its TokenBytes",
                        req.logprobs,
                        if req.logprobs.is_some() {
                            "without"
                        } else {
                            "after"
                        }
                    ));
                }
                outcome.tokens += 1;
                outcome.ttft.get_or_insert_with(|| sent.elapsed());
                if engine_error.is_some() {
                    outcome.violations.push("a token after the Error".into());
                }
                let alternatives = t.logprobs.as_ref().map(|l| l.top.len());
                if alternatives != req.logprobs.map(usize::from) {
                    outcome.violations.push(format!(
                        "asked for {:?} alternatives, got {alternatives:?}",
                        req.logprobs
                    ));
                }
                match plan.action {
                    Action::Cancel { after } if after == outcome.tokens => {
                        if let Err(e) = conn.send(ClientMessage::Cancel { id: req.id }).await {
                            *slot = None;
                            outcome.ending = Ending::Broken(format!("cancel: {e}"));
                            return outcome;
                        }
                    }
                    Action::Disconnect { after } if after == outcome.tokens => {
                        *slot = None;
                        return outcome;
                    }
                    _ => {}
                }
            }
            ServerMessage::Error(e) if e.id == Some(req.id) => {
                if e.kind != ErrorKind::Engine {
                    if outcome.tokens > 0 {
                        outcome
                            .violations
                            .push(format!("refused after tokens: {e:?}"));
                    }
                    outcome.ending = Ending::Rejected(e);
                    return outcome;
                }
                if engine_error.is_some() {
                    outcome.violations.push("a second Error".into());
                }
                engine_error = Some(e);
            }
            ServerMessage::Done(done) if done.id == req.id => {
                if let Some(p) = prefill.filter(|p| p.prompt_tokens != done.usage.prompt_tokens) {
                    outcome.violations.push(format!(
                        "Prefilled counted {} prompt tokens, Done {}",
                        p.prompt_tokens, done.usage.prompt_tokens
                    ));
                }
                outcome.ending = match engine_error {
                    Some(error) => Ending::Failed { error, done },
                    None => Ending::Done(done),
                };
                return outcome;
            }
            ServerMessage::Error(e) if e.id.is_none() => {
                *slot = None;
                outcome.ending = Ending::Broken(format!("connection error {e:?}"));
                return outcome;
            }
            other => outcome
                .violations
                .push(format!("unexpected frame {other:?}")),
        }
    }
}

/// Every check that needs only the round's outcomes and the daemon's jobs list.
pub fn check_round(outcomes: &[Outcome], stray: &[String], jobs: &[JobRecord]) -> Vec<Check> {
    vec![
        check_one_ending(outcomes, stray),
        check_refusals(outcomes),
        check_token_counts(outcomes),
        check_jobs(outcomes, jobs),
    ]
}

fn check_one_ending(outcomes: &[Outcome], stray: &[String]) -> Check {
    let mut problems: Vec<String> = stray.to_vec();
    for o in outcomes {
        if let Ending::Broken(why) = &o.ending {
            problems.push(format!("request {}: no ending: {why}", o.id));
        }
        for v in &o.violations {
            problems.push(format!("request {}: {v}", o.id));
        }
        if let Ending::Failed { done, .. } = &o.ending {
            if done.finish_reason != FinishReason::Error {
                problems.push(format!(
                    "request {}: Error then Done({:?})",
                    o.id, done.finish_reason
                ));
            }
        }
    }
    let ended = outcomes
        .iter()
        .filter(|o| !matches!(o.ending, Ending::Broken(_)))
        .count();
    Check::from_problems(
        "exactly one Done or Error per request",
        format!("{ended} of {} requests ended exactly once", outcomes.len()),
        &problems,
    )
}

fn check_refusals(outcomes: &[Outcome]) -> Check {
    // Busy is the daemon protecting itself under load; anything else means a request the
    // daemon should have taken was refused.
    let problems: Vec<String> = outcomes
        .iter()
        .filter_map(|o| match &o.ending {
            Ending::Rejected(e) if e.kind != ErrorKind::Busy => {
                Some(format!("request {}: {:?}: {}", o.id, e.kind, e.message))
            }
            _ => None,
        })
        .collect();
    let busy = outcomes
        .iter()
        .filter(|o| matches!(&o.ending, Ending::Rejected(e) if e.kind == ErrorKind::Busy))
        .count();
    Check::from_problems("no refusals but busy", format!("{busy} busy"), &problems)
}

fn check_token_counts(outcomes: &[Outcome]) -> Check {
    let mut problems = Vec::new();
    let mut checked = 0;
    for o in outcomes {
        let done = match &o.ending {
            Ending::Done(d) | Ending::Failed { done: d, .. } => d,
            _ => continue,
        };
        checked += 1;
        let n = done.usage.completion_tokens;
        if n != o.tokens {
            problems.push(format!(
                "request {}: Done says {n} tokens, client received {}",
                o.id, o.tokens
            ));
        }
        let reason = done.finish_reason;
        let fits = match (o.action, reason) {
            (_, FinishReason::Length) => n == o.max_tokens,
            (_, FinishReason::Stop) => n <= o.max_tokens,
            (Action::Cancel { .. }, FinishReason::Cancelled) => n <= o.max_tokens,
            (_, FinishReason::Error) => matches!(o.ending, Ending::Failed { .. }),
            _ => false,
        };
        if !fits {
            problems.push(format!(
                "request {} ({:?}, max_tokens {}): finish {:?} with {n} tokens",
                o.id, o.action, o.max_tokens, reason
            ));
        }
    }
    Check::from_problems(
        "completion_tokens = tokens received",
        format!("{checked} Done events agree with their streams and finish reasons"),
        &problems,
    )
}

fn check_jobs(outcomes: &[Outcome], jobs: &[JobRecord]) -> Check {
    let mut by_id: HashMap<u64, Vec<&JobRecord>> = HashMap::new();
    for j in jobs {
        by_id.entry(j.request_id).or_default().push(j);
    }
    let mut problems = Vec::new();
    let mut expected = 0;
    let mut disconnected = 0;
    for o in outcomes {
        let found = by_id.remove(&o.id).unwrap_or_default();
        let accepted = !matches!(o.ending, Ending::Rejected(_));
        if !accepted {
            if !found.is_empty() {
                problems.push(format!("request {}: refused, yet in the jobs list", o.id));
            }
            continue;
        }
        expected += 1;
        let [job] = found.as_slice() else {
            problems.push(format!(
                "request {}: {} entries in the jobs list",
                o.id,
                found.len()
            ));
            continue;
        };
        match &o.ending {
            Ending::Done(d) | Ending::Failed { done: d, .. } => {
                if job.usage != d.usage || job.finish_reason != d.finish_reason {
                    problems.push(format!(
                        "request {}: job {:?}/{:?}, Done {:?}/{:?}",
                        o.id, job.usage, job.finish_reason, d.usage, d.finish_reason
                    ));
                }
            }
            Ending::HungUp => {
                // It may have ended on its own before the daemon saw the connection go.
                let fits = match job.finish_reason {
                    FinishReason::Disconnected | FinishReason::Cancelled => {
                        disconnected += 1;
                        true
                    }
                    FinishReason::Length => job.usage.completion_tokens == o.max_tokens,
                    FinishReason::Stop => true,
                    _ => false,
                };
                if !fits || job.usage.completion_tokens < o.tokens {
                    problems.push(format!(
                        "request {} (hung up after {} tokens): job {:?} with {:?}",
                        o.id, o.tokens, job.finish_reason, job.usage
                    ));
                }
            }
            Ending::Rejected(_) | Ending::Broken(_) => {}
        }
    }
    for (id, extra) in by_id {
        problems.push(format!(
            "job(s) for request {id} that this round did not send: {}",
            extra.len()
        ));
    }
    Check::from_problems(
        "jobs list holds every request",
        format!(
            "{expected} accepted requests, each in the jobs list once with its Done's figures \
             ({disconnected} hang-ups recorded as disconnected/cancelled)"
        ),
        &problems,
    )
}

/// The round's figures, from the outcomes.
pub fn summarize(label: &str, outcomes: &[Outcome], elapsed: Duration) -> RoundReport {
    let mut counts: Vec<(String, usize)> = Vec::new();
    let mut bump = |what: String| match counts.iter_mut().find(|(w, _)| *w == what) {
        Some((_, n)) => *n += 1,
        None => counts.push((what, 1)),
    };
    for o in outcomes {
        bump(match &o.ending {
            Ending::Done(d) => d.finish_reason.as_str().to_string(),
            Ending::Failed { .. } => "engine error".into(),
            Ending::Rejected(e) => format!("refused ({:?})", e.kind),
            Ending::HungUp => "hung up".into(),
            Ending::Broken(_) => "BROKEN".into(),
        });
    }
    counts.sort();
    RoundReport {
        label: label.to_string(),
        requests: outcomes.len(),
        elapsed,
        tokens: outcomes.iter().map(|o| u64::from(o.tokens)).sum(),
        endings: counts,
        ttft_client: Percentiles::of_durations(outcomes.iter().filter_map(|o| o.ttft)),
        ttft_engine: Percentiles::of(outcomes.iter().filter_map(|o| match &o.ending {
            Ending::Done(d) => d.timings.ttft_ms,
            _ => None,
        })),
        resident_after: None,
        checks: Vec::new(),
    }
}
