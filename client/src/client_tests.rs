//! The client against a scripted daemon on the other end of a socket pair: handshake
//! outcomes, routing, and how the end of a connection reaches every waiter.

use std::time::Duration;

use futures::{SinkExt, StreamExt};
use tokio::net::UnixStream;
use tokio_util::codec::Framed;

use super::*;
use crate::protocol::{
    DoneEvent, FinishReason, GenerateOption, PromptInput, SamplingParams, TokenEvent,
};

type Daemon = Framed<UnixStream, MessageCodec<ClientMessage, ServerMessage>>;

fn welcome(major: u16) -> ServerMessage {
    welcome_minor(major, 0)
}

fn welcome_minor(major: u16, minor: u16) -> ServerMessage {
    ServerMessage::Welcome(Welcome {
        major,
        minor,
        daemon_version: "test".into(),
        max_frame_bytes: 1024,
    })
}

fn options() -> ConnectOptions {
    ConnectOptions {
        handshake_timeout: Duration::from_secs(5),
        ..ConnectOptions::default()
    }
}

/// A client connected to a scripted daemon that answered `Hello` with `Welcome`.
async fn connected() -> (Client, Daemon) {
    connected_minor(0).await
}

/// As `connected`, with a daemon announcing protocol minor `minor`.
async fn connected_minor(minor: u16) -> (Client, Daemon) {
    let (ours, theirs) = UnixStream::pair().unwrap();
    let mut daemon = Framed::new(theirs, MessageCodec::new(1 << 20));
    let script = async {
        assert!(matches!(
            daemon.next().await,
            Some(Ok(ClientMessage::Hello(_)))
        ));
        daemon
            .send(welcome_minor(PROTOCOL_MAJOR, minor))
            .await
            .unwrap();
    };
    let options = options();
    let (client, ()) = tokio::join!(Client::from_stream(ours, &options), script);
    (client.unwrap(), daemon)
}

async fn refused_with(answer: Option<ServerMessage>) -> ClientError {
    let (ours, theirs) = UnixStream::pair().unwrap();
    let mut daemon = Framed::new(
        theirs,
        MessageCodec::<ClientMessage, ServerMessage>::new(1 << 20),
    );
    let script = async move {
        let _ = daemon.next().await;
        if let Some(answer) = answer {
            daemon.send(answer).await.unwrap();
        }
        // Dropping `daemon` closes the connection.
    };
    let options = options();
    let (client, ()) = tokio::join!(Client::from_stream(ours, &options), script);
    client.expect_err("handshake must fail")
}

fn request(id: u64) -> GenerateRequest {
    GenerateRequest {
        id,
        model: None,
        input: PromptInput::Raw {
            text: "x".into(),
            special: false,
        },
        sampling: SamplingParams::default(),
        max_tokens: None,
        stop: Vec::new(),
        logprobs: None,
    }
}

fn token(id: u64, n: u32) -> ServerMessage {
    ServerMessage::Token(TokenEvent {
        id,
        token: n,
        text: format!("{n}"),
        logprobs: None,
    })
}

fn done(id: u64) -> ServerMessage {
    ServerMessage::Done(DoneEvent {
        id,
        finish_reason: FinishReason::Stop,
        usage: Default::default(),
        timings: Default::default(),
    })
}

#[tokio::test]
async fn hello_carries_our_version_and_name() {
    let (ours, theirs) = UnixStream::pair().unwrap();
    let mut daemon = Framed::new(
        theirs,
        MessageCodec::<ClientMessage, ServerMessage>::new(1 << 20),
    );
    let script = async {
        match daemon.next().await {
            Some(Ok(ClientMessage::Hello(hello))) => {
                assert_eq!((hello.major, hello.minor), (PROTOCOL_MAJOR, PROTOCOL_MINOR));
                assert_eq!(hello.client, "tester");
            }
            other => panic!("expected Hello, got {other:?}"),
        }
        daemon.send(welcome(PROTOCOL_MAJOR)).await.unwrap();
    };
    let options = ConnectOptions {
        client_name: "tester".into(),
        ..options()
    };
    let (client, ()) = tokio::join!(Client::from_stream(ours, &options), script);
    assert_eq!(client.unwrap().daemon().max_frame_bytes, 1024);
}

