//! Human-readable renderings: the stats line, the jobs table, the status report.

use spark_client::protocol::{
    CacheReport, ChatFormatReport, DoneEvent, FinishReason, JobEntry, PrefillEvent, StatusReport,
};

/// `33.5 tok/s · 60 tokens · 1.8 s to first token`, plus how much of the prompt came
/// from the daemon's prefix cache when any did, and the finish reason when the
/// generation did not end normally.
pub fn stats_line(done: &DoneEvent, prefill: Option<&PrefillEvent>) -> String {
    let tps = done
        .timings
        .decode_tps
        .map_or_else(|| "—".to_owned(), |tps| format!("{tps:.1}"));
    let tokens = done.usage.completion_tokens;
    let noun = if tokens == 1 { "token" } else { "tokens" };
    let ttft = done.timings.ttft_ms.map_or_else(|| "—".to_owned(), seconds);
    let mut line = format!("{tps} tok/s · {tokens} {noun} · {ttft} s to first token");
    if let Some(p) = prefill.filter(|p| p.cached_tokens > 0) {
        let of = p.prompt_tokens;
        line.push_str(&format!(
            " · {} of {of} prompt tokens cached",
            p.cached_tokens
        ));
    }
    if !matches!(
        done.finish_reason,
        FinishReason::Stop | FinishReason::Length
    ) {
        line.push_str(" · ");
        line.push_str(done.finish_reason.as_str());
    }
    line
}

/// Milliseconds as seconds: one decimal from a second up (`1.8`), two significant
/// digits below (`0.26`, `0.095`, `0.0042`), so that a fast first token does not read
/// `0.0`.
fn seconds(ms: f64) -> String {
    let s = ms / 1000.0;
    // From 0.995 s, two significant digits round to 1.0.
    if !(s > 0.0 && s < 0.995) {
        return format!("{s:.1}");
    }
    let decimals = (1 - s.log10().floor() as i32).clamp(1, 4) as usize;
    format!("{s:.decimals$}")
}

/// The `spark jobs` table, newest first as given. `now_ms` is the current Unix time in
/// milliseconds, for the WHEN column.
pub fn jobs_table(jobs: &[JobEntry], now_ms: u64) -> String {
    let header = [
        "ID", "WHEN", "PID", "IN", "CACHED", "OUT", "TTFT", "TOK/S", "FINISH", "ENGINE",
    ];
    // Text columns are left-aligned, figures right-aligned.
    let right = [true, true, true, true, true, true, true, true, false, false];
    let rows: Vec<[String; 10]> = jobs
        .iter()
        .map(|entry| {
            let job = &entry.record;
            let estimate = if job.estimated { "~" } else { "" };
            [
                job.job.to_string(),
                match job.finished_unix_ms {
                    0 => "-".to_owned(),
                    finished => ago(now_ms.saturating_sub(finished)),
                },
                job.client_pid
                    .map_or_else(|| "-".to_owned(), |pid| pid.to_string()),
                format!("{estimate}{}", job.usage.prompt_tokens),
                // Unknown (a forwarded job, an older daemon) differs from none cached.
                entry
                    .cached_tokens
                    .map_or_else(|| "-".to_owned(), |cached| cached.to_string()),
                format!("{estimate}{}", job.usage.completion_tokens),
                job.timings
                    .ttft_ms
                    .map_or_else(|| "-".to_owned(), duration_ms),
                job.timings
                    .decode_tps
                    .map_or_else(|| "-".to_owned(), |tps| format!("{estimate}{tps:.1}")),
                job.finish_reason.as_str().to_owned(),
                job.engine.clone(),
            ]
        })
        .collect();

    table(&header, &right, &rows)
}

