//! proptest strategies for every protocol message. Floats are finite so that messages
//! compare equal after a round trip (NaN != NaN); the decoder itself is fed NaN bit
//! patterns by the byte-level fuzzing.

use proptest::collection::vec;
use proptest::option;
use proptest::prelude::*;
use spark_client::protocol::*;

fn text() -> impl Strategy<Value = String> {
    prop_oneof![Just(String::new()), "\\PC{0,16}", "[a-z <|>{}%]{0,8}"]
}

fn float() -> impl Strategy<Value = f32> {
    prop_oneof![Just(0.0f32), -1e6f32..1e6f32]
}

fn double() -> impl Strategy<Value = f64> {
    prop_oneof![Just(0.0f64), -1e9f64..1e9f64]
}

fn sampling() -> impl Strategy<Value = SamplingParams> {
    (
        (float(), any::<u32>(), float(), float(), float()),
        (any::<u32>(), float(), float(), option::of(any::<u64>())),
        vec((any::<u32>(), float()), 0..4),
    )
        .prop_map(
            |(
                (temperature, top_k, top_p, min_p, repeat_penalty),
                (repeat_last_n, presence_penalty, frequency_penalty, seed),
                logit_bias,
            )| SamplingParams {
                temperature,
                top_k,
                top_p,
                min_p,
                repeat_penalty,
                repeat_last_n,
                presence_penalty,
                frequency_penalty,
                seed,
                logit_bias,
            },
        )
}

fn prompt() -> impl Strategy<Value = PromptInput> {
    prop_oneof![
        vec((text(), text()), 0..4).prop_map(|m| PromptInput::Chat {
            messages: m.into_iter().map(|(r, c)| ChatMessage::new(r, c)).collect()
        }),
        (text(), any::<bool>()).prop_map(|(text, special)| PromptInput::Raw { text, special }),
    ]
}

fn generate() -> impl Strategy<Value = GenerateRequest> {
    (
        any::<u64>(),
        option::of(text()),
        prompt(),
        sampling(),
        option::of(any::<u32>()),
        vec(text(), 0..3),
        option::of(any::<u8>()),
    )
        .prop_map(
            |(id, model, input, sampling, max_tokens, stop, logprobs)| GenerateRequest {
                id,
                model,
                input,
                sampling,
                max_tokens,
                stop,
                logprobs,
            },
        )
}

pub fn client_message() -> impl Strategy<Value = ClientMessage> {
    prop_oneof![
        (any::<u16>(), any::<u16>(), text()).prop_map(|(major, minor, client)| {
            ClientMessage::Hello(Hello {
                major,
                minor,
                client,
            })
        }),
        generate().prop_map(ClientMessage::Generate),
        any::<u64>().prop_map(|id| ClientMessage::Cancel { id }),
        (any::<u64>(), text(), any::<bool>())
            .prop_map(|(id, text, special)| ClientMessage::Tokenize { id, text, special }),
        any::<u64>().prop_map(|id| ClientMessage::Status { id }),
        (any::<u64>(), any::<u32>()).prop_map(|(id, limit)| ClientMessage::Jobs { id, limit }),
        any::<u64>().prop_map(|id| ClientMessage::Models { id }),
        (any::<u64>(), external_job()).prop_map(|(id, job)| ClientMessage::RecordJob { id, job }),
        any::<u64>().prop_map(|id| ClientMessage::CacheStatus { id }),
        any::<u64>().prop_map(|id| ClientMessage::ChatFormat { id }),
        (
            generate(),
            prop_oneof![Just(OutputFormat::Text), Just(OutputFormat::JsonObject)]
        )
            .prop_map(|(request, format)| ClientMessage::GenerateFormatted { request, format }),
        (
            generate(),
            prop_oneof![Just(OutputFormat::Text), Just(OutputFormat::JsonObject)],
            vec(text().prop_map(GenerateOption::TemplateVariables), 0..3),
        )
            .prop_map(|(request, format, options)| ClientMessage::GenerateWith {
                request,
                format,
                options,
            }),
    ]
}