#[tokio::test]
async fn version_mismatch_error_from_the_daemon() {
    let refusal = ErrorEvent {
        id: None,
        kind: ErrorKind::VersionMismatch,
        message: "daemon speaks 2.0".into(),
    };
    match refused_with(Some(ServerMessage::Error(refusal))).await {
        ClientError::VersionMismatch { client, daemon } => {
            assert_eq!(client, (PROTOCOL_MAJOR, PROTOCOL_MINOR));
            assert_eq!(daemon, "daemon speaks 2.0");
        }
        other => panic!("expected VersionMismatch, got {other:?}"),
    }
}

#[tokio::test]
async fn welcome_of_another_major_is_a_mismatch() {
    match refused_with(Some(welcome(PROTOCOL_MAJOR + 1))).await {
        ClientError::VersionMismatch { daemon, .. } => {
            assert!(
                daemon.contains(&format!("{}.0", PROTOCOL_MAJOR + 1)),
                "{daemon}"
            )
        }
        other => panic!("expected VersionMismatch, got {other:?}"),
    }
}

#[tokio::test]
async fn daemon_closing_during_the_handshake_is_a_disconnect() {
    assert!(matches!(
        refused_with(None).await,
        ClientError::Disconnected
    ));
}

#[tokio::test]
async fn anything_but_welcome_is_a_protocol_error() {
    assert!(matches!(
        refused_with(Some(done(1))).await,
        ClientError::Protocol(_)
    ));
}

#[tokio::test]
async fn silent_daemon_times_out() {
    let (ours, _theirs) = UnixStream::pair().unwrap();
    let options = ConnectOptions {
        handshake_timeout: Duration::from_millis(50),
        ..options()
    };
    match Client::from_stream(ours, &options).await {
        Err(ClientError::Protocol(message)) => assert!(message.contains("handshake"), "{message}"),
        other => panic!("expected a handshake timeout, got {other:?}"),
    }
}

#[tokio::test]
async fn frames_are_routed_by_id_and_strays_are_dropped() {
    let (client, mut daemon) = connected().await;
    let mut a = client.generate(request(1)).await.unwrap();
    let mut b = client.generate(request(2)).await.unwrap();
    for _ in 0..2 {
        assert!(matches!(
            daemon.next().await,
            Some(Ok(ClientMessage::Generate(_)))
        ));
    }
    for frame in [
        token(2, 0),
        token(99, 0),
        token(1, 0),
        done(99),
        token(2, 1),
        done(1),
        done(2),
    ] {
        daemon.send(frame).await.unwrap();
    }
    let a_events: Vec<_> = (&mut a).map(Result::unwrap).collect().await;
    let b_events: Vec<_> = (&mut b).map(Result::unwrap).collect().await;
    assert!(
        matches!(a_events.as_slice(), [GenerationEvent::Token(t), GenerationEvent::Done(d)] if t.id == 1 && d.id == 1)
    );
    assert!(matches!(
        b_events.as_slice(),
        [GenerationEvent::Token(t0), GenerationEvent::Token(t1), GenerationEvent::Done(d)]
            if t0.token == 0 && t1.token == 1 && d.id == 2
    ));
}

