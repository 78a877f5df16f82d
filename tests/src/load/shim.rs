//! A round of requests through the OpenAI shim: concurrent HTTP clients on both
//! endpoints, streaming and not, some hanging up mid-stream; then the checks (every
//! response complete and consistent with its usage, the jobs list accounts for every
//! request, hang-ups recorded as cancelled, the daemon idle with its KV cache free).

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use anyhow::{anyhow, bail, Context};
use futures::StreamExt;
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use serde_json::{json, Value};
use spark_client::protocol::FinishReason;
use spark_client::Client;

use super::report::{Check, Percentiles, RoundReport};
use super::wait_idle;

#[derive(Debug, Clone)]
pub struct ShimLoadOptions {
    pub clients: usize,
    pub requests: usize,
    /// Streams the client hangs up on after a few events.
    pub drop_fraction: f64,
    pub seed: u64,
    pub max_tokens: u32,
    /// Longest wait for a response or for the next piece of a stream.
    pub timeout: Duration,
    /// The shim's process id: its jobs are the ones with this client pid.
    pub shim_pid: u32,
}

#[derive(Debug, Clone)]
struct HttpPlan {
    chat: bool,
    stream: bool,
    include_usage: bool,
    logprobs: bool,
    max_tokens: Option<u32>,
    /// Hang up after this many SSE events.
    drop_after: Option<usize>,
    body: Value,
}

fn plans(opts: &ShimLoadOptions) -> Vec<HttpPlan> {
    let mut rng = StdRng::seed_from_u64(opts.seed);
    (0..opts.requests)
        .map(|i| {
            let chat = rng.gen_bool(0.5);
            let drop_after = rng
                .gen_bool(opts.drop_fraction.clamp(0.0, 1.0))
                .then(|| rng.gen_range(1..=4));
            let stream = drop_after.is_some() || rng.gen_bool(0.5);
            let include_usage = stream && rng.gen_bool(0.8);
            let logprobs = rng.gen_bool(0.5);
            // A stream that will be dropped gets no limit, so it is still generating
            // when the client goes.
            let max_tokens = drop_after
                .is_none()
                .then(|| rng.gen_range(1..=opts.max_tokens.max(1)));
            let words = rng.gen_range(1..=30);
            let text = (0..words)
                .map(|w| ["load", "through", "the", "shim", "é", "δ"][(w + i) % 6])
                .collect::<Vec<_>>()
                .join(" ");
            let temperature = if rng.gen_bool(0.5) { 0.0 } else { 0.8 };
            let mut body = if chat {
                json!({"messages": [{"role": "user", "content": text}]})
            } else {
                json!({"prompt": text})
            };
            let obj = body.as_object_mut().expect("object");
            obj.insert("temperature".into(), json!(temperature));
            obj.insert("seed".into(), json!(rng.gen::<u32>()));
            obj.insert("stream".into(), json!(stream));
            if let Some(m) = max_tokens {
                obj.insert("max_tokens".into(), json!(m));
            }
            if include_usage {
                obj.insert("stream_options".into(), json!({"include_usage": true}));
            }
            if logprobs {
                if chat {
                    obj.insert("logprobs".into(), json!(true));
                    obj.insert("top_logprobs".into(), json!(2));
                } else {
                    obj.insert("logprobs".into(), json!(2));
                }
            }
            HttpPlan {
                chat,
                stream,
                include_usage,
                logprobs,
                max_tokens,
                drop_after,
                body,
            }
        })
        .collect()
}

/// How one HTTP request went.
#[derive(Debug, Clone)]
enum HttpOutcome {
    /// A whole response whose parts agree; `tokens` is its usage's completion tokens.
    Complete {
        tokens: u64,
        ttft: Option<Duration>,
    },
    /// The client hung up; `finished` when the finish chunk had already arrived.
    Dropped {
        finished: bool,
    },
    Failed(String),
}

