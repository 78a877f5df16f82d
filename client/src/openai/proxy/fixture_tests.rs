//! The tap on real engines' bytes: llama-server's captured answers (see `fixtures/`),
//! Ollama's documented NDJSON, cut into chunks of every size.

use tokio::sync::mpsc;

use super::measure::{BodyKind, End, Endpoint, JobMeta};
use super::tail::TAIL_BYTES;
use super::tap::{ReplyHead, Tap};
use crate::protocol::{CountSource, DecodeClock, ExternalJob, FinishReason};

const LLAMA_STREAM_USAGE: &[u8] = include_bytes!("fixtures/llama_chat_stream_usage.sse");
const LLAMA_STREAM: &[u8] = include_bytes!("fixtures/llama_chat_stream.sse");
const LLAMA_JSON: &[u8] = include_bytes!("fixtures/llama_chat.json");
const LLAMA_JSON_GZ: &[u8] = include_bytes!("fixtures/llama_chat.json.gz");
const LLAMA_COMPLETIONS_USAGE: &[u8] =
    include_bytes!("fixtures/llama_completions_stream_usage.sse");
const LLAMA_EMBEDDINGS: &[u8] = include_bytes!("fixtures/llama_embeddings.json");
const LLAMA_ERROR: &[u8] = include_bytes!("fixtures/llama_error_400.json");
const OLLAMA_CHAT_STREAM: &[u8] = include_bytes!("fixtures/ollama_chat_stream.ndjson");
const OLLAMA_GENERATE_STREAM: &[u8] = include_bytes!("fixtures/ollama_generate_stream.ndjson");
const OLLAMA_CHAT: &[u8] = include_bytes!("fixtures/ollama_chat.json");
const SPARKD_STREAM_USAGE: &[u8] = include_bytes!("fixtures/sparkd_chat_stream_usage.sse");
const SPARKD_JSON: &[u8] = include_bytes!("fixtures/sparkd_chat.json");

struct Reply<'a> {
    body: &'a [u8],
    content_type: &'a str,
    status: u16,
    compressed: bool,
    endpoint: Endpoint,
}

fn reply<'a>(body: &'a [u8], content_type: &'a str) -> Reply<'a> {
    Reply {
        body,
        content_type,
        status: 200,
        compressed: false,
        endpoint: Endpoint::Generation,
    }
}

fn sse(body: &[u8]) -> Reply<'_> {
    reply(body, "text/event-stream")
}

fn ndjson(body: &[u8]) -> Reply<'_> {
    reply(body, "application/x-ndjson")
}

fn json(body: &[u8]) -> Reply<'_> {
    reply(body, "application/json; charset=utf-8")
}

/// The job the tap reports for `reply` passed in chunks of `chunk` bytes.
fn measure(reply: &Reply<'_>, chunk: usize, end: End) -> ExternalJob {
    let (sink, mut jobs) = mpsc::unbounded_channel();
    let meta = JobMeta {
        engine: "llama".into(),
        upstream: "http://127.0.0.1:8091".into(),
        model: "m".into(),
        request_id: 1,
        endpoint: reply.endpoint,
    };
    let mut tap = Tap::start(meta, sink);
    tap.reply(ReplyHead {
        status: reply.status,
        kind: BodyKind::from_content_type(reply.content_type),
        compressed: reply.compressed,
        content_length: None,
    });
    for piece in reply.body.chunks(chunk.max(1)) {
        tap.observe(piece);
    }
    tap.finish(end);
    jobs.try_recv().expect("the tap reports one job")
}

/// The job, checked to be the same whatever the chunking.
fn measure_all_ways(reply: &Reply<'_>) -> ExternalJob {
    let whole = measure(reply, reply.body.len(), End::Complete);
    for chunk in [1, 2, 3, 7, 64, 333, 1500, TAIL_BYTES, TAIL_BYTES + 1] {
        let job = measure(reply, chunk, End::Complete);
        assert_eq!(
            (job.usage, job.counts, job.finish_reason, job.decode_clock),
            (
                whole.usage,
                whole.counts,
                whole.finish_reason,
                whole.decode_clock
            ),
            "chunk size {chunk}"
        );
    }
    whole
}