fn external_job() -> impl Strategy<Value = ExternalJob> {
    let counts = prop_oneof![
        Just(CountSource::Reported),
        Just(CountSource::Estimated),
        Just(CountSource::Unknown),
    ];
    let clock = prop_oneof![
        Just(DecodeClock::None),
        Just(DecodeClock::Engine),
        Just(DecodeClock::Stream),
        Just(DecodeClock::Request),
    ];
    (
        (text(), text(), text(), any::<u64>()),
        (any::<u64>(), any::<u64>(), usage(), timings()),
        (finish_reason(), counts, clock, any::<u16>()),
    )
        .prop_map(|(a, b, c)| ExternalJob {
            engine: a.0,
            upstream: a.1,
            model: a.2,
            request_id: a.3,
            started_unix_ms: b.0,
            finished_unix_ms: b.1,
            usage: b.2,
            timings: b.3,
            finish_reason: c.0,
            counts: c.1,
            decode_clock: c.2,
            http_status: c.3,
        })
}

fn finish_reason() -> impl Strategy<Value = FinishReason> {
    prop_oneof![
        Just(FinishReason::Stop),
        Just(FinishReason::Length),
        Just(FinishReason::Cancelled),
        Just(FinishReason::Disconnected),
        Just(FinishReason::Shutdown),
        Just(FinishReason::Error),
    ]
}

fn error_kind() -> impl Strategy<Value = ErrorKind> {
    prop_oneof![
        Just(ErrorKind::BadFrame),
        Just(ErrorKind::FrameTooLarge),
        Just(ErrorKind::Handshake),
        Just(ErrorKind::VersionMismatch),
        Just(ErrorKind::Busy),
        Just(ErrorKind::InvalidRequest),
        Just(ErrorKind::ContextOverflow),
        Just(ErrorKind::UnknownModel),
        Just(ErrorKind::DuplicateId),
        Just(ErrorKind::NotAllowed),
        Just(ErrorKind::Engine),
        Just(ErrorKind::ShuttingDown),
        Just(ErrorKind::Internal),
    ]
}

fn usage() -> impl Strategy<Value = Usage> {
    (any::<u32>(), any::<u32>()).prop_map(|(prompt_tokens, completion_tokens)| Usage {
        prompt_tokens,
        completion_tokens,
    })
}

fn timings() -> impl Strategy<Value = Timings> {
    (
        (double(), option::of(double()), double(), double()),
        (double(), option::of(double()), option::of(double())),
    )
        .prop_map(
            |(
                (queue_ms, ttft_ms, prefill_ms, generation_ms),
                (decode_ms, decode_tps, prefill_tps),
            )| Timings {
                queue_ms,
                ttft_ms,
                prefill_ms,
                generation_ms,
                decode_ms,
                decode_tps,
                prefill_tps,
            },
        )
}

fn model_info() -> impl Strategy<Value = ModelInfo> {
    (
        (text(), text(), text(), text()),
        (any::<u64>(), any::<u32>(), any::<u64>()),
    )
        .prop_map(
            |(
                (name, path, architecture, quantization),
                (parameters, context_length, file_bytes),
            )| {
                ModelInfo {
                    name,
                    path,
                    architecture,
                    quantization,
                    parameters,
                    context_length,
                    file_bytes,
                }
            },
        )
}

fn status_report() -> impl Strategy<Value = StatusReport> {
    (
        (text(), model_info(), text(), text()),
        (any::<u64>(), double(), any::<u32>(), any::<u32>()),
        (any::<u32>(), any::<u32>(), any::<u32>()),
        (any::<u64>(), any::<u64>(), any::<u64>()),
    )
        .prop_map(|(a, b, c, d)| StatusReport {
            daemon_version: a.0,
            model: a.1,
            backend: a.2,
            device: a.3,
            resident_bytes: b.0,
            uptime_s: b.1,
            running: b.2,
            queued: b.3,
            kv_blocks_used: c.0,
            kv_blocks_total: c.1,
            kv_block_tokens: c.2,
            requests_served: d.0,
            tokens_generated: d.1,
            prompt_tokens_processed: d.2,
        })
}