/// Rows under a header, columns two spaces apart: a `right` column's cells aligned
/// right (figures), the others left (text), and no trailing spaces.
pub fn table<const N: usize>(
    header: &[&str; N],
    right: &[bool; N],
    rows: &[[String; N]],
) -> String {
    let mut widths = header.map(|h| h.chars().count());
    for row in rows {
        for (width, cell) in widths.iter_mut().zip(row) {
            *width = (*width).max(cell.chars().count());
        }
    }
    let render = |cells: &[&str]| {
        let mut line = String::new();
        for (i, cell) in cells.iter().enumerate() {
            let pad = widths[i] - cell.chars().count();
            if i > 0 {
                line.push_str("  ");
            }
            if right[i] {
                line.push_str(&" ".repeat(pad));
                line.push_str(cell);
            } else {
                line.push_str(cell);
                if i + 1 < cells.len() {
                    line.push_str(&" ".repeat(pad));
                }
            }
        }
        line.truncate(line.trim_end().len());
        line
    };
    let mut table = render(header);
    for row in rows {
        table.push('\n');
        table.push_str(&render(&row.iter().map(String::as_str).collect::<Vec<_>>()));
    }
    table
}

/// `spark status` as aligned `label  value` lines; `cache` is `None` from a daemon older
/// than protocol 1.2 (and its line is left out).
pub fn status_text(
    status: &StatusReport,
    cache: Option<&CacheReport>,
    chat: Option<&ChatFormatReport>,
) -> String {
    let model = &status.model;
    let mut lines = vec![
        (
            "model",
            format!(
                "{} ({}, {}, {} params, ctx {})",
                model.name,
                model.architecture,
                model.quantization,
                count(model.parameters),
                model.context_length
            ),
        ),
        ("backend", format!("{} · {}", status.backend, status.device)),
        ("memory", mib(status.resident_bytes)),
        ("uptime", uptime(status.uptime_s)),
        (
            "requests",
            format!("{} running · {} queued", status.running, status.queued),
        ),
        (
            "kv cache",
            format!(
                "{}/{} blocks ({} tokens each)",
                status.kv_blocks_used, status.kv_blocks_total, status.kv_block_tokens
            ),
        ),
        (
            "served",
            format!(
                "{} requests · {} tokens generated · {} prompt tokens",
                status.requests_served, status.tokens_generated, status.prompt_tokens_processed
            ),
        ),
        ("version", format!("sparkd {}", status.daemon_version)),
    ];
    if let Some(cache) = cache {
        let after_kv = lines.iter().position(|(label, _)| *label == "kv cache");
        let at = after_kv.map_or(lines.len(), |i| i + 1);
        lines.insert(at, ("prefix cache", prefix_cache(status, cache)));
    }
    if let Some(chat) = chat {
        let after_model = lines.iter().position(|(label, _)| *label == "model");
        let at = after_model.map_or(lines.len(), |i| i + 1);
        lines.insert(at, ("chat", chat_format(chat)));
    }
    let width = lines
        .iter()
        .map(|(label, _)| label.len())
        .max()
        .unwrap_or(0);
    lines
        .iter()
        .map(|(label, value)| format!("{label:<width$}  {value}"))
        .collect::<Vec<_>>()
        .join("\n")
}

/// `tools hermes · thinks in <think>…</think> · switches enable_thinking`: how the
/// daemon renders the model's chats and reads its answers.
fn chat_format(chat: &ChatFormatReport) -> String {
    if !chat.template {
        return "no chat template: raw prompts only".into();
    }
    let mut parts = vec![
        format!("tools {}", chat.tools),
        format!("thinks in {}…{}", chat.think_open, chat.think_close),
    ];
    if !chat.system_role {
        parts.push("system messages merged into the user's".into());
    }
    if !chat.variables.is_empty() {
        parts.push(format!("switches {}", chat.variables.join(", ")));
    }
    parts.join(" · ")
}

/// `21 blocks (336 tokens), 8 idle · 336 of 1000 prompt tokens reused (34%) · 5 evicted`.
fn prefix_cache(status: &StatusReport, cache: &CacheReport) -> String {
    if !cache.enabled {
        return "off".into();
    }
    let tokens = u64::from(cache.cached_blocks) * u64::from(status.kv_block_tokens);
    let prompt = status.prompt_tokens_processed;
    let share = if prompt == 0 {
        String::new()
    } else {
        let percent = cache.prompt_tokens_reused as f64 / prompt as f64 * 100.0;
        format!(" ({percent:.0}%)")
    };
    format!(
        "{} blocks ({tokens} tokens), {} idle · {} of {prompt} prompt tokens reused{share} · {} evicted",
        cache.cached_blocks, cache.idle_blocks, cache.prompt_tokens_reused, cache.evicted_blocks
    )
}