fn counts(job: &ExternalJob) -> (u32, u32, CountSource) {
    (
        job.usage.prompt_tokens,
        job.usage.completion_tokens,
        job.counts,
    )
}

/// The SSE events of a body, each with its trailing blank line.
fn events(body: &[u8]) -> Vec<String> {
    String::from_utf8(body.to_vec())
        .expect("utf-8 fixture")
        .split_inclusive("\n\n")
        .map(str::to_string)
        .collect()
}

/// llama-server's own `usage` in a fixture, read with a JSON parser (the tap must agree).
fn llama_usage(body: &[u8]) -> (u32, u32) {
    let usage = events(body)
        .iter()
        .rev()
        .filter_map(|e| e.strip_prefix("data: "))
        .filter_map(|e| serde_json::from_str::<serde_json::Value>(e.trim()).ok())
        .find_map(|v| v.get("usage").filter(|u| u.is_object()).cloned())
        .expect("a usage chunk");
    let n = |k: &str| usage[k].as_u64().expect("count") as u32;
    (n("prompt_tokens"), n("completion_tokens"))
}

/// A chat delta event whose generated text is `text`, in llama-server's framing.
fn content_event(text: &str) -> String {
    let chunk = serde_json::json!({
        "choices": [{"finish_reason": null, "index": 0, "delta": {"content": text}}],
        "object": "chat.completion.chunk",
    });
    format!("data: {chunk}\n\n")
}

#[test]
fn llama_server_stream_with_usage() {
    assert!(
        LLAMA_STREAM_USAGE.len() > TAIL_BYTES,
        "longer than the tail"
    );
    let job = measure_all_ways(&sse(LLAMA_STREAM_USAGE));
    let (prompt, completion) = llama_usage(LLAMA_STREAM_USAGE);
    assert_eq!(counts(&job), (prompt, completion, CountSource::Reported));
    assert_eq!(job.finish_reason, FinishReason::Length);
    assert_eq!(job.decode_clock, DecodeClock::Stream);
    assert!(job.timings.ttft_ms.is_some());
}

#[test]
fn llama_server_stream_without_usage_is_counted_from_its_chunks() {
    let job = measure_all_ways(&sse(LLAMA_STREAM));
    // The same greedy request as the fixture with usage: one chunk per token.
    let (_, completion) = llama_usage(LLAMA_STREAM_USAGE);
    assert_eq!(counts(&job), (0, completion, CountSource::Estimated));
    assert!(job.to_record(1, None, None).estimated);
    assert_eq!(job.finish_reason, FinishReason::Length);
}

#[test]
fn llama_server_non_streaming_reply() {
    let job = measure_all_ways(&json(LLAMA_JSON));
    let usage: serde_json::Value = serde_json::from_slice(LLAMA_JSON).unwrap();
    let want = (
        usage["usage"]["prompt_tokens"].as_u64().unwrap() as u32,
        usage["usage"]["completion_tokens"].as_u64().unwrap() as u32,
    );
    assert_eq!(counts(&job), (want.0, want.1, CountSource::Reported));
    assert_eq!(job.decode_clock, DecodeClock::Request);
    assert_eq!(job.timings.ttft_ms, None);
}

#[test]
fn llama_server_legacy_completions_stream() {
    let job = measure_all_ways(&sse(LLAMA_COMPLETIONS_USAGE));
    let (prompt, completion) = llama_usage(LLAMA_COMPLETIONS_USAGE);
    assert_eq!(counts(&job), (prompt, completion, CountSource::Reported));
    // Without the usage object the `text` chunks give the same count.
    let without: Vec<String> = events(LLAMA_COMPLETIONS_USAGE)
        .into_iter()
        .map(|e| match e.find(",\"usage\"") {
            Some(at) => {
                let end = e.find(",\"id\"").expect("id after usage");
                format!("{}{}", &e[..at], &e[end..])
            }
            None => e,
        })
        .collect();
    let estimated = measure_all_ways(&sse(without.concat().as_bytes()));
    assert_eq!(counts(&estimated), (0, completion, CountSource::Estimated));
}

