//! The engine end to end on a tiny synthetic model, through the [`Engine`] trait the
//! server uses, with a backend that counts the tokens each step computes.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use spark_client::limits::MAX_TEMPLATE_VARIABLES_BYTES;
use spark_client::protocol::{
    CacheReport, DoneEvent, ErrorKind, FinishReason, GenerateOption, GenerateRequest, OutputFormat,
    PrefillEvent, PromptInput, SamplingParams, ServerMessage,
};

use super::{ClientInfo, Engine, EngineConfig, EngineHandle, Submission};
use crate::backend::{Backend, BackendError, CpuBackend, DeviceReport, HostThreads};
use crate::gguf::GgufFile;
use crate::model::synth::{synth_gguf, SynthSpec};
use crate::model::{BlockPool, Model, SeqInput, BLOCK_TOKENS};
use crate::text::tools::CallSyntax;
use crate::text::TemplateVars;

/// The CPU backend, counting the tokens that forward steps compute and noting each
/// step's shape. With `cost_per_token`, a step reports that much per token as its
/// duration instead of the measured one: a clock the pacer's tests can count on.
struct Counting {
    inner: CpuBackend,
    computed: Arc<AtomicUsize>,
    steps: Arc<Mutex<Vec<StepShape>>>,
    cost_per_token: Option<Duration>,
}

/// One forward step as the backend saw it.
#[derive(Debug, Clone, Copy)]
struct StepShape {
    /// Rows of one token (decodes, or the last token of a prompt).
    single_rows: usize,
    tokens: usize,
}