pub async fn run_shim_round(
    base_url: &str,
    control: &Client,
    opts: &ShimLoadOptions,
) -> anyhow::Result<RoundReport> {
    let plans = Arc::new(plans(opts));
    let next = Arc::new(AtomicUsize::new(0));
    let round_start_ms = unix_ms().saturating_sub(1);
    let started = Instant::now();
    let workers: Vec<_> = (0..opts.clients.max(1))
        .map(|_| {
            let plans = Arc::clone(&plans);
            let next = Arc::clone(&next);
            let base = base_url.to_string();
            let timeout = opts.timeout;
            tokio::spawn(async move {
                // One client (and connection pool) per simulated user.
                let http = reqwest::Client::builder()
                    .no_proxy()
                    .build()
                    .map_err(|e| anyhow!("HTTP client: {e}"))?;
                let mut outcomes = Vec::new();
                loop {
                    let i = next.fetch_add(1, Ordering::Relaxed);
                    let Some(plan) = plans.get(i) else { break };
                    let outcome = match run_one(&http, &base, plan, timeout).await {
                        Ok(o) => o,
                        Err(e) => HttpOutcome::Failed(format!("request {i}: {e:#}")),
                    };
                    outcomes.push(outcome);
                }
                anyhow::Ok(outcomes)
            })
        })
        .collect();
    let mut outcomes = Vec::new();
    for w in workers {
        outcomes.extend(w.await.context("HTTP client task")??);
    }
    let elapsed = started.elapsed();

    let (idle, _) = wait_idle(control, Duration::from_secs(30)).await?;
    let jobs: Vec<_> = control
        .jobs(u32::try_from(opts.requests * 2 + 64).unwrap_or(u32::MAX))
        .await
        .context("listing jobs")?
        .into_iter()
        .filter(|j| j.client_pid == Some(opts.shim_pid) && j.started_unix_ms >= round_start_ms)
        .collect();

    let failures: Vec<String> = outcomes
        .iter()
        .filter_map(|o| match o {
            HttpOutcome::Failed(why) => Some(why.clone()),
            _ => None,
        })
        .collect();
    let complete = outcomes
        .iter()
        .filter(|o| matches!(o, HttpOutcome::Complete { .. }))
        .count();
    let dropped_mid = outcomes
        .iter()
        .filter(|o| matches!(o, HttpOutcome::Dropped { finished: false }))
        .count();
    let dropped_late = outcomes
        .iter()
        .filter(|o| matches!(o, HttpOutcome::Dropped { finished: true }))
        .count();
    let cancelled_jobs = jobs
        .iter()
        .filter(|j| {
            matches!(
                j.finish_reason,
                FinishReason::Cancelled | FinishReason::Disconnected
            )
        })
        .count();
    let ended_jobs = jobs
        .iter()
        .filter(|j| matches!(j.finish_reason, FinishReason::Stop | FinishReason::Length))
        .count();
    let other_jobs = jobs.len() - cancelled_jobs - ended_jobs;

    let mut report = RoundReport {
        label: "shim".into(),
        requests: outcomes.len(),
        elapsed,
        tokens: jobs
            .iter()
            .map(|j| u64::from(j.usage.completion_tokens))
            .sum(),
        endings: vec![
            ("complete".into(), complete),
            ("hung up mid-stream".into(), dropped_mid),
            ("hung up after the finish".into(), dropped_late),
            ("FAILED".into(), failures.len()),
        ],
        ttft_client: Percentiles::of_durations(outcomes.iter().filter_map(|o| match o {
            HttpOutcome::Complete { ttft, .. } => *ttft,
            _ => None,
        })),
        ttft_engine: Percentiles::of(jobs.iter().filter_map(|j| j.timings.ttft_ms)),
        resident_after: None,
        checks: Vec::new(),
    };
    let tokens: u64 = outcomes
        .iter()
        .map(|o| match o {
            HttpOutcome::Complete { tokens, .. } => *tokens,
            _ => 0,
        })
        .sum();
    report.checks.push(Check::from_problems(
        "every response that was read is complete and agrees with its usage",
        format!("{complete} responses, {tokens} completion tokens"),
        &failures,
    ));
    // Each request is one job. Only a stream dropped mid-way may be cancelled (unless
    // the daemon finished it before it noticed), and every response read to its end is
    // a normal ending.
    let accounted = jobs.len() == outcomes.len()
        && other_jobs == 0
        && cancelled_jobs <= dropped_mid
        && ended_jobs >= complete + dropped_late;
    report.checks.push(Check::new(
        "jobs list accounts for every request; hang-ups cancelled",
        accounted,
        format!(
            "{} jobs for {} requests: {ended_jobs} stop/length, {cancelled_jobs} cancelled/disconnected \
             (of {dropped_mid} hung up mid-stream), {other_jobs} other",
            jobs.len(),
            outcomes.len()
        ),
    ));
    report.checks.push(idle);
    Ok(report)
}