#[test]
fn a_long_stream_keeps_only_its_tail_and_still_finds_the_report() {
    let mut stream = events(LLAMA_STREAM_USAGE);
    let usage_at = stream.len() - 2;
    let filler: Vec<String> = (0..200).map(|n| content_event(&format!(" w{n}"))).collect();
    stream.splice(1..1, filler);
    let body = stream.concat();
    assert!(body.len() > 4 * TAIL_BYTES);
    assert!(stream[usage_at + 200].contains("\"usage\""));
    let job = measure_all_ways(&sse(body.as_bytes()));
    let (prompt, completion) = llama_usage(LLAMA_STREAM_USAGE);
    assert_eq!(counts(&job), (prompt, completion, CountSource::Reported));
}

#[test]
fn generated_text_mentioning_usage_keys_cannot_shadow_the_report() {
    let fake = r#"{"usage":{"completion_tokens": 999,"prompt_tokens":999}} "eval_count":999"#;
    let mut with_usage = events(LLAMA_STREAM_USAGE);
    let at = with_usage.len() - 3;
    with_usage.insert(at, content_event(fake));
    let job = measure_all_ways(&sse(with_usage.concat().as_bytes()));
    let (prompt, completion) = llama_usage(LLAMA_STREAM_USAGE);
    assert_eq!(counts(&job), (prompt, completion, CountSource::Reported));

    // Without a report, the text is not mistaken for one: the chunks are counted.
    let mut without = events(LLAMA_STREAM);
    let at = without.len() - 2;
    without.insert(at, content_event(fake));
    let job = measure_all_ways(&sse(without.concat().as_bytes()));
    assert_eq!(counts(&job), (0, completion + 1, CountSource::Estimated));
}

#[test]
fn ollama_streams_use_the_engines_counts_and_decode_time() {
    for body in [OLLAMA_CHAT_STREAM, OLLAMA_GENERATE_STREAM] {
        let job = measure_all_ways(&ndjson(body));
        let last: serde_json::Value =
            serde_json::from_str(std::str::from_utf8(body).unwrap().lines().last().unwrap())
                .unwrap();
        let n = |k: &str| last[k].as_u64().unwrap();
        assert_eq!(
            counts(&job),
            (
                n("prompt_eval_count") as u32,
                n("eval_count") as u32,
                CountSource::Reported
            )
        );
        assert_eq!(job.decode_clock, DecodeClock::Engine);
        assert_eq!(job.timings.decode_ms, n("eval_duration") as f64 / 1e6);
        assert_eq!(
            job.timings.prefill_ms,
            n("prompt_eval_duration") as f64 / 1e6
        );
        let tps = n("eval_count") as f64 / (n("eval_duration") as f64 / 1e9);
        assert!((job.timings.decode_tps.unwrap() - tps).abs() < 1e-6);
        assert_eq!(job.finish_reason, FinishReason::Stop);
    }
}

#[test]
fn ollama_non_streaming_reply_and_a_cut_stream() {
    let job = measure_all_ways(&json(OLLAMA_CHAT));
    assert_eq!(
        (job.counts, job.decode_clock),
        (CountSource::Reported, DecodeClock::Engine)
    );
    assert_eq!(job.timings.ttft_ms, None);

    // The stream broke before Ollama's final line: its lines are counted.
    let text = std::str::from_utf8(OLLAMA_CHAT_STREAM).unwrap();
    let lines: Vec<&str> = text.lines().collect();
    let cut = format!("{}\n", lines[..lines.len() - 1].join("\n"));
    let job = measure(&ndjson(cut.as_bytes()), 5, End::UpstreamFailed);
    assert_eq!(
        counts(&job),
        (0, lines.len() as u32 - 1, CountSource::Estimated)
    );
    assert_eq!(job.finish_reason, FinishReason::Error);
}