impl Backend for Counting {
    fn forward(&mut self, batch: &[SeqInput<'_>]) -> Result<Duration, BackendError> {
        let n: usize = batch.iter().map(|s| s.tokens.len()).sum();
        self.computed.fetch_add(n, Ordering::SeqCst);
        self.steps.lock().unwrap().push(StepShape {
            single_rows: batch.iter().filter(|s| s.tokens.len() == 1).count(),
            tokens: n,
        });
        let measured = self.inner.forward(batch)?;
        Ok(self.cost_per_token.map_or(measured, |c| c * n as u32))
    }
    fn logits_mut(&mut self, i: usize) -> &mut [f32] {
        self.inner.logits_mut(i)
    }
    fn logit_rows_mut(&mut self, rows: usize) -> (&mut [f32], &dyn HostThreads) {
        self.inner.logit_rows_mut(rows)
    }
    fn blocks(&self) -> &BlockPool {
        self.inner.blocks()
    }
    fn blocks_mut(&mut self) -> &mut BlockPool {
        self.inner.blocks_mut()
    }
    fn report(&self) -> Arc<dyn DeviceReport> {
        self.inner.report()
    }
    fn threads(&self) -> usize {
        self.inner.threads()
    }
}

/// What a test can see of the engine's backend.
struct Probe {
    computed: Arc<AtomicUsize>,
    steps: Arc<Mutex<Vec<StepShape>>>,
}

/// An engine on the tiny model and the counter of its computed tokens.
fn engine(prefix_cache: bool) -> (Arc<EngineHandle>, Arc<AtomicUsize>) {
    engine_with_kv(prefix_cache, 64)
}

fn engine_with_kv(prefix_cache: bool, kv_blocks: usize) -> (Arc<EngineHandle>, Arc<AtomicUsize>) {
    let config = EngineConfig {
        prefix_cache,
        ..EngineConfig::new("tiny")
    };
    let (engine, probe) = engine_with(config, kv_blocks, None);
    (engine, probe.computed)
}

fn engine_with(
    config: EngineConfig,
    kv_blocks: usize,
    cost_per_token: Option<Duration>,
) -> (Arc<EngineHandle>, Probe) {
    engine_of(&SynthSpec::tiny(), config, kv_blocks, cost_per_token)
}

fn engine_of(
    spec: &SynthSpec,
    config: EngineConfig,
    kv_blocks: usize,
    cost_per_token: Option<Duration>,
) -> (Arc<EngineHandle>, Probe) {
    let bytes = synth_gguf(spec).expect("synth").to_bytes();
    let file = GgufFile::from_bytes(bytes).expect("parse synth");
    let model = Arc::new(Model::from_file(file, std::path::Path::new("tiny.gguf")).expect("load"));
    let probe = Probe {
        computed: Arc::new(AtomicUsize::new(0)),
        steps: Arc::new(Mutex::new(Vec::new())),
    };
    let backend = Counting {
        inner: CpuBackend::new(model.clone(), kv_blocks * BLOCK_TOKENS, 1),
        computed: probe.computed.clone(),
        steps: probe.steps.clone(),
        cost_per_token,
    };
    let handle = EngineHandle::start_with_backend(model, Box::new(backend), config).expect("start");
    (handle, probe)
}

/// Queues one greedy raw-text generation; its events come on the receiver.
fn submit(
    engine: &EngineHandle,
    id: u64,
    text: &str,
    max_tokens: u32,
) -> tokio::sync::mpsc::UnboundedReceiver<ServerMessage> {
    submit_with(engine, id, text, max_tokens, SamplingParams::default())
}

fn submit_with(
    engine: &EngineHandle,
    id: u64,
    text: &str,
    max_tokens: u32,
    sampling: SamplingParams,
) -> tokio::sync::mpsc::UnboundedReceiver<ServerMessage> {
    submit_as(engine, id, text, max_tokens, sampling, OutputFormat::Text)
}

fn submit_as(
    engine: &EngineHandle,
    id: u64,
    text: &str,
    max_tokens: u32,
    sampling: SamplingParams,
    format: OutputFormat,
) -> tokio::sync::mpsc::UnboundedReceiver<ServerMessage> {
    let request = GenerateRequest {
        id,
        model: None,
        input: PromptInput::Raw {
            text: text.into(),
            special: false,
        },
        sampling,
        max_tokens: Some(max_tokens),
        stop: Vec::new(),
        logprobs: None,
    };
    submit_request(engine, request, format).expect("accepted")
}

type Events = tokio::sync::mpsc::UnboundedReceiver<ServerMessage>;

/// Submits `request`; its event stream, or the refusal.
fn submit_request(
    engine: &EngineHandle,
    request: GenerateRequest,
    format: OutputFormat,
) -> Result<Events, spark_client::protocol::ErrorEvent> {
    submit_with_options(engine, request, format, Vec::new(), true)
}

/// [`submit_request`] with options, from a client that splits reasoning or not.
fn submit_with_options(
    engine: &EngineHandle,
    request: GenerateRequest,
    format: OutputFormat,
    options: Vec<GenerateOption>,
    split_reasoning: bool,
) -> Result<Events, spark_client::protocol::ErrorEvent> {
    let (tx, rx) = tokio::sync::mpsc::unbounded_channel();
    engine.submit(Submission {
        format,
        conn: 1,
        client: ClientInfo::default(),
        request,
        options,
        split_reasoning,
        token_bytes: true,
        arrived: Instant::now(),
        events: tx,
    })?;
    Ok(rx)
}

/// A generation's tokens, text and final frame (of a stream that may have been read
/// in part already).
fn collect(
    mut events: tokio::sync::mpsc::UnboundedReceiver<ServerMessage>,
) -> (Vec<u32>, String, DoneEvent) {
    let (mut tokens, mut answer) = (Vec::new(), String::new());
    while let Some(msg) = events.blocking_recv() {
        match msg {
            ServerMessage::Prefilled(_) => {}
            ServerMessage::Token(t) => {
                tokens.push(t.token);
                answer.push_str(&t.text);
            }
            ServerMessage::Done(done) => return (tokens, answer, done),
            other => panic!("unexpected {other:?}"),
        }
    }
    panic!("stream ended without Done");
}

/// Runs one greedy raw-text generation to its end.
fn generate(
    engine: &EngineHandle,
    id: u64,
    text: &str,
    max_tokens: u32,
) -> (Vec<u32>, String, DoneEvent) {
    let (tokens, answer, done, _) = collect_with_prefill(submit(engine, id, text, max_tokens));
    (tokens, answer, done)
}

/// As [`collect`], with the generation's `Prefilled` event, checked to come exactly
/// once, right before the first token, and to agree with the final usage.
fn collect_with_prefill(
    mut events: tokio::sync::mpsc::UnboundedReceiver<ServerMessage>,
) -> (Vec<u32>, String, DoneEvent, Option<PrefillEvent>) {
    let (mut tokens, mut answer, mut prefill) = (Vec::new(), String::new(), None);
    while let Some(msg) = events.blocking_recv() {
        match msg {
            ServerMessage::Prefilled(p) => {
                assert!(prefill.is_none(), "a second Prefilled: {p:?}");
                assert!(tokens.is_empty(), "Prefilled after a token");
                prefill = Some(p);
            }
            ServerMessage::Token(t) => {
                assert!(prefill.is_some(), "a token before Prefilled");
                tokens.push(t.token);
                answer.push_str(&t.text);
            }
            ServerMessage::Done(done) => {
                if let Some(p) = prefill {
                    assert_eq!((p.id, p.prompt_tokens), (done.id, done.usage.prompt_tokens));
                    assert!(p.cached_tokens < p.prompt_tokens);
                }
                return (tokens, answer, done, prefill);
            }
            other => panic!("unexpected {other:?}"),
        }
    }
    panic!("stream ended without Done");
}

const PROMPT: &str = "A long system prompt that many requests share, long enough to fill \
                      a few blocks of the KV cache, followed by the question itself.";

#[test]
fn a_repeated_prompt_computes_only_what_the_cache_lacks() {
    let (engine, computed) = engine(true);
    let (first, _, done) = generate(&engine, 1, PROMPT, 6);
    assert_eq!(done.finish_reason, FinishReason::Length);
    let n_prompt = done.usage.prompt_tokens as usize;
    assert!(n_prompt > 2 * BLOCK_TOKENS, "prompt of {n_prompt} tokens");
    // The prompt, then one position for each generated token but the last.
    assert_eq!(computed.load(Ordering::SeqCst), n_prompt + 5);

    let before = computed.load(Ordering::SeqCst);
    let (again, _, done, prefill) = collect_with_prefill(submit(&engine, 2, PROMPT, 6));
    assert_eq!(
        again, first,
        "greedy tokens must not change with a reused prefix"
    );
    let reused = (n_prompt - 1) / BLOCK_TOKENS * BLOCK_TOKENS;
    // The client is told what was reused, and so is `CacheStatus`: once the engine has
    // published its figures after the second request, nothing runs and every cached
    // block is idle.
    assert_eq!(prefill.map(|p| p.cached_tokens as usize), Some(reused));
    let deadline = Instant::now() + Duration::from_secs(5);
    let settled = |c: &CacheReport| c.idle_blocks == c.cached_blocks && c.cached_blocks > 0;
    while !(engine.status().requests_served == 2 && settled(&engine.cache_status()))
        && Instant::now() < deadline
    {
        std::thread::sleep(Duration::from_millis(5));
    }
    let cache = engine.cache_status();
    assert!(cache.enabled);
    assert_eq!(cache.prompt_tokens_reused as usize, reused);
    assert!(
        cache.cached_blocks as usize >= reused / BLOCK_TOKENS,
        "{cache:?}"
    );
    assert_eq!(cache.idle_blocks, cache.cached_blocks);
    assert_eq!(cache.evicted_blocks, 0);
    assert_eq!(
        computed.load(Ordering::SeqCst) - before,
        n_prompt - reused + 5
    );
    // The prefill rate counts the computed prompt tokens only.
    let t = done.timings;
    let rate = (n_prompt - reused) as f64 / t.prefill_ms * 1e3;
    assert!((t.prefill_tps.unwrap() - rate).abs() < 1e-6 * rate);
}

#[test]
fn a_prompt_that_extends_an_earlier_one_reuses_its_blocks() {
    let (engine, computed) = engine(true);
    let (answer, _, first) = generate(&engine, 1, PROMPT, 20);
    // The positions the first request computed: its prompt and every answer token but
    // the last, which was sampled and never fed back. (Whether an answer's own blocks
    // come back depends on its text encoding to the same tokens: the pool tests cover
    // generated tokens like any others.)
    let first_prompt = engine.tokenizer().encode(PROMPT, true, false);
    assert_eq!(first_prompt.len(), first.usage.prompt_tokens as usize);
    let computed_first = [first_prompt, answer[..answer.len() - 1].to_vec()].concat();

    // The next turn of a conversation: the history and a new question.
    let next = format!("{PROMPT} And a follow-up question.");
    let next_tokens = engine.tokenizer().encode(&next, true, false);
    let common = computed_first
        .iter()
        .zip(&next_tokens)
        .take_while(|(a, b)| a == b)
        .count();
    let reused = common.min(next_tokens.len() - 1) / BLOCK_TOKENS * BLOCK_TOKENS;
    assert!(reused >= 4 * BLOCK_TOKENS, "{reused} positions to reuse");

    let before = computed.load(Ordering::SeqCst);
    let (_, _, second) = generate(&engine, 2, &next, 3);
    assert_eq!(second.usage.prompt_tokens as usize, next_tokens.len());
    assert_eq!(
        computed.load(Ordering::SeqCst) - before,
        next_tokens.len() - reused + 2
    );
}

#[test]
fn prompts_sent_together_compute_their_shared_prefix_once() {
    let (engine, computed) = engine(true);
    let n_prompt = engine.tokenizer().encode(PROMPT, true, false).len();
    // Keep the engine stepping, so that the four arrive between two steps, together.
    let busy = submit(&engine, 1, "something else entirely", 200);
    std::thread::sleep(Duration::from_millis(20));
    let before = computed.load(Ordering::SeqCst);
    let streams: Vec<_> = (0..4).map(|i| submit(&engine, 10 + i, PROMPT, 6)).collect();
    let answers: Vec<Vec<u32>> = streams.into_iter().map(|s| collect(s).0).collect();
    let during = computed.load(Ordering::SeqCst) - before;
    let (_, _, busy_done) = collect(busy);
    assert!(answers.windows(2).all(|w| w[0] == w[1]));

    // The first computes the prompt; the others wait for its blocks and compute only
    // the rest. (Of the busy request, at most one token a step ran meanwhile.)
    let reused = (n_prompt - 1) / BLOCK_TOKENS * BLOCK_TOKENS;
    let expected = n_prompt + 3 * (n_prompt - reused) + 4 * 5;
    let busy_tokens = busy_done.usage.completion_tokens as usize;
    assert!(
        during >= expected && during <= expected + busy_tokens,
        "computed {during}, expected {expected} plus the busy request's decodes"
    );
    assert!(
        during < 2 * n_prompt,
        "the prompt was computed more than once"
    );
}

#[test]
fn without_the_prefix_cache_every_prompt_is_computed_in_full() {
    let (engine, computed) = engine(false);
    let (first, _, done) = generate(&engine, 1, PROMPT, 6);
    let n_prompt = done.usage.prompt_tokens as usize;
    let (again, _, _, prefill) = collect_with_prefill(submit(&engine, 2, PROMPT, 6));
    assert_eq!(again, first);
    assert_eq!(computed.load(Ordering::SeqCst), 2 * (n_prompt + 5));
    assert_eq!(prefill.map(|p| p.cached_tokens), Some(0));
}

#[test]
fn sequences_preempted_for_lack_of_kv_blocks_still_give_their_own_tokens() {
    let prompts: Vec<String> = (0..4)
        .map(|i| format!("Request {i}: {PROMPT} Number {i} of four."))
        .collect();
    let (roomy, _) = engine(true);
    let alone: Vec<Vec<u32>> = prompts
        .iter()
        .map(|p| generate(&roomy, 1, p, 40).0)
        .collect();
    for prefix_cache in [true, false] {
        // Room for two prompts at a time, not for their answers too.
        let (tight, _) = engine_with_kv(prefix_cache, 16);
        let streams: Vec<_> = prompts
            .iter()
            .enumerate()
            .map(|(i, p)| submit(&tight, i as u64, p, 40))
            .collect();
        for (i, events) in streams.into_iter().enumerate() {
            let (tokens, _, done) = collect(events);
            assert_eq!(done.finish_reason, FinishReason::Length);
            assert_eq!(tokens, alone[i], "request {i}, prefix cache {prefix_cache}");
        }
        // Every table let go (the load is published just after the last `Done`).
        let deadline = Instant::now() + Duration::from_secs(5);
        while tight.status().kv_blocks_used != 0 && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(1));
        }
        assert_eq!(tight.status().kv_blocks_used, 0);
    }
}