#[tokio::test]
async fn connection_error_reaches_every_waiter_and_later_calls() {
    let (client, mut daemon) = connected().await;
    let mut generation = client.generate(request(1)).await.unwrap();
    let status = {
        let client = client.clone();
        tokio::spawn(async move { client.status().await })
    };
    assert!(matches!(
        daemon.next().await,
        Some(Ok(ClientMessage::Generate(_)))
    ));
    assert!(matches!(
        daemon.next().await,
        Some(Ok(ClientMessage::Status { .. }))
    ));
    let shutdown = ErrorEvent {
        id: None,
        kind: ErrorKind::ShuttingDown,
        message: "bye".into(),
    };
    daemon.send(ServerMessage::Error(shutdown)).await.unwrap();
    drop(daemon);

    assert!(matches!(generation.next().await, Some(Err(ClientError::Busy(m))) if m == "bye"));
    assert!(generation.next().await.is_none());
    assert!(matches!(status.await.unwrap(), Err(ClientError::Busy(_))));
    assert!(matches!(client.models().await, Err(ClientError::Busy(_))));
}

#[tokio::test]
async fn eof_fails_pending_requests_with_disconnected() {
    let (client, mut daemon) = connected().await;
    let mut generation = client.generate(request(1)).await.unwrap();
    assert!(daemon.next().await.is_some());
    daemon.send(token(1, 0)).await.unwrap();
    drop(daemon);
    assert!(matches!(
        generation.next().await,
        Some(Ok(GenerationEvent::Token(_)))
    ));
    assert!(matches!(
        generation.next().await,
        Some(Err(ClientError::Disconnected))
    ));
    assert!(generation.next().await.is_none());
    assert!(matches!(
        client.jobs(1).await,
        Err(ClientError::Disconnected)
    ));
}

#[tokio::test]
async fn dropping_an_unfinished_generation_sends_cancel_and_a_finished_one_does_not() {
    let (client, mut daemon) = connected().await;
    let finished = client.generate(request(1)).await.unwrap();
    assert!(daemon.next().await.is_some());
    daemon.send(done(1)).await.unwrap();
    let (_, last) = finished.collect_text().await.unwrap();
    assert_eq!(last.id, 1);

    let unfinished = client.generate(request(2)).await.unwrap();
    assert!(daemon.next().await.is_some());
    drop(unfinished);
    assert_eq!(
        daemon.next().await.unwrap().unwrap(),
        ClientMessage::Cancel { id: 2 }
    );
    // Late frames for the dropped generation are ignored, and the id is free again.
    daemon.send(token(2, 0)).await.unwrap();
    daemon.send(done(2)).await.unwrap();
    let _again = client.generate(request(2)).await.unwrap();
    assert!(matches!(daemon.next().await, Some(Ok(ClientMessage::Generate(r))) if r.id == 2));
}

#[tokio::test]
async fn a_mistyped_reply_is_a_protocol_error() {
    let (client, mut daemon) = connected().await;
    let status = tokio::spawn(async move { client.status().await });
    let id = match daemon.next().await {
        Some(Ok(ClientMessage::Status { id })) => id,
        other => panic!("expected Status, got {other:?}"),
    };
    daemon
        .send(ServerMessage::Models {
            id,
            models: Vec::new(),
        })
        .await
        .unwrap();
    assert!(matches!(
        status.await.unwrap(),
        Err(ClientError::Protocol(_))
    ));
}

#[tokio::test]
async fn queries_skip_ids_taken_by_caller_chosen_generations() {
    let (client, mut daemon) = connected().await;
    // The caller picked ids the client would hand out next.
    let _one = client.generate(request(1)).await.unwrap();
    let _two = client.generate(request(2)).await.unwrap();
    let status = tokio::spawn(async move { client.status().await.map(|s| s.uptime_s) });
    let mut ids = Vec::new();
    for _ in 0..3 {
        match daemon.next().await {
            Some(Ok(ClientMessage::Generate(r))) => ids.push(r.id),
            Some(Ok(ClientMessage::Status { id })) => {
                assert!(!ids.contains(&id), "status reused generation id {id}");
                let report = crate::protocol::StatusReport {
                    daemon_version: String::new(),
                    model: crate::protocol::ModelInfo {
                        name: String::new(),
                        path: String::new(),
                        architecture: String::new(),
                        quantization: String::new(),
                        parameters: 0,
                        context_length: 0,
                        file_bytes: 0,
                    },
                    backend: String::new(),
                    device: String::new(),
                    resident_bytes: 0,
                    uptime_s: 2.5,
                    running: 0,
                    queued: 0,
                    kv_blocks_used: 0,
                    kv_blocks_total: 0,
                    kv_block_tokens: 0,
                    requests_served: 0,
                    tokens_generated: 0,
                    prompt_tokens_processed: 0,
                };
                daemon
                    .send(ServerMessage::Status { id, status: report })
                    .await
                    .unwrap();
            }
            other => panic!("unexpected {other:?}"),
        }
    }
    assert_eq!(status.await.unwrap().unwrap(), 2.5);
}