#[test]
fn embeddings_record_the_prompt_even_when_usage_comes_first() {
    assert!(LLAMA_EMBEDDINGS.len() > TAIL_BYTES);
    let reply = Reply {
        endpoint: Endpoint::Embeddings,
        ..json(LLAMA_EMBEDDINGS)
    };
    let job = measure_all_ways(&reply);
    let v: serde_json::Value = serde_json::from_slice(LLAMA_EMBEDDINGS).unwrap();
    let prompt = v["usage"]["prompt_tokens"].as_u64().unwrap() as u32;
    assert_eq!(counts(&job), (prompt, 0, CountSource::Reported));
    assert_eq!(job.decode_clock, DecodeClock::None);
}

#[test]
fn compressed_and_error_bodies_give_no_counts() {
    let gz = Reply {
        compressed: true,
        ..json(LLAMA_JSON_GZ)
    };
    let job = measure_all_ways(&gz);
    assert_eq!(counts(&job), (0, 0, CountSource::Unknown));
    assert!(job.timings.generation_ms >= 0.0);

    let error = Reply {
        status: 400,
        ..json(LLAMA_ERROR)
    };
    let job = measure_all_ways(&error);
    assert_eq!(job.finish_reason, FinishReason::Error);
    assert_eq!(counts(&job), (0, 0, CountSource::Unknown));
    assert_eq!(job.http_status, 400);
}

#[test]
fn sparkds_own_shim() {
    let job = measure_all_ways(&sse(SPARKD_STREAM_USAGE));
    let (prompt, completion) = llama_usage(SPARKD_STREAM_USAGE);
    assert_eq!(counts(&job), (prompt, completion, CountSource::Reported));
    let job = measure_all_ways(&json(SPARKD_JSON));
    let v: serde_json::Value = serde_json::from_slice(SPARKD_JSON).unwrap();
    assert_eq!(
        job.usage.completion_tokens,
        v["usage"]["completion_tokens"].as_u64().unwrap() as u32
    );
}

/// The tap's own cost per SSE chunk (the events of a real stream, ~300 bytes each).
/// Prints figures; asserts nothing about them.
/// `cargo test -p spark-client --lib tap_cost -- --ignored --nocapture`
#[test]
#[ignore = "a benchmark: run by hand"]
fn tap_cost_per_chunk() {
    let chunks = events(LLAMA_STREAM_USAGE);
    let rounds = 20_000;
    let (sink, mut jobs) = mpsc::unbounded_channel();
    let start = std::time::Instant::now();
    for _ in 0..rounds {
        let meta = JobMeta {
            engine: "llama".into(),
            upstream: String::new(),
            model: "m".into(),
            request_id: 1,
            endpoint: Endpoint::Generation,
        };
        let mut tap = Tap::start(meta, sink.clone());
        tap.reply(ReplyHead {
            status: 200,
            kind: BodyKind::Sse,
            compressed: false,
            content_length: None,
        });
        for chunk in &chunks {
            tap.observe(std::hint::black_box(chunk.as_bytes()));
        }
        tap.finish(End::Complete);
        jobs.try_recv().expect("a job");
    }
    let elapsed = start.elapsed();
    let n_chunks = (rounds * chunks.len()) as f64;
    let bytes = (rounds * LLAMA_STREAM_USAGE.len()) as f64;
    eprintln!(
        "tap: {:.0} ns per chunk (incl. per-response setup and final scan), {:.0} MB/s, \
         {:.1} us per {}-chunk response",
        elapsed.as_nanos() as f64 / n_chunks,
        bytes / elapsed.as_secs_f64() / 1e6,
        elapsed.as_micros() as f64 / rounds as f64,
        chunks.len()
    );
}