#[test]
fn prompt_chunks_beside_decoding_streams_fit_the_step_target() {
    // Each token "costs" 1 ms, so a 24 ms target fits 24 tokens a step.
    let config = EngineConfig {
        prefix_cache: false,
        step_target: Some(Duration::from_millis(24)),
        ..EngineConfig::new("tiny")
    };
    let (engine, probe) = engine_with(config, 64, Some(Duration::from_millis(1)));
    // Alone, a prompt goes in one step: nothing decodes beside it.
    let (_, _, first) = generate(&engine, 1, PROMPT, 2);
    let n_prompt = first.usage.prompt_tokens as usize;
    assert!(n_prompt > 48);
    assert_eq!(probe.steps.lock().unwrap()[0].tokens, n_prompt);

    // The same prompt while another stream decodes goes in chunks of the target. The
    // stream cannot end early: its end-of-generation tokens are banned.
    let tok = engine.tokenizer();
    let never_end = SamplingParams {
        logit_bias: (0..tok.vocab_size() as u32)
            .filter(|&t| tok.is_eog(t))
            .map(|t| (t, f32::NEG_INFINITY))
            .collect(),
        ..Default::default()
    };
    let mut decoding = submit_with(&engine, 2, "a stream", 300, never_end);
    assert!(matches!(
        decoding.blocking_recv(),
        Some(ServerMessage::Prefilled(_))
    ));
    assert!(matches!(
        decoding.blocking_recv(),
        Some(ServerMessage::Token(_))
    ));
    let steps_before = probe.steps.lock().unwrap().len();
    let (_, _, second) = generate(&engine, 3, PROMPT, 2);
    let (_, _, stream) = collect(decoding);
    assert_eq!(second.usage.prompt_tokens as usize, n_prompt);
    assert_eq!(
        stream.finish_reason,
        FinishReason::Length,
        "the stream was still decoding"
    );
    let steps = probe.steps.lock().unwrap()[steps_before..].to_vec();
    let mixed: Vec<StepShape> = steps
        .into_iter()
        .filter(|s| s.single_rows >= 1 && s.tokens > s.single_rows)
        .collect();
    assert!(mixed.len() >= n_prompt / 24, "{mixed:?}");
    assert!(mixed.iter().all(|s| s.tokens <= 24), "{mixed:?}");
}

/// The synthetic vocabulary's first 256 tokens are the bytes, in order.
const OPEN_BRACE: u32 = b'{' as u32;
const CLOSE_BRACE: u32 = b'}' as u32;

#[test]
fn json_output_refuses_what_the_model_prefers_and_ends_when_the_object_closes() {
    let (engine, _) = engine(true);
    // `}` pushed far above everything: as plain text it comes first; as JSON it cannot
    // until an object is open, and then it closes it and ends the generation.
    let sampling = SamplingParams {
        logit_bias: vec![(CLOSE_BRACE, 60.0), (OPEN_BRACE, 30.0)],
        ..SamplingParams::default()
    };
    let text = submit_as(
        &engine,
        1,
        "hello",
        20,
        sampling.clone(),
        OutputFormat::Text,
    );
    let (tokens, _, _) = collect(text);
    assert_eq!(tokens[0], CLOSE_BRACE);

    let json = submit_as(&engine, 2, "hello", 20, sampling, OutputFormat::JsonObject);
    let (tokens, answer, done) = collect(json);
    assert_eq!(tokens, [OPEN_BRACE, CLOSE_BRACE]);
    assert_eq!(answer, "{}");
    assert_eq!(done.finish_reason, FinishReason::Stop);
    assert_eq!(done.usage.completion_tokens, 2);
}