#[tokio::test]
async fn requests_over_the_daemons_frame_limit_are_refused_locally() {
    // The scripted daemon announced a 1024-byte limit.
    let (client, mut daemon) = connected().await;
    let mut big = request(1);
    big.input = PromptInput::Raw {
        text: "x".repeat(2000),
        special: false,
    };
    match client.generate(big).await {
        Err(ClientError::InvalidRequest {
            kind: ErrorKind::FrameTooLarge,
            message,
        }) => {
            assert!(message.contains("1024"), "{message}")
        }
        other => panic!("expected FrameTooLarge, got {other:?}"),
    }
    assert!(matches!(
        client.tokenize(&"y".repeat(2000), false).await,
        Err(ClientError::InvalidRequest {
            kind: ErrorKind::FrameTooLarge,
            ..
        })
    ));
    // Nothing was sent, the id is free and the connection still works.
    let _small = client.generate(request(1)).await.unwrap();
    assert!(matches!(daemon.next().await, Some(Ok(ClientMessage::Generate(r))) if r.id == 1));
}

fn external_job() -> crate::protocol::ExternalJob {
    crate::protocol::ExternalJob {
        engine: "llama".into(),
        upstream: "http://127.0.0.1:8091".into(),
        model: "m".into(),
        request_id: 7,
        started_unix_ms: 1_000,
        finished_unix_ms: 2_500,
        usage: crate::protocol::Usage {
            prompt_tokens: 33,
            completion_tokens: 12,
        },
        timings: Default::default(),
        finish_reason: FinishReason::Length,
        counts: crate::protocol::CountSource::Reported,
        decode_clock: crate::protocol::DecodeClock::Stream,
        http_status: 200,
    }
}

#[tokio::test]
async fn record_job_sends_the_job_and_returns_the_daemons_record() {
    let (client, mut daemon) = connected_minor(1).await;
    let recorded = tokio::spawn(async move { client.record_job(external_job()).await });
    let (id, job) = match daemon.next().await {
        Some(Ok(ClientMessage::RecordJob { id, job })) => (id, job),
        other => panic!("expected RecordJob, got {other:?}"),
    };
    assert_eq!(job, external_job());
    let record = job.to_record(41, Some(5), Some(6));
    daemon
        .send(ServerMessage::Recorded {
            id,
            job: record.clone(),
        })
        .await
        .unwrap();
    let got = recorded.await.unwrap().expect("recorded");
    assert_eq!(got, record);
    assert_eq!(
        (got.job, got.engine.as_str(), got.estimated),
        (41, "llama", false)
    );
}