async fn run_one(
    http: &reqwest::Client,
    base: &str,
    plan: &HttpPlan,
    timeout: Duration,
) -> anyhow::Result<HttpOutcome> {
    let path = if plan.chat {
        "/v1/chat/completions"
    } else {
        "/v1/completions"
    };
    let sent = Instant::now();
    let response = tokio::time::timeout(
        timeout,
        http.post(format!("{base}{path}")).json(&plan.body).send(),
    )
    .await
    .map_err(|_| anyhow!("no response within {timeout:?}"))??;
    let status = response.status();
    if !status.is_success() {
        let text = response.text().await.unwrap_or_default();
        bail!("HTTP {status}: {text}");
    }
    if !plan.stream {
        let body: Value = tokio::time::timeout(timeout, response.json())
            .await
            .map_err(|_| anyhow!("body not complete within {timeout:?}"))??;
        let tokens = check_whole(plan, &body)?;
        return Ok(HttpOutcome::Complete { tokens, ttft: None });
    }

    let mut bytes = response.bytes_stream();
    // Bytes, not text: a chunk boundary may fall inside a character.
    let mut buffer: Vec<u8> = Vec::new();
    let mut events: Vec<String> = Vec::new();
    let mut ttft = None;
    loop {
        if let Some(after) = plan.drop_after {
            if events.len() >= after {
                let finished = events.iter().any(|e| has_finish(e));
                // Dropping `bytes` here closes the connection mid-stream.
                return Ok(HttpOutcome::Dropped { finished });
            }
        }
        let chunk = match tokio::time::timeout(timeout, bytes.next()).await {
            Err(_) => bail!(
                "stream stalled for {timeout:?} after {} events",
                events.len()
            ),
            Ok(None) => break,
            Ok(Some(chunk)) => chunk?,
        };
        buffer.extend_from_slice(&chunk);
        while let Some(end) = buffer.windows(2).position(|w| w == b"\n\n") {
            let raw: Vec<u8> = buffer.drain(..end + 2).collect();
            let text = std::str::from_utf8(&raw).context("an SSE event is not UTF-8")?;
            let event = text
                .lines()
                .filter_map(|l| l.strip_prefix("data:").map(str::trim_start))
                .collect::<Vec<_>>()
                .join("\n");
            if !event.is_empty() {
                // Chat streams open with a role chunk; the first token comes after it.
                if ttft.is_none() && events.len() == usize::from(plan.chat) {
                    ttft = Some(sent.elapsed());
                }
                events.push(event);
            }
        }
    }
    let tokens = check_stream(plan, &events)?;
    Ok(HttpOutcome::Complete { tokens, ttft })
}

fn has_finish(event: &str) -> bool {
    serde_json::from_str::<Value>(event)
        .ok()
        .and_then(|v| v.pointer("/choices/0/finish_reason").cloned())
        .is_some_and(|f| !f.is_null())
}

fn finish_agrees(plan: &HttpPlan, finish: &str, tokens: u64) -> anyhow::Result<()> {
    let max = plan.max_tokens.map(u64::from);
    match (finish, max) {
        ("length", Some(m)) if tokens == m => Ok(()),
        ("stop", Some(m)) if tokens <= m => Ok(()),
        ("stop" | "length", None) => Ok(()),
        _ => bail!("finish_reason {finish} with {tokens} tokens, max_tokens {max:?}"),
    }
}

/// Counts logprob entries in a response's or a chunk's first choice.
fn logprob_entries(plan: &HttpPlan, choice: &Value) -> usize {
    let pointer = if plan.chat {
        "/logprobs/content"
    } else {
        "/logprobs/tokens"
    };
    choice
        .pointer(pointer)
        .and_then(Value::as_array)
        .map_or(0, Vec::len)
}