#[test]
fn sampled_json_output_is_always_a_valid_beginning_and_whole_when_it_stops() {
    let (engine, _) = engine(true);
    let mut stopped = 0;
    for seed in 0..24 {
        let sampling = SamplingParams {
            temperature: 1.5,
            seed: Some(seed),
            // Closers a little likelier, so that some objects close within the budget.
            logit_bias: vec![(CLOSE_BRACE, 4.0), (b']' as u32, 3.0), (b'"' as u32, 3.0)],
            ..SamplingParams::default()
        };
        let events = submit_as(
            &engine,
            seed + 1,
            "data:",
            48,
            sampling,
            OutputFormat::JsonObject,
        );
        let (_, answer, done) = collect(events);
        let mut acceptor = crate::text::json::JsonAcceptor::new();
        assert!(
            acceptor.feed_all(answer.as_bytes()),
            "seed {seed}: {answer:?}"
        );
        match done.finish_reason {
            FinishReason::Stop => {
                stopped += 1;
                assert!(acceptor.is_done(), "seed {seed}: {answer:?}");
                let value: serde_json::Value = serde_json::from_str(&answer)
                    .unwrap_or_else(|e| panic!("seed {seed}: {answer:?}: {e}"));
                assert!(value.is_object());
            }
            FinishReason::Length => assert!(!acceptor.is_done()),
            other => panic!("seed {seed}: finished {other:?}"),
        }
    }
    eprintln!("{stopped} of 24 objects closed within 48 tokens");
    assert!(stopped > 0, "no object ever closed: the test shows nothing");
}

/// Samples 16 answers of at most `max_tokens` under `schema` with the random model:
/// each is a beginning the schema allows, and each that stops validates (`format`s
/// included). How many stopped.
fn sample_under_schema(schema: &serde_json::Value, max_tokens: u32) -> usize {
    let (engine, _) = engine(true);
    let validator = jsonschema::options()
        .should_validate_formats(true)
        .build(schema)
        .expect("a valid schema");
    let compiled = crate::text::schema::Schema::compile(&schema.to_string()).unwrap();
    let mut stopped = 0;
    for seed in 0..16 {
        // This random model favours whitespace; less of it, and closers a little
        // likelier, so that most objects close within the budget.
        let mut logit_bias: Vec<(u32, f32)> =
            b" \t\r\n".iter().map(|&b| (u32::from(b), -8.0)).collect();
        logit_bias.extend([(CLOSE_BRACE, 4.0), (b']' as u32, 3.0), (b'"' as u32, 3.0)]);
        let sampling = SamplingParams {
            temperature: 1.5,
            seed: Some(seed),
            logit_bias,
            ..SamplingParams::default()
        };
        let format = OutputFormat::JsonSchema {
            schema: schema.to_string(),
        };
        let events = submit_as(&engine, seed + 1, "data:", max_tokens, sampling, format);
        let (_, answer, done) = collect(events);
        let mut frames = crate::text::schema::FrameStack::default();
        let mut state = crate::text::schema::SchemaState::new(&compiled);
        assert!(
            state.feed_all(&compiled, &mut frames, answer.as_bytes()),
            "seed {seed}: {answer:?}"
        );
        match done.finish_reason {
            FinishReason::Stop => {
                stopped += 1;
                let value: serde_json::Value = serde_json::from_str(&answer)
                    .unwrap_or_else(|e| panic!("seed {seed}: {answer:?}: {e}"));
                let errors: Vec<String> = validator
                    .iter_errors(&value)
                    .map(|e| e.to_string())
                    .collect();
                assert!(errors.is_empty(), "seed {seed}: {answer:?}: {errors:?}");
            }
            FinishReason::Length => assert!(!state.is_done()),
            other => panic!("seed {seed}: finished {other:?}"),
        }
    }
    eprintln!("{stopped} of 16 objects closed within {max_tokens} tokens");
    stopped
}

#[test]
fn json_schema_output_holds_to_the_schema_and_validates_when_it_stops() {
    let schema = serde_json::json!({
        "type": "object",
        "properties": {
            "a": {"type": "integer", "minimum": 0, "maximum": 9},
            "b": {"enum": ["x", "yz"]},
            "c": {"type": "array", "items": {"type": "boolean"}, "maxItems": 2},
            "d": {"type": "string", "maxLength": 3}
        },
        "required": ["a", "b"],
        "additionalProperties": false
    });
    let stopped = sample_under_schema(&schema, 64);
    assert!(
        stopped >= 4,
        "{stopped} objects closed: the test shows little"
    );
}

#[test]
fn patterns_formats_and_tuples_hold_in_sampled_output() {
    let schema = serde_json::json!({
        "type": "object",
        "properties": {
            "day": {"type": "string", "format": "date"},
            "code": {"type": "string", "pattern": "^[A-C]{2}-[0-9]{1,3}$"},
            "id": {"type": "string", "format": "uuid"},
            "pair": {
                "type": "array",
                "prefixItems": [{"type": "integer", "minimum": 0, "maximum": 9}, {"type": "boolean"}],
                "minItems": 2,
                "maxItems": 2
            }
        },
        "required": ["day", "code", "pair"],
        "additionalProperties": false
    });
    let stopped = sample_under_schema(&schema, 96);
    assert!(
        stopped >= 4,
        "{stopped} objects closed: the test shows little"
    );
}

#[test]
fn a_schema_that_cannot_be_enforced_is_refused_before_anything_runs() {
    let (engine, _) = engine(true);
    let (tx, _rx) = tokio::sync::mpsc::unbounded_channel();
    let request = GenerateRequest {
        id: 7,
        model: None,
        input: PromptInput::Raw {
            text: "x".into(),
            special: false,
        },
        sampling: SamplingParams::default(),
        max_tokens: Some(4),
        stop: Vec::new(),
        logprobs: None,
    };
    let err = engine
        .submit(Submission {
            format: OutputFormat::JsonSchema {
                schema: r#"{"type":"object","properties":{"a":{"not":{}}}}"#.into(),
            },
            conn: 1,
            client: ClientInfo::default(),
            request,
            options: Vec::new(),
            split_reasoning: true,
            token_bytes: true,
            arrived: Instant::now(),
            events: tx,
        })
        .expect_err("refused");
    assert_eq!(err.kind, ErrorKind::InvalidRequest);
    assert_eq!(err.id, Some(7));
    assert!(
        err.message.contains("#/properties/a") && err.message.contains("`not`"),
        "{}",
        err.message
    );
}

/// A chat with two tools, its answer held to one call from the first token.
fn submit_tool_chat(
    engine: &EngineHandle,
    id: u64,
    tools: Vec<spark_client::protocol::ToolSpec>,
    choice: spark_client::protocol::ToolChoice,
    sampling: SamplingParams,
    options: Vec<GenerateOption>,
) -> tokio::sync::mpsc::UnboundedReceiver<ServerMessage> {
    use spark_client::protocol::ToolChatMessage;
    let request = GenerateRequest {
        id,
        model: None,
        input: PromptInput::ChatWithTools {
            messages: vec![ToolChatMessage::new("user", "weather?")],
            tools,
            choice,
            parallel: false,
        },
        sampling,
        max_tokens: Some(64),
        stop: Vec::new(),
        logprobs: None,
    };
    submit_with_options(engine, request, OutputFormat::Text, options, true).expect("accepted")
}

#[test]
fn a_required_tool_call_names_an_offered_tool_with_valid_arguments() {
    // The model's own template knows no tools: they are described, Hermes syntax.
    let called = required_calls(EngineConfig::new("tiny"), CallSyntax::Hermes);
    eprintln!("{called} of 16 calls complete within 64 tokens");
    assert!(called > 0, "no call ever completed: the test shows nothing");
}