#[tokio::test]
async fn job_entries_asks_a_1_10_daemon_for_entries_and_an_older_one_for_records() {
    let record = external_job().to_record(3, None, None);
    let entry = JobEntry {
        record: record.clone(),
        cached_tokens: Some(16),
    };

    let (client, mut daemon) = connected_minor(10).await;
    let listed = tokio::spawn(async move { client.job_entries(5).await });
    let id = match daemon.next().await {
        Some(Ok(ClientMessage::JobEntries { id, limit: 5 })) => id,
        other => panic!("expected JobEntries, got {other:?}"),
    };
    let jobs = vec![entry.clone()];
    daemon
        .send(ServerMessage::JobEntries { id, jobs })
        .await
        .unwrap();
    assert_eq!(listed.await.unwrap().expect("entries"), [entry]);

    // A 1.9 daemon cannot read `JobEntries`: it gets `Jobs`, and nothing is known of
    // the cache.
    let (client, mut daemon) = connected_minor(9).await;
    let listed = tokio::spawn(async move { client.job_entries(5).await });
    let id = match daemon.next().await {
        Some(Ok(ClientMessage::Jobs { id, limit: 5 })) => id,
        other => panic!("expected Jobs, got {other:?}"),
    };
    let jobs = vec![record.clone()];
    daemon.send(ServerMessage::Jobs { id, jobs }).await.unwrap();
    let got = listed.await.unwrap().expect("records");
    assert_eq!(got, [JobEntry::from(record)]);
    assert_eq!(got[0].cached_tokens, None);
}

/// A request refused locally sent nothing: the next one is the first the daemon sees.
async fn assert_nothing_was_sent(client: Client, mut daemon: Daemon) {
    let status = tokio::spawn(async move { client.jobs(1).await });
    assert!(matches!(
        daemon.next().await,
        Some(Ok(ClientMessage::Jobs { limit: 1, .. }))
    ));
    drop(daemon);
    assert!(status.await.unwrap().is_err());
}

#[tokio::test]
async fn cache_status_is_refused_locally_by_a_1_1_daemon() {
    let (client, daemon) = connected_minor(1).await;
    let err = client.cache_status().await.expect_err("1.1 daemon");
    assert!(matches!(err, ClientError::VersionMismatch { .. }), "{err}");
    assert!(err.to_string().contains("1.2 can"), "{err}");
    assert_nothing_was_sent(client, daemon).await;
}

#[tokio::test]
async fn chat_format_is_refused_locally_by_a_1_7_daemon() {
    let (client, daemon) = connected_minor(7).await;
    let err = client.chat_format().await.expect_err("1.7 daemon");
    assert!(matches!(err, ClientError::VersionMismatch { .. }), "{err}");
    assert!(err.to_string().contains("1.8 can"), "{err}");
    assert_nothing_was_sent(client, daemon).await;
}

#[tokio::test]
async fn record_job_is_refused_locally_by_a_1_0_daemon() {
    let (client, daemon) = connected().await;
    let err = client
        .record_job(external_job())
        .await
        .expect_err("1.0 daemon");
    assert!(matches!(err, ClientError::VersionMismatch { .. }), "{err}");
    assert_nothing_was_sent(client, daemon).await;
}

#[tokio::test]
async fn json_output_is_refused_locally_by_a_1_2_daemon() {
    let (client, daemon) = connected_minor(2).await;
    let err = client
        .generate_as(request(1), OutputFormat::JsonObject)
        .await
        .map(|_| ())
        .expect_err("1.2 daemon");
    assert!(matches!(err, ClientError::VersionMismatch { .. }), "{err}");
    assert!(err.to_string().contains("1.3 can"), "{err}");
    assert_nothing_was_sent(client, daemon).await;
}

#[tokio::test]
async fn a_json_schema_is_refused_locally_by_a_1_3_daemon() {
    let (client, daemon) = connected_minor(3).await;
    let schema = OutputFormat::JsonSchema {
        schema: r#"{"type":"object"}"#.to_string(),
    };
    let err = client
        .generate_as(request(1), schema)
        .await
        .map(|_| ())
        .expect_err("1.3 daemon");
    assert!(matches!(err, ClientError::VersionMismatch { .. }), "{err}");
    assert!(err.to_string().contains("1.4 can"), "{err}");
    assert_nothing_was_sent(client, daemon).await;
}