fn job_record() -> impl Strategy<Value = JobRecord> {
    (
        (
            any::<u64>(),
            any::<u64>(),
            option::of(any::<u32>()),
            option::of(any::<u32>()),
        ),
        (text(), text(), any::<u64>(), any::<u64>()),
        (usage(), timings(), finish_reason(), any::<bool>()),
    )
        .prop_map(|(a, b, c)| JobRecord {
            job: a.0,
            request_id: a.1,
            client_pid: a.2,
            client_uid: a.3,
            model: b.0,
            engine: b.1,
            started_unix_ms: b.2,
            finished_unix_ms: b.3,
            usage: c.0,
            timings: c.1,
            finish_reason: c.2,
            estimated: c.3,
        })
}

fn token_event() -> impl Strategy<Value = TokenEvent> {
    (
        any::<u64>(),
        any::<u32>(),
        text(),
        option::of((float(), vec((any::<u32>(), text(), float()), 0..4))),
    )
        .prop_map(|(id, token, text, logprobs)| TokenEvent {
            id,
            token,
            text,
            logprobs: logprobs.map(|(logprob, top)| TokenLogprobs { logprob, top }),
        })
}

pub fn server_message() -> impl Strategy<Value = ServerMessage> {
    prop_oneof![
        (any::<u16>(), any::<u16>(), text(), any::<u32>()).prop_map(
            |(major, minor, daemon_version, max_frame_bytes)| ServerMessage::Welcome(Welcome {
                major,
                minor,
                daemon_version,
                max_frame_bytes
            })
        ),
        token_event().prop_map(ServerMessage::Token),
        (any::<u64>(), finish_reason(), usage(), timings()).prop_map(
            |(id, finish_reason, usage, timings)| ServerMessage::Done(DoneEvent {
                id,
                finish_reason,
                usage,
                timings
            })
        ),
        (option::of(any::<u64>()), error_kind(), text()).prop_map(|(id, kind, message)| {
            ServerMessage::Error(ErrorEvent { id, kind, message })
        }),
        (any::<u64>(), vec((any::<u32>(), text()), 0..4)).prop_map(|(id, t)| {
            ServerMessage::Tokens {
                id,
                tokens: t
                    .into_iter()
                    .map(|(id, piece)| TokenPiece { id, piece })
                    .collect(),
            }
        }),
        (any::<u64>(), status_report())
            .prop_map(|(id, status)| ServerMessage::Status { id, status }),
        (any::<u64>(), vec(job_record(), 0..3))
            .prop_map(|(id, jobs)| ServerMessage::Jobs { id, jobs }),
        (any::<u64>(), vec(model_info(), 0..3))
            .prop_map(|(id, models)| ServerMessage::Models { id, models }),
        (any::<u64>(), job_record()).prop_map(|(id, job)| ServerMessage::Recorded { id, job }),
        (any::<u64>(), any::<u32>(), any::<u32>()).prop_map(
            |(id, prompt_tokens, cached_tokens)| {
                ServerMessage::Prefilled(PrefillEvent {
                    id,
                    prompt_tokens,
                    cached_tokens,
                })
            }
        ),
        (
            any::<u64>(),
            any::<bool>(),
            any::<[u32; 2]>(),
            any::<[u64; 2]>()
        )
            .prop_map(|(id, enabled, blocks, totals)| ServerMessage::CacheStatus {
                id,
                cache: CacheReport {
                    enabled,
                    cached_blocks: blocks[0],
                    idle_blocks: blocks[1],
                    evicted_blocks: totals[0],
                    prompt_tokens_reused: totals[1],
                },
            }),
        (
            any::<u64>(),
            any::<[bool; 2]>(),
            vec(text(), 0..4),
            vec(text(), 0..4)
        )
            .prop_map(|(id, flags, tags, variables)| ServerMessage::ChatFormat {
                id,
                format: ChatFormatReport {
                    template: flags[0],
                    tools: tags.first().cloned().unwrap_or_default(),
                    system_role: flags[1],
                    think_open: tags.get(1).cloned().unwrap_or_default(),
                    think_close: tags.get(2).cloned().unwrap_or_default(),
                    variables,
                },
            }),
    ]
}