/// A template that writes calls as Llama 3.1 to 3.3 do: the whole answer is
/// `{"name": ..., "parameters": ...}`, results come back as `ipython` turns.
const LLAMA_STYLE_TEMPLATE: &str = r#"{%- if tools %}Functions (answer with {"name": function name, "parameters": arguments}):
{% for t in tools %}{{ t | tojson }}
{% endfor %}{% endif %}
{%- for m in messages %}{% if m.tool_calls %}assistant: {"name": "{{ m.tool_calls[0].function.name }}", "parameters": {{ m.tool_calls[0].function.arguments | tojson }}}
{% elif m.role == "tool" %}ipython: {{ m.content }}
{% else %}{{ m.role }}: {{ m.content }}
{% endif %}{% endfor %}assistant: "#;

#[test]
fn a_required_call_in_the_llama_syntax_is_the_whole_answer() {
    use crate::text::tools::{prompt::TemplateTools, CallSyntax};
    let template = crate::text::ChatTemplate::new(LLAMA_STYLE_TEMPLATE).expect("compiles");
    assert_eq!(
        template.tools(),
        TemplateTools::Native(CallSyntax::LlamaJson)
    );
    let config = EngineConfig {
        chat_template: Some(LLAMA_STYLE_TEMPLATE.into()),
        ..EngineConfig::new("tiny")
    };
    let called = required_calls(config, CallSyntax::LlamaJson);
    eprintln!("{called} of 16 calls complete within 64 tokens");
    assert!(called > 0, "no call ever completed: the test shows nothing");
}

/// A template that writes calls as Mistral Nemo's does: `[TOOL_CALLS]` and an array of
/// calls, with ids of nine letters and digits (it refuses any other).
const MISTRAL_STYLE_TEMPLATE: &str = r#"{%- for m in messages %}
{%- if m.role == "user" and loop.last and tools %}[AVAILABLE_TOOLS]{{ tools | tojson }}[/AVAILABLE_TOOLS]{% endif %}
{%- if m.tool_calls %}[TOOL_CALLS][{% for c in m.tool_calls %}{% if c.id | length != 9 %}{{ raise_exception("Tool call IDs should be alphanumeric strings with length 9!") }}{% endif %}{"name": "{{ c.function.name }}", "arguments": {{ c.function.arguments | tojson }}, "id": "{{ c.id }}"}{% endfor %}]</s>
{%- elif m.role == "tool" %}[TOOL_RESULTS]{"content": {{ m.content | tojson }}, "call_id": "{{ m.tool_call_id }}"}[/TOOL_RESULTS]
{%- else %}[INST]{{ m.content }}[/INST]{% endif %}{% endfor %}"#;

/// A template that writes calls as Mistral Small 3.2's does (`[TOOL_CALLS]`, the name,
/// `[CALL_ID]` and the id, `[ARGS]`, the arguments) or, without ids, as Devstral's.
fn mistral_args_template(call_ids: bool) -> String {
    let id = if call_ids { "[CALL_ID]{{ c.id }}" } else { "" };
    format!(
        r#"{{%- for m in messages %}}
{{%- if m.role == "user" and loop.last and tools %}}[AVAILABLE_TOOLS]{{{{ tools | tojson }}}}[/AVAILABLE_TOOLS]{{% endif %}}
{{%- if m.tool_calls %}}{{% for c in m.tool_calls %}}{{% if c.id | length != 9 %}}{{{{ raise_exception("Tool call IDs should be alphanumeric strings with length 9!") }}}}{{% endif %}}[TOOL_CALLS]{{{{ c.function.name }}}}{id}[ARGS]{{{{ c.function.arguments | tojson }}}}{{% endfor %}}</s>
{{%- elif m.role == "tool" %}}[TOOL_RESULTS]{{{{ m.tool_call_id }}}}[TOOL_CONTENT]{{{{ m.content }}}}[/TOOL_RESULTS]
{{%- else %}}[INST]{{{{ m.content }}}}[/INST]{{% endif %}}{{% endfor %}}"#
    )
}

#[test]
fn a_required_call_in_the_mistral_args_syntax_names_an_offered_tool() {
    use crate::text::tools::{prompt::TemplateTools, CallSyntax};
    for call_ids in [false, true] {
        let source = mistral_args_template(call_ids);
        let template = crate::text::ChatTemplate::new(&source).expect("compiles");
        assert_eq!(
            template.tools(),
            TemplateTools::Native(CallSyntax::MistralArgs { call_ids }),
            "{source}"
        );
        let config = EngineConfig {
            chat_template: Some(source),
            ..EngineConfig::new("tiny")
        };
        let called = required_calls(config, CallSyntax::MistralArgs { call_ids });
        eprintln!("call ids {call_ids}: {called} of 16 calls complete within 64 tokens");
        assert!(called > 0, "no call ever completed: the test shows nothing");
    }
}

#[test]
fn a_required_call_in_the_mistral_syntax_is_an_array_of_one_call() {
    use crate::text::tools::{prompt::TemplateTools, CallSyntax};
    let template = crate::text::ChatTemplate::new(MISTRAL_STYLE_TEMPLATE).expect("compiles");
    assert_eq!(
        template.tools(),
        TemplateTools::Native(CallSyntax::Mistral),
        "the probe call renders, its id mapped to nine characters"
    );
    let config = EngineConfig {
        chat_template: Some(MISTRAL_STYLE_TEMPLATE.into()),
        ..EngineConfig::new("tiny")
    };
    let called = required_calls(config, CallSyntax::Mistral);
    eprintln!("{called} of 16 calls complete within 64 tokens");
    assert!(called > 0, "no call ever completed: the test shows nothing");
}