#[tokio::test]
async fn template_variables_are_refused_locally_by_a_1_6_daemon() {
    let (client, daemon) = connected_minor(6).await;
    let vars = vec![GenerateOption::TemplateVariables("{}".into())];
    let err = client
        .generate_with(request(1), OutputFormat::Text, vars)
        .await
        .map(|_| ())
        .expect_err("1.6 daemon");
    assert!(matches!(err, ClientError::VersionMismatch { .. }), "{err}");
    assert!(err.to_string().contains("1.7 can"), "{err}");
    assert_nothing_was_sent(client, daemon).await;
}

#[tokio::test]
async fn a_preference_an_older_daemon_does_not_know_is_left_out() {
    // A 1.8 daemon: the calls come whole instead of in pieces, and the request goes.
    let (client, mut daemon) = connected_minor(8).await;
    let vars = GenerateOption::TemplateVariables("{}".into());
    let options = vec![GenerateOption::StreamToolCalls, vars.clone()];
    let _older = client
        .generate_with(request(1), OutputFormat::Text, options.clone())
        .await
        .unwrap();
    match daemon.next().await {
        Some(Ok(ClientMessage::GenerateWith { options, .. })) => assert_eq!(options, [vars]),
        other => panic!("{other:?}"),
    }
    // Alone, it leaves no option: the plain message older daemons take.
    let _plain = client
        .generate_with(
            request(2),
            OutputFormat::Text,
            vec![GenerateOption::StreamToolCalls],
        )
        .await
        .unwrap();
    assert!(matches!(
        daemon.next().await,
        Some(Ok(ClientMessage::Generate(GenerateRequest { id: 2, .. })))
    ));
    // A 1.9 daemon gets it.
    let (client, mut daemon) = connected_minor(9).await;
    let _current = client
        .generate_with(request(1), OutputFormat::Text, options.clone())
        .await
        .unwrap();
    match daemon.next().await {
        Some(Ok(ClientMessage::GenerateWith { options: sent, .. })) => assert_eq!(sent, options),
        other => panic!("{other:?}"),
    }
}

#[tokio::test]
async fn options_go_as_generate_with_and_no_options_as_before() {
    let (client, mut daemon) = connected_minor(7).await;
    let _plain = client
        .generate_with(request(1), OutputFormat::Text, Vec::new())
        .await
        .unwrap();
    assert!(matches!(
        daemon.next().await,
        Some(Ok(ClientMessage::Generate(GenerateRequest { id: 1, .. })))
    ));
    let vars = vec![GenerateOption::TemplateVariables(r#"{"a":1}"#.into())];
    let _with = client
        .generate_with(request(2), OutputFormat::JsonObject, vars.clone())
        .await
        .unwrap();
    match daemon.next().await {
        Some(Ok(ClientMessage::GenerateWith {
            request,
            format,
            options,
        })) => {
            assert_eq!(request.id, 2);
            assert_eq!(format, OutputFormat::JsonObject);
            assert_eq!(options, vars);
        }
        other => panic!("{other:?}"),
    }
    // Each kind once, and within its size: refused before anything is sent.
    let twice = [vars.clone(), vars].concat();
    let err = client
        .generate_with(request(3), OutputFormat::Text, twice)
        .await
        .map(|_| ())
        .expect_err("refused");
    assert!(err.to_string().contains("given twice"), "{err}");
    assert_nothing_was_sent(client, daemon).await;
}

#[tokio::test]
async fn plain_text_goes_as_a_1_0_generate_and_json_as_generate_formatted() {
    let (client, mut daemon) = connected_minor(3).await;
    let _text = client
        .generate_as(request(1), OutputFormat::Text)
        .await
        .unwrap();
    assert!(matches!(
        daemon.next().await,
        Some(Ok(ClientMessage::Generate(GenerateRequest { id: 1, .. })))
    ));
    let _json = client
        .generate_as(request(2), OutputFormat::JsonObject)
        .await
        .unwrap();
    assert!(matches!(
        daemon.next().await,
        Some(Ok(ClientMessage::GenerateFormatted {
            request: GenerateRequest { id: 2, .. },
            format: OutputFormat::JsonObject,
        }))
    ));
}