/// `250ms` below a second, `1.8s` above.
pub fn duration_ms(ms: f64) -> String {
    if ms < 1000.0 {
        format!("{ms:.0}ms")
    } else {
        format!("{:.1}s", ms / 1000.0)
    }
}

/// How long ago, in the largest whole unit: `12s ago`, `5m ago`, `3h ago`, `2d ago`.
pub fn ago(elapsed_ms: u64) -> String {
    let s = elapsed_ms / 1000;
    match s {
        0 => "now".to_owned(),
        1..=59 => format!("{s}s ago"),
        60..=3599 => format!("{}m ago", s / 60),
        3600..=86_399 => format!("{}h ago", s / 3600),
        _ => format!("{}d ago", s / 86_400),
    }
}

pub fn mib(bytes: u64) -> String {
    format!("{:.1} MiB", bytes as f64 / (1024.0 * 1024.0))
}

/// A file's size: MiB under a GiB, GiB from there (models run from 100 MiB to 100 GiB).
pub fn size(bytes: u64) -> String {
    const GIB: u64 = 1 << 30;
    if bytes < GIB {
        mib(bytes)
    } else {
        format!("{:.1} GiB", bytes as f64 / GIB as f64)
    }
}

/// `135M`, `7.2B`: parameter counts at a glance.
pub fn count(n: u64) -> String {
    match n {
        0..=999 => n.to_string(),
        1_000..=999_999 => format!("{:.0}K", n as f64 / 1e3),
        1_000_000..=9_999_999 => format!("{:.1}M", n as f64 / 1e6),
        10_000_000..=999_999_999 => format!("{:.0}M", n as f64 / 1e6),
        _ => format!("{:.1}B", n as f64 / 1e9),
    }
}