/// Asks for a required call 16 times (sampled from the random model) and checks each
/// answer: one call of an offered tool with valid arguments and no text, or, cut short,
/// the call's text so far (its first bytes in `syntax`). Every other request streams its
/// call: its pieces come first and add up to it, and cut short after its opening it
/// stays in pieces rather than coming back as text. How many calls completed.
fn required_calls(config: EngineConfig, syntax: CallSyntax) -> usize {
    // What a call cut short begins with (or a beginning of it, for a header).
    let starts: &[&str] = match syntax {
        CallSyntax::Hermes | CallSyntax::LlamaJson => &["{"],
        CallSyntax::Mistral => &["["],
        CallSyntax::MistralArgs { .. } => &["get_weather", "now"],
    };
    use spark_client::protocol::{ToolChoice, ToolSpec};
    // The tools' description in the system message needs more than 512 positions.
    let spec = SynthSpec {
        context_length: 2048,
        ..SynthSpec::tiny()
    };
    let (engine, _) = engine_of(&spec, config, 128, None);
    let weather = serde_json::json!({
        "type": "object",
        "properties": {
            "city": {"type": "string", "maxLength": 6},
            "unit": {"enum": ["c", "f"]}
        },
        "required": ["city"],
        "additionalProperties": false
    });
    let tools = vec![
        ToolSpec {
            name: "get_weather".into(),
            description: "The weather in a city".into(),
            parameters: weather.to_string(),
            strict: true,
        },
        ToolSpec {
            name: "now".into(),
            description: String::new(),
            parameters: String::new(),
            strict: false,
        },
    ];
    let validator = jsonschema::validator_for(&weather).expect("a valid schema");
    let mut called = 0;
    for seed in 0..16 {
        let mut logit_bias: Vec<(u32, f32)> =
            b" \t\r\n".iter().map(|&b| (u32::from(b), -8.0)).collect();
        logit_bias.extend([(CLOSE_BRACE, 4.0), (b'"' as u32, 3.0)]);
        if syntax == CallSyntax::Mistral {
            logit_bias.push((b']' as u32, 4.0));
        }
        let sampling = SamplingParams {
            temperature: 1.5,
            seed: Some(seed),
            logit_bias,
            ..SamplingParams::default()
        };
        let stream = seed % 2 == 1;
        let options = if stream {
            vec![GenerateOption::StreamToolCalls]
        } else {
            Vec::new()
        };
        let mut events = submit_tool_chat(
            &engine,
            seed + 1,
            tools.clone(),
            ToolChoice::Required,
            sampling,
            options,
        );
        let (mut text, mut calls, mut pieces) = (String::new(), Vec::new(), Vec::new());
        let done = loop {
            match events.blocking_recv().expect("a Done") {
                ServerMessage::Token(t) => text.push_str(&t.text),
                ServerMessage::ToolCall(c) => calls.push(c),
                ServerMessage::ToolCallDelta(d) if stream => {
                    assert!(calls.is_empty(), "seed {seed}: a piece after its call");
                    assert_eq!((d.id, d.index), (seed + 1, 0), "seed {seed}");
                    assert_eq!(d.opening.is_some(), pieces.is_empty(), "seed {seed}");
                    pieces.push(d);
                }
                ServerMessage::Done(done) => break done,
                ServerMessage::Prefilled(_) => {}
                other => panic!("unexpected {other:?}"),
            }
        };
        let opening = pieces.first().and_then(|p| p.opening.clone());
        let streamed: String = pieces.iter().map(|p| p.arguments.as_str()).collect();
        if let (Some(opening), Some(call)) = (&opening, calls.first()) {
            assert_eq!(
                (&opening.id, &opening.name),
                (&call.call.id, &call.call.name)
            );
            assert_eq!(streamed, call.call.arguments, "seed {seed}");
        }
        assert!(
            !stream || done.finish_reason != FinishReason::Stop || opening.is_some(),
            "seed {seed}: a streamed call without pieces"
        );
        match done.finish_reason {
            FinishReason::Stop => {
                called += 1;
                assert_eq!(calls.len(), 1, "seed {seed}: one call, no parallel ones");
                assert_eq!(text, "", "seed {seed}: a call is not text");
                let call = &calls[0];
                assert_eq!((call.id, call.index), (seed + 1, 0));
                if syntax.nine_character_ids() {
                    let id = &call.call.id;
                    assert!(
                        id.len() == 9 && id.bytes().all(|b| b.is_ascii_alphanumeric()),
                        "seed {seed}: Mistral's templates take the id {id:?} back only with nine letters and digits"
                    );
                }
                let arguments: serde_json::Value = serde_json::from_str(&call.call.arguments)
                    .unwrap_or_else(|e| panic!("seed {seed}: {e}"));
                match call.call.name.as_str() {
                    "get_weather" => {
                        let errors: Vec<String> = validator
                            .iter_errors(&arguments)
                            .map(|e| e.to_string())
                            .collect();
                        assert!(errors.is_empty(), "seed {seed}: {arguments}: {errors:?}");
                    }
                    "now" => assert!(arguments.is_object()),
                    other => panic!("seed {seed}: called {other}"),
                }
            }
            // Cut short after a streamed call's opening: its pieces are all of it.
            FinishReason::Length if opening.is_some() => {
                assert!(calls.is_empty() && text.is_empty(), "seed {seed}: {text:?}");
                let name = &opening.as_ref().expect("opened").name;
                assert!(["get_weather", "now"].contains(&name.as_str()));
                assert!(
                    streamed.is_empty() || streamed.starts_with('{'),
                    "{streamed:?}"
                );
            }
            // Cut short: the call's text so far comes back as text, nothing is lost.
            FinishReason::Length => {
                assert!(calls.is_empty());
                let text = text.trim_start();
                assert!(
                    starts
                        .iter()
                        .any(|s| text.starts_with(s) || s.starts_with(text)),
                    "seed {seed}: {text:?}"
                );
            }
            other => panic!("seed {seed}: finished {other:?}"),
        }
    }
    called
}

#[test]
fn tool_requests_that_cannot_be_served_are_refused_with_the_reason() {
    use spark_client::protocol::{ToolChatMessage, ToolChoice, ToolSpec};
    let (engine, _) = engine(true);
    let request = |choice: ToolChoice| GenerateRequest {
        id: 1,
        model: None,
        input: PromptInput::ChatWithTools {
            messages: vec![ToolChatMessage::new("user", "hi")],
            tools: vec![ToolSpec {
                name: "f".into(),
                description: String::new(),
                parameters:
                    r#"{"type":"object","properties":{"z":{"type":"string","pattern":"(?=a)"}}}"#
                        .into(),
                strict: true,
            }],
            choice,
            parallel: true,
        },
        sampling: SamplingParams::default(),
        max_tokens: Some(4),
        stop: Vec::new(),
        logprobs: None,
    };
    let refusal = |request: GenerateRequest, format: OutputFormat| {
        submit_request(&engine, request, format).expect_err("refused")
    };
    let strict = refusal(request(ToolChoice::Auto), OutputFormat::Text);
    assert_eq!(strict.kind, ErrorKind::InvalidRequest);
    assert!(
        strict
            .message
            .starts_with("tools[0] (`f`).parameters: JSON schema at #/properties/z"),
        "{}",
        strict.message
    );
    let unknown = refusal(
        request(ToolChoice::Function("g".into())),
        OutputFormat::Text,
    );
    assert_eq!(
        unknown.message,
        "tool_choice: the function `g` is not among the tools"
    );
    let with_json = refusal(request(ToolChoice::None), OutputFormat::JsonObject);
    assert_eq!(
        with_json.message,
        "tools cannot be combined with JSON output"
    );
}

/// A template whose generation prompt opens the model's thinking, as DeepSeek-R1's and
/// QwQ's do: the answer starts inside the reasoning.
const THINKING_TEMPLATE: &str =
    "{% for m in messages %}{{ m.role }}: {{ m.content }}\n{% endfor %}assistant: <think>\n";

/// A seeded chat generation; its reasoning (the `Reasoning` events' text) and its
/// tokens' text, checking that each `Reasoning` event comes right before a `Token`.
fn chat_parts(engine: &EngineHandle, id: u64, split_reasoning: bool) -> (String, String) {
    chat_parts_with(engine, id, split_reasoning, Vec::new()).expect("accepted")
}