/// A non-streamed answer: one choice, a finish reason, usage that adds up.
fn check_whole(plan: &HttpPlan, body: &Value) -> anyhow::Result<u64> {
    let choice = body
        .pointer("/choices/0")
        .ok_or_else(|| anyhow!("no choice: {body}"))?;
    let usage = body
        .get("usage")
        .ok_or_else(|| anyhow!("no usage: {body}"))?;
    let tokens = usage_tokens(usage)?;
    let finish = choice
        .get("finish_reason")
        .and_then(Value::as_str)
        .ok_or_else(|| anyhow!("no finish_reason: {body}"))?;
    finish_agrees(plan, finish, tokens)?;
    let text = if plan.chat {
        choice.pointer("/message/content")
    } else {
        choice.get("text")
    };
    let Some(text) = text.and_then(Value::as_str) else {
        bail!("no text: {body}");
    };
    if plan.logprobs && logprob_entries(plan, choice) as u64 != tokens {
        bail!(
            "{} logprob entries for {tokens} completion tokens",
            logprob_entries(plan, choice)
        );
    }
    if plan.logprobs && plan.chat {
        // Each entry's bytes are its token's own: end to end they are what the model
        // wrote, which the content begins with (decoded as the daemon decodes it).
        let bytes: Vec<u8> = (choice
            .pointer("/logprobs/content")
            .and_then(Value::as_array))
        .into_iter()
        .flatten()
        .filter_map(|entry| entry.get("bytes").and_then(Value::as_array))
        .flatten()
        .filter_map(|b| b.as_u64().and_then(|b| u8::try_from(b).ok()))
        .collect();
        let spelled = String::from_utf8_lossy(&bytes);
        if !spelled.starts_with(text) {
            bail!("the logprobs' bytes spell {spelled:?}, the content is {text:?}");
        }
    }
    Ok(tokens)
}

fn usage_tokens(usage: &Value) -> anyhow::Result<u64> {
    let field = |name: &str| {
        usage
            .get(name)
            .and_then(Value::as_u64)
            .ok_or_else(|| anyhow!("usage without {name}: {usage}"))
    };
    let (prompt, completion, total) = (
        field("prompt_tokens")?,
        field("completion_tokens")?,
        field("total_tokens")?,
    );
    if prompt + completion != total {
        bail!("usage does not add up: {usage}");
    }
    Ok(completion)
}

/// A streamed answer: chunks, one finish, the usage chunk when asked for, `[DONE]` last.
fn check_stream(plan: &HttpPlan, events: &[String]) -> anyhow::Result<u64> {
    let Some((last, chunks)) = events.split_last() else {
        bail!("empty stream");
    };
    if last != "[DONE]" {
        bail!("the stream does not end with [DONE]: {last}");
    }
    let mut finish: Option<String> = None;
    let mut usage = None;
    let mut logprobs = 0u64;
    let mut pieces = 0u64;
    for chunk in chunks {
        let v: Value = serde_json::from_str(chunk).with_context(|| format!("chunk {chunk}"))?;
        if v.get("error").is_some() {
            bail!("error in the stream: {chunk}");
        }
        if let Some(u) = v.get("usage").filter(|u| !u.is_null()) {
            if usage.replace(u.clone()).is_some() {
                bail!("two usage chunks");
            }
        }
        let Some(choice) = v.pointer("/choices/0") else {
            continue;
        };
        if let Some(f) = choice.get("finish_reason").and_then(Value::as_str) {
            if finish.replace(f.to_string()).is_some() {
                bail!("two finish chunks");
            }
        } else {
            pieces += 1;
        }
        logprobs += logprob_entries(plan, choice) as u64;
    }
    let finish = finish.ok_or_else(|| anyhow!("no finish chunk"))?;
    match (plan.include_usage, usage) {
        (true, Some(u)) => {
            let tokens = usage_tokens(&u)?;
            finish_agrees(plan, &finish, tokens)?;
            if plan.logprobs && logprobs != tokens {
                bail!("{logprobs} logprob entries for {tokens} completion tokens");
            }
            // Chat streams open with a role chunk; tokens that end inside a character
            // have no text and, without logprobs, no chunk.
            let role_chunk = u64::from(plan.chat);
            if pieces > tokens + role_chunk {
                bail!("{pieces} content chunks for {tokens} completion tokens");
            }
            Ok(tokens)
        }
        (true, None) => bail!("include_usage was asked for, no usage chunk came"),
        (false, Some(_)) => bail!("a usage chunk nobody asked for"),
        (false, None) => Ok(if plan.logprobs { logprobs } else { 0 }),
    }
}

fn unix_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as u64)
}