/// `1h 02m 03s`, `4m 05s`, `12s`.
pub fn uptime(seconds: f64) -> String {
    let total = if seconds.is_finite() && seconds > 0.0 {
        seconds as u64
    } else {
        0
    };
    let (d, h, m, s) = (
        total / 86_400,
        total / 3600 % 24,
        total / 60 % 60,
        total % 60,
    );
    if d > 0 {
        format!("{d}d {h:02}h {m:02}m")
    } else if h > 0 {
        format!("{h}h {m:02}m {s:02}s")
    } else if m > 0 {
        format!("{m}m {s:02}s")
    } else {
        format!("{s}s")
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use spark_client::protocol::{JobRecord, ModelInfo, Timings, Usage};

    fn done(
        tps: Option<f64>,
        tokens: u32,
        ttft_ms: Option<f64>,
        reason: FinishReason,
    ) -> DoneEvent {
        DoneEvent {
            id: 1,
            finish_reason: reason,
            usage: Usage {
                prompt_tokens: 10,
                completion_tokens: tokens,
            },
            timings: Timings {
                ttft_ms,
                decode_tps: tps,
                ..Timings::default()
            },
        }
    }

    #[test]
    fn stats_line_has_the_documented_form() {
        let line = stats_line(
            &done(Some(33.46), 60, Some(1849.0), FinishReason::Stop),
            None,
        );
        assert_eq!(line, "33.5 tok/s · 60 tokens · 1.8 s to first token");
        let line = stats_line(
            &done(Some(120.0), 512, Some(95.0), FinishReason::Length),
            None,
        );
        assert_eq!(line, "120.0 tok/s · 512 tokens · 0.095 s to first token");
    }

    #[test]
    fn first_token_times_under_a_second_keep_two_significant_digits() {
        let cases = [
            (1849.0, "1.8"),
            (1000.0, "1.0"),
            (999.0, "1.0"),
            (950.0, "0.95"),
            (994.0, "0.99"),
            (260.0, "0.26"),
            (95.0, "0.095"),
            (14.6, "0.015"),
            (4.2, "0.0042"),
            (0.01, "0.0000"),
            (0.0, "0.0"),
        ];
        for (ms, want) in cases {
            assert_eq!(seconds(ms), want, "{ms} ms");
        }
    }

    #[test]
    fn stats_line_without_rates() {
        let line = stats_line(&done(None, 1, Some(260.0), FinishReason::Stop), None);
        assert_eq!(line, "— tok/s · 1 token · 0.26 s to first token");
        let line = stats_line(&done(None, 0, None, FinishReason::Cancelled), None);
        assert_eq!(line, "— tok/s · 0 tokens · — s to first token · cancelled");
    }

    #[test]
    fn stats_line_tells_a_cached_prompt() {
        let prefill = |cached_tokens| PrefillEvent {
            id: 1,
            prompt_tokens: 1228,
            cached_tokens,
        };
        let finished = done(Some(210.0), 60, Some(36.0), FinishReason::Stop);
        assert_eq!(
            stats_line(&finished, Some(&prefill(1216))),
            "210.0 tok/s · 60 tokens · 0.036 s to first token · 1216 of 1228 prompt tokens cached"
        );
        // Nothing cached (or an older daemon that does not say): the plain line.
        for prefill in [Some(prefill(0)), None] {
            assert_eq!(
                stats_line(&finished, prefill.as_ref()),
                "210.0 tok/s · 60 tokens · 0.036 s to first token"
            );
        }
        let cancelled = done(None, 1, Some(36.0), FinishReason::Cancelled);
        assert_eq!(
            stats_line(&cancelled, Some(&prefill(16))),
            "— tok/s · 1 token · 0.036 s to first token · 16 of 1228 prompt tokens cached · cancelled"
        );
    }

    fn job(n: u64, estimated: bool, finished_unix_ms: u64) -> JobEntry {
        let record = JobRecord {
            job: n,
            request_id: 1,
            client_pid: if n % 2 == 0 { Some(4242) } else { None },
            client_uid: Some(1000),
            model: "m".into(),
            engine: "sparkd".into(),
            started_unix_ms: finished_unix_ms - 100,
            finished_unix_ms,
            usage: Usage {
                prompt_tokens: 1234,
                completion_tokens: 60,
            },
            timings: Timings {
                ttft_ms: Some(250.0),
                decode_tps: Some(33.46),
                ..Timings::default()
            },
            finish_reason: FinishReason::Stop,
            estimated,
        };
        JobEntry {
            record,
            // A forwarded job's (odd numbers here) cache is not known.
            cached_tokens: (n % 2 == 0).then_some(1200),
        }
    }

    #[test]
    fn jobs_table_aligns_columns_and_marks_estimates() {
        let now = 10_000_000;
        let table = jobs_table(
            &[job(12, false, now - 5_000), job(7, true, now - 7_200_000)],
            now,
        );
        let lines: Vec<&str> = table.lines().collect();
        assert_eq!(lines.len(), 3);
        assert!(lines[0].starts_with("ID"));
        for column in [
            "WHEN", "PID", "IN", "CACHED", "OUT", "TTFT", "TOK/S", "FINISH", "ENGINE",
        ] {
            assert!(
                lines[0].contains(column),
                "header lacks {column}: {}",
                lines[0]
            );
        }
        assert_eq!(
            lines[1].split_whitespace().collect::<Vec<_>>(),
            ["12", "5s", "ago", "4242", "1234", "1200", "60", "250ms", "33.5", "stop", "sparkd"]
        );
        assert_eq!(
            lines[2].split_whitespace().collect::<Vec<_>>(),
            ["7", "2h", "ago", "-", "~1234", "-", "~60", "250ms", "~33.5", "stop", "sparkd"]
        );
        // Right-aligned figures: the OUT column ends at the same offset on every line.
        let end_of = |line: &str, cell: &str| line.find(cell).map(|i| i + cell.len());
        assert_eq!(end_of(lines[0], "OUT"), end_of(lines[1], " 60"));
        assert_eq!(end_of(lines[0], "OUT"), end_of(lines[2], "~60"));
        assert!(!lines[1].ends_with(' '));
    }

    #[test]
    fn empty_jobs_table_is_just_the_header() {
        assert_eq!(jobs_table(&[], 0).lines().count(), 1);
    }

    #[test]
    fn relative_times() {
        assert_eq!(ago(999), "now");
        assert_eq!(ago(59_999), "59s ago");
        assert_eq!(ago(60_000), "1m ago");
        assert_eq!(ago(3_600_000), "1h ago");
        assert_eq!(ago(3 * 86_400_000), "3d ago");
    }

    #[test]
    fn small_figures() {
        assert_eq!(duration_ms(12.4), "12ms");
        assert_eq!(duration_ms(1849.0), "1.8s");
        assert_eq!(count(134_515_008), "135M");
        assert_eq!(count(7_241_732_096), "7.2B");
        assert_eq!(count(1_500_000), "1.5M");
        assert_eq!(mib(3 * 1024 * 1024 / 2), "1.5 MiB");
        assert_eq!(uptime(3723.9), "1h 02m 03s");
        assert_eq!(uptime(65.0), "1m 05s");
        assert_eq!(uptime(-1.0), "0s");
        assert_eq!(uptime(f64::NAN), "0s");
    }

    #[test]
    fn status_text_lists_the_essentials() {
        let status = StatusReport {
            daemon_version: "0.1.0".into(),
            model: ModelInfo {
                name: "smollm2-135m-instruct".into(),
                path: "/m.gguf".into(),
                architecture: "llama".into(),
                quantization: "Q4_1".into(),
                parameters: 134_515_008,
                context_length: 8192,
                file_bytes: 1,
            },
            backend: "cpu".into(),
            device: "AMD EPYC (2 threads, avx2)".into(),
            resident_bytes: 100 * 1024 * 1024,
            uptime_s: 65.0,
            running: 1,
            queued: 2,
            kv_blocks_used: 3,
            kv_blocks_total: 512,
            kv_block_tokens: 16,
            requests_served: 4,
            tokens_generated: 5,
            prompt_tokens_processed: 6,
        };
        let text = status_text(&status, None, None);
        assert!(!text.contains("prefix cache"), "{text}");
        let cache = CacheReport {
            enabled: true,
            cached_blocks: 21,
            idle_blocks: 8,
            evicted_blocks: 5,
            prompt_tokens_reused: 3,
        };
        let with_cache = status_text(&status, Some(&cache), None);
        assert!(
            with_cache.contains(
                "prefix cache  21 blocks (336 tokens), 8 idle · 3 of 6 prompt tokens reused (50%) · 5 evicted"
            ),
            "{with_cache}"
        );
        let labels: Vec<&str> = with_cache.lines().map(|l| &l[..12]).collect();
        let kv = labels.iter().position(|l| l.starts_with("kv cache"));
        assert_eq!(labels[kv.unwrap() + 1], "prefix cache", "{with_cache}");
        let off = CacheReport {
            enabled: false,
            ..CacheReport::default()
        };
        assert!(status_text(&status, Some(&off), None).contains("prefix cache  off"));
        let chat = ChatFormatReport {
            template: true,
            tools: "mistral-args".into(),
            system_role: false,
            think_open: "[THINK]".into(),
            think_close: "[/THINK]".into(),
            variables: vec!["enable_thinking".into(), "reasoning_effort".into()],
        };
        let with_chat = status_text(&status, None, Some(&chat));
        let lines: Vec<&str> = with_chat.lines().collect();
        assert!(lines[0].starts_with("model "), "{with_chat}");
        assert_eq!(
            lines[1],
            "chat      tools mistral-args · thinks in [THINK]…[/THINK] · system messages merged into the user's · switches enable_thinking, reasoning_effort"
        );
        let none = ChatFormatReport::default();
        assert!(status_text(&status, None, Some(&none))
            .contains("chat      no chat template: raw prompts only"));
        for expected in [
            "smollm2-135m-instruct (llama, Q4_1, 135M params, ctx 8192)",
            "cpu · AMD EPYC (2 threads, avx2)",
            "100.0 MiB",
            "1m 05s",
            "1 running · 2 queued",
            "3/512 blocks",
            "sparkd 0.1.0",
        ] {
            assert!(text.contains(expected), "missing {expected:?} in\n{text}");
        }
    }
}