/// [`chat_parts`] with the request's options, or the engine's refusal.
fn chat_parts_with(
    engine: &EngineHandle,
    id: u64,
    split_reasoning: bool,
    options: Vec<GenerateOption>,
) -> Result<(String, String), spark_client::protocol::ErrorEvent> {
    use spark_client::protocol::ChatMessage;
    let request = GenerateRequest {
        id,
        model: None,
        input: PromptInput::Chat {
            messages: vec![ChatMessage::new("user", "Why is the sky blue?")],
        },
        sampling: SamplingParams {
            temperature: 1.0,
            seed: Some(11),
            ..SamplingParams::default()
        },
        max_tokens: Some(24),
        stop: Vec::new(),
        logprobs: None,
    };
    let mut rx = submit_with_options(
        engine,
        request,
        OutputFormat::Text,
        options,
        split_reasoning,
    )?;
    let (mut reasoning, mut text, mut after_reasoning) = (String::new(), String::new(), false);
    while let Some(msg) = rx.blocking_recv() {
        match msg {
            ServerMessage::Prefilled(_) => {}
            ServerMessage::Reasoning(r) => {
                assert!(!after_reasoning, "two Reasoning events without a Token");
                after_reasoning = true;
                reasoning.push_str(&r.text);
            }
            ServerMessage::Token(t) => {
                after_reasoning = false;
                text.push_str(&t.text);
            }
            ServerMessage::Done(done) => {
                assert_eq!(done.usage.completion_tokens, 24);
                assert!(!after_reasoning, "a Reasoning event without its Token");
                return Ok((reasoning, text));
            }
            other => panic!("unexpected {other:?}"),
        }
    }
    panic!("stream ended without Done");
}

#[test]
fn reasoning_goes_apart_only_for_clients_that_split_it() {
    let config = EngineConfig {
        chat_template: Some(THINKING_TEMPLATE.into()),
        ..EngineConfig::new("tiny")
    };
    let (thinking, _) = engine_with(config, 64, None);
    // An old client gets everything as the tokens' text.
    let (none, whole) = chat_parts(&thinking, 1, false);
    assert!(none.is_empty() && !whole.is_empty(), "{whole:?}");
    assert!(
        !whole.contains("</think>"),
        "the random model closed its thinking"
    );
    // The same tokens (same seed), split: the unclosed thinking is all reasoning.
    let (reasoning, answer) = chat_parts(&thinking, 2, true);
    assert_eq!((reasoning.as_str(), answer.as_str()), (whole.as_str(), ""));

    // A prompt that leaves thinking to the model: nothing is reasoning unless the
    // answer opens with `<think>`, which the random model does not write.
    let (plain, _) = engine(true);
    let (reasoning, answer) = chat_parts(&plain, 3, true);
    assert!(reasoning.is_empty() && !answer.is_empty(), "{reasoning:?}");
}

/// A template with Qwen 3's switch: thinking opened in the prompt unless the caller sets
/// `enable_thinking` to false, which writes an empty, closed thinking block instead.
const SWITCHED_THINKING_TEMPLATE: &str = "{% for m in messages %}{{ m.role }}: {{ m.content }}\n{% endfor %}assistant: {% if enable_thinking is defined and enable_thinking is false %}<think>\n\n</think>\n\n{% else %}<think>\n{% endif %}";

fn template_vars(json: &str) -> Vec<GenerateOption> {
    vec![GenerateOption::TemplateVariables(json.into())]
}

#[test]
fn template_variables_switch_a_models_thinking_per_request_and_by_default() {
    let config = EngineConfig {
        chat_template: Some(SWITCHED_THINKING_TEMPLATE.into()),
        ..EngineConfig::new("tiny")
    };
    let (engine, _) = engine_with(config.clone(), 64, None);
    // The template opens the thinking: the random model never closes it, so the
    // whole answer is reasoning.
    let (reasoning, answer) = chat_parts(&engine, 1, true);
    assert!(!reasoning.is_empty() && answer.is_empty(), "{answer:?}");
    // Thinking switched off for this request: the prompt closed it, all is answer.
    let off = chat_parts_with(
        &engine,
        2,
        true,
        template_vars(r#"{"enable_thinking": false}"#),
    )
    .expect("accepted");
    assert!(off.0.is_empty() && !off.1.is_empty(), "{off:?}");

    // The daemon's default switches it off for every chat; a request turns it back on.
    let config = EngineConfig {
        chat_template_vars: TemplateVars::parse(r#"{"enable_thinking": false}"#).unwrap(),
        ..config
    };
    let (engine, _) = engine_with(config, 64, None);
    let (reasoning, answer) = chat_parts(&engine, 3, true);
    assert!(reasoning.is_empty() && !answer.is_empty(), "{reasoning:?}");
    let on = chat_parts_with(
        &engine,
        4,
        true,
        template_vars(r#"{"enable_thinking": true}"#),
    )
    .expect("accepted");
    assert!(!on.0.is_empty() && on.1.is_empty(), "{on:?}");
}

#[test]
fn bad_template_variables_are_refused_with_what_is_wrong() {
    let config = EngineConfig {
        chat_template: Some(SWITCHED_THINKING_TEMPLATE.into()),
        ..EngineConfig::new("tiny")
    };
    let (engine, _) = engine_with(config, 64, None);
    let refused = |options| chat_parts_with(&engine, 9, true, options).expect_err("refused");
    for (json, says) in [
        ("[true]", "must be a JSON object"),
        ("{\"enable_thinking\": fal", "not JSON"),
        (r#"{"messages": []}"#, "`messages` is set by sparkd itself"),
        (
            r#"{"add_generation_prompt": false}"#,
            "`add_generation_prompt` is set by sparkd",
        ),
    ] {
        let err = refused(template_vars(json));
        assert_eq!(err.kind, ErrorKind::InvalidRequest, "{json}");
        assert_eq!(err.id, Some(9));
        assert!(
            err.message.starts_with("chat_template_kwargs: "),
            "{}",
            err.message
        );
        assert!(err.message.contains(says), "{json}: {}", err.message);
    }
    let mut twice = template_vars("{}");
    twice.extend(template_vars("{}"));
    assert!(refused(twice).message.contains("given twice"));
    let huge = format!(r#"{{"x": "{}"}}"#, "a".repeat(MAX_TEMPLATE_VARIABLES_BYTES));
    assert!(refused(template_vars(&huge)).message.contains("at most"));

    // A raw prompt has no template to give them to.
    let raw = GenerateRequest {
        id: 10,
        model: None,
        input: PromptInput::Raw {
            text: "x".into(),
            special: false,
        },
        sampling: SamplingParams::default(),
        max_tokens: Some(2),
        stop: Vec::new(),
        logprobs: None,
    };
    let vars = template_vars(r#"{"enable_thinking": false}"#);
    let raw =
        submit_with_options(&engine, raw, OutputFormat::Text, vars, true).expect_err("refused");
    assert_eq!(raw.kind, ErrorKind::InvalidRequest);
    assert!(raw.message.contains("raw prompt"), "{}", raw.message);
}

#[test]
fn the_watcher_reads_a_control_token_only_when_it_is_a_tag_of_the_syntax() {
    use super::core::tool_watch_bytes;
    use crate::text::tools::CallSyntax;
    let mut spec = crate::text::bpe_spec("gpt-2");
    for tag in ["[TOOL_CALLS]", "<tool_call>", "</tool_call>", "[INST]"] {
        spec.tokens.push(tag.into());
        spec.token_types.as_mut().expect("types").push(3);
    }
    let tok = crate::text::Tokenizer::new(spec).expect("a vocabulary");
    let id = |text: &str| tok.token_id(text).expect(text);
    let stream = crate::text::StreamDecoder::skipping_control();
    let read = |text: &str, syntax| tool_watch_bytes(&tok, id(text), syntax, &stream).to_vec();
    assert_eq!(read("[TOOL_CALLS]", CallSyntax::Mistral), b"[TOOL_CALLS]");
    assert_eq!(read("[TOOL_CALLS]", CallSyntax::Hermes), b"");
    assert_eq!(read("<tool_call>", CallSyntax::Hermes), b"<tool_call>");
    assert_eq!(read("</tool_call>", CallSyntax::Hermes), b"</tool_call>");
    assert_eq!(read("<tool_call>", CallSyntax::Mistral), b"");
    assert_eq!(read("[INST]", CallSyntax::Mistral), b"");
    assert_eq!(read("<|im_end|>", CallSyntax::LlamaJson), b"");
    // Text tokens pass whatever the syntax.
    assert_eq!(read("hello", CallSyntax::Mistral), b"hello");
    // So do control tokens the text stream shows (a model's thinking tags).
    let shows_inst = crate::text::StreamDecoder::skipping_control_but(vec![id("[INST]")]);
    assert_eq!(
        tool_watch_bytes(&tok, id("[INST]"), CallSyntax::Hermes, &shows_inst),
        b"[INST]"
    );
}

#[test]
fn the_chat_format_says_how_chats_are_rendered_and_read() {
    let format = |template: Option<&str>| {
        let config = EngineConfig {
            chat_template: template.map(str::to_string),
            ..EngineConfig::new("tiny")
        };
        let (engine, _) = engine_of(&SynthSpec::tiny(), config, 64, None);
        engine.chat_format()
    };
    // The synthetic model's ChatML template knows no tools and reads no switches.
    let chatml = format(None);
    assert!(chatml.template && chatml.system_role);
    assert_eq!(chatml.tools, "described");
    assert_eq!(
        (chatml.think_open.as_str(), chatml.think_close.as_str()),
        ("<think>", "</think>")
    );
    assert!(chatml.variables.is_empty(), "{:?}", chatml.variables);
    let switched = format(Some(SWITCHED_THINKING_TEMPLATE));
    assert_eq!(switched.variables, ["enable_thinking"]);
    assert_eq!(format(Some(MISTRAL_STYLE_TEMPLATE)).tools, "mistral");
    assert_eq!(
        format(Some(&mistral_args_template(true))).tools,
        "mistral-args-ids"
    );
    assert_eq!(format(Some(LLAMA_STYLE_TEMPLATE)).tools, "llama");
}

/// A sampled raw generation with `logprobs` alternatives, from a client that reads
/// `TokenBytes` or not: its events, in order.
fn logprob_events(
    engine: &EngineHandle,
    id: u64,
    logprobs: Option<u8>,
    token_bytes: bool,
) -> Vec<ServerMessage> {
    let request = GenerateRequest {
        id,
        model: None,
        input: PromptInput::Raw {
            text: "A prompt".into(),
            special: false,
        },
        sampling: SamplingParams {
            temperature: 1.5,
            seed: Some(7),
            ..SamplingParams::default()
        },
        max_tokens: Some(96),
        stop: Vec::new(),
        logprobs,
    };
    let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel();
    engine
        .submit(Submission {
            format: OutputFormat::Text,
            conn: 1,
            client: ClientInfo::default(),
            request,
            options: Vec::new(),
            split_reasoning: true,
            token_bytes,
            arrived: Instant::now(),
            events: tx,
        })
        .expect("accepted");
    let mut events = Vec::new();
    while let Some(event) = rx.blocking_recv() {
        let done = matches!(event, ServerMessage::Done(_));
        events.push(event);
        if done {
            return events;
        }
    }
    panic!("stream ended without Done");
}

#[test]
fn each_token_with_logprobs_comes_after_its_own_bytes_for_clients_that_read_them() {
    let (engine, _) = engine(false);
    let spec = crate::text::TokenizerSpec::from_gguf(
        GgufFile::from_bytes(synth_gguf(&SynthSpec::tiny()).expect("synth").to_bytes())
            .expect("parse synth")
            .metadata(),
    )
    .expect("a vocabulary");
    let tok = crate::text::Tokenizer::new(spec).expect("a tokenizer");

    let events = logprob_events(&engine, 1, Some(3), true);
    let (mut bytes, mut text, mut tokens, mut partial) = (Vec::new(), String::new(), 0, 0);
    let mut pending: Option<spark_client::protocol::TokenBytesEvent> = None;
    for event in events {
        match event {
            ServerMessage::TokenBytes(raw) => {
                assert_eq!(raw.id, 1);
                assert!(pending.replace(raw).is_none(), "two TokenBytes in a row");
            }
            ServerMessage::Token(t) => {
                let raw = pending.take().expect("each token after its bytes");
                let lp = t.logprobs.expect("logprobs");
                // A control token's bytes are its text, as among the alternatives.
                assert_eq!(raw.bytes, tok.token_bytes(t.token), "token {}", t.token);
                let top: Vec<&[u8]> = lp.top.iter().map(|(id, ..)| tok.token_bytes(*id)).collect();
                assert_eq!(raw.top, top);
                partial += usize::from(std::str::from_utf8(&raw.bytes).is_err());
                // The text stream leaves control tokens out.
                if !tok.is_control(t.token) {
                    bytes.extend_from_slice(&raw.bytes);
                }
                text.push_str(&t.text);
                tokens += 1;
            }
            ServerMessage::Prefilled(_) | ServerMessage::Done(_) => {}
            other => panic!("unexpected {other:?}"),
        }
    }
    assert!(pending.is_none(), "bytes without their token");
    assert!(tokens > 8, "{tokens} tokens");
    assert!(
        partial > 0,
        "no token held part of a character: the test shows nothing"
    );
    // Put end to end, the other tokens' bytes are the text (as the stream decodes it).
    assert_eq!(String::from_utf8_lossy(&bytes), text);

    // Without logprobs, or for a client older than 1.11: no TokenBytes at all.
    for (id, logprobs, token_bytes) in [(2, None, true), (3, Some(3), false)] {
        let events = logprob_events(&engine, id, logprobs, token_bytes);
        assert!(
            !events
                .iter()
                .any(|e| matches!(e, ServerMessage::TokenBytes(_))),
            "logprobs {logprobs:?}, token_bytes {token_bytes}"
        );
    }
}
