//! The protocol through raw frames: the handshake, a generation's events, and every way
//! a client can get the framing or the handshake wrong.

use std::time::Duration;

use bytes::BufMut;
use spark_client::protocol::{
    ClientMessage, ErrorEvent, ErrorKind, FinishReason, GenerateOption, OutputFormat, PrefillEvent,
    ServerMessage, PROTOCOL_MAJOR, PROTOCOL_MINOR,
};

use super::{
    fake_engine::{FakeEngine, BUSY_PROMPT, FAIL_PROMPT, PROMPT_CACHED_TOKENS, PROMPT_TOKENS},
    hello, request, wait_until, Raw, TestServer,
};

fn connection_error(message: Option<ServerMessage>) -> ErrorEvent {
    match message {
        Some(ServerMessage::Error(event)) if event.id.is_none() => event,
        other => panic!("expected a connection-level Error, got {other:?}"),
    }
}

/// Reads until generation `id`'s Done: its token indices and the Done.
async fn read_generation(raw: &mut Raw, id: u64) -> (Vec<u32>, spark_client::protocol::DoneEvent) {
    let mut tokens = Vec::new();
    loop {
        match raw.recv().await {
            Some(ServerMessage::Token(token)) if token.id == id => tokens.push(token.token),
            Some(ServerMessage::Done(done)) if done.id == id => return (tokens, done),
            other => panic!("unexpected frame while reading generation {id}: {other:?}"),
        }
    }
}

/// The server is still healthy: a fresh connection completes a generation.
async fn assert_still_serving(server: &TestServer) {
    let mut raw = server.raw_welcomed().await;
    raw.send(&ClientMessage::Generate(request(1, "again", 2)))
        .await;
    let (tokens, done) = read_generation(&mut raw, 1).await;
    assert_eq!(tokens, vec![0, 1]);
    assert_eq!(done.finish_reason, FinishReason::Length);
}

#[tokio::test]
async fn handshake_then_generation_streams_tokens_then_done() {
    let server = TestServer::start(FakeEngine::new(Duration::from_millis(1))).await;
    let mut raw = server.raw().await;
    let welcome = raw.hello().await;
    assert_eq!(
        (welcome.major, welcome.minor),
        (PROTOCOL_MAJOR, PROTOCOL_MINOR)
    );
    assert_eq!(welcome.daemon_version, env!("CARGO_PKG_VERSION"));
    assert_eq!(
        welcome.max_frame_bytes as usize,
        spark_client::protocol::DEFAULT_MAX_FRAME_BYTES
    );

    raw.send(&ClientMessage::Generate(request(42, "hi", 4)))
        .await;
    let (tokens, done) = read_generation(&mut raw, 42).await;
    assert_eq!(tokens, vec![0, 1, 2, 3]);
    assert_eq!(done.usage.completion_tokens, 4);
    assert_eq!(done.usage.prompt_tokens, PROMPT_TOKENS);
    assert_eq!(done.finish_reason, FinishReason::Length);
    assert!(done.timings.ttft_ms.is_some_and(|ms| ms >= 0.0));

    let submissions = server.engine.submissions();
    assert_eq!(submissions.len(), 1);
    let (_, client, id) = submissions[0];
    assert_eq!(id, 42);
    assert_eq!(client.uid, Some(spark_client::current_uid()));
    assert_eq!(client.pid, Some(std::process::id()));
}

#[tokio::test]
async fn generations_on_one_connection_interleave_and_each_ends_with_done() {
    let server = TestServer::start(FakeEngine::new(Duration::from_millis(2))).await;
    let mut raw = server.raw_welcomed().await;
    for id in 1..=3 {
        raw.send(&ClientMessage::Generate(request(id, "hi", 5 * id as u32)))
            .await;
    }
    let mut tokens = [0u32; 4];
    let mut done = [false; 4];
    while !done[1..].iter().all(|d| *d) {
        match raw.recv().await {
            Some(ServerMessage::Token(t)) => {
                assert!(!done[t.id as usize], "token after Done for {}", t.id);
                assert_eq!(
                    t.token, tokens[t.id as usize],
                    "tokens of {} in order",
                    t.id
                );
                tokens[t.id as usize] += 1;
            }
            Some(ServerMessage::Done(d)) => {
                assert!(!done[d.id as usize], "second Done for {}", d.id);
                assert_eq!(d.usage.completion_tokens, tokens[d.id as usize]);
                done[d.id as usize] = true;
            }
            other => panic!("unexpected {other:?}"),
        }
    }
    assert_eq!(&tokens[1..], &[5, 10, 15]);
}

#[tokio::test]
async fn cancel_ends_the_generation_with_cancelled() {
    let server = TestServer::start(FakeEngine::new(Duration::from_millis(20))).await;
    let mut raw = server.raw_welcomed().await;
    raw.send(&ClientMessage::Generate(request(7, "hi", 1000)))
        .await;
    assert!(matches!(raw.recv().await, Some(ServerMessage::Token(_))));
    raw.send(&ClientMessage::Cancel { id: 7 }).await;
    let (tokens, done) = read_generation(&mut raw, 7).await;
    assert_eq!(done.finish_reason, FinishReason::Cancelled);
    assert!(
        tokens.len() < 100,
        "cancel took effect late: {} more tokens",
        tokens.len()
    );
    let cancels = server.engine.cancels();
    assert_eq!(cancels.len(), 1);
    assert_eq!((cancels[0].1, cancels[0].2), (7, FinishReason::Cancelled));
}

#[tokio::test]
async fn cancel_of_an_unknown_id_is_ignored() {
    let server = TestServer::start(FakeEngine::new(Duration::ZERO)).await;
    let mut raw = server.raw_welcomed().await;
    raw.send(&ClientMessage::Cancel { id: 99 }).await;
    raw.send(&ClientMessage::Status { id: 1 }).await;
    assert!(matches!(
        raw.recv().await,
        Some(ServerMessage::Status { id: 1, .. })
    ));
    assert!(server.engine.cancels().is_empty());
}

#[tokio::test]
async fn duplicate_running_id_is_refused_and_the_original_continues() {
    let server = TestServer::start(FakeEngine::new(Duration::from_millis(10))).await;
    let mut raw = server.raw_welcomed().await;
    raw.send(&ClientMessage::Generate(request(5, "hi", 10)))
        .await;
    raw.send(&ClientMessage::Generate(request(5, "hi", 10)))
        .await;
    let mut tokens = 0;
    let mut refused = false;
    loop {
        match raw.recv().await {
            Some(ServerMessage::Token(t)) if t.id == 5 => tokens += 1,
            Some(ServerMessage::Error(e)) => {
                assert_eq!((e.id, e.kind), (Some(5), ErrorKind::DuplicateId));
                refused = true;
            }
            Some(ServerMessage::Done(d)) if d.id == 5 => {
                assert_eq!(d.usage.completion_tokens, 10);
                break;
            }
            other => panic!("unexpected {other:?}"),
        }
    }
    assert!(refused);
    assert_eq!(tokens, 10);
    assert_eq!(server.engine.submissions().len(), 1);

    // Once Done has passed, the id is free again.
    raw.send(&ClientMessage::Generate(request(5, "hi", 1)))
        .await;
    let (tokens, _) = read_generation(&mut raw, 5).await;
    assert_eq!(tokens.len(), 1);
}

#[tokio::test]
async fn rejected_generation_gets_an_error_with_its_id_and_no_done() {
    let server = TestServer::start(FakeEngine::new(Duration::ZERO)).await;
    let mut raw = server.raw_welcomed().await;
    raw.send(&ClientMessage::Generate(request(3, BUSY_PROMPT, 5)))
        .await;
    raw.send(&ClientMessage::Status { id: 4 }).await;
    match raw.recv().await {
        Some(ServerMessage::Error(e)) => assert_eq!((e.id, e.kind), (Some(3), ErrorKind::Busy)),
        other => panic!("expected Busy, got {other:?}"),
    }
    // The next frame is the status reply: no Done for the rejected request.
    assert!(matches!(
        raw.recv().await,
        Some(ServerMessage::Status { id: 4, .. })
    ));
    // A rejected id was never running, so it can be used again.
    raw.send(&ClientMessage::Generate(request(3, "fine", 1)))
        .await;
    assert_eq!(read_generation(&mut raw, 3).await.0.len(), 1);
}

#[tokio::test]
async fn engine_failure_sends_error_then_done() {
    let server = TestServer::start(FakeEngine::new(Duration::ZERO)).await;
    let mut raw = server.raw_welcomed().await;
    raw.send(&ClientMessage::Generate(request(8, FAIL_PROMPT, 5)))
        .await;
    assert!(matches!(raw.recv().await, Some(ServerMessage::Token(_))));
    match raw.recv().await {
        Some(ServerMessage::Error(e)) => assert_eq!((e.id, e.kind), (Some(8), ErrorKind::Engine)),
        other => panic!("expected Error, got {other:?}"),
    }
    match raw.recv().await {
        Some(ServerMessage::Done(d)) => {
            assert_eq!((d.id, d.finish_reason), (8, FinishReason::Error))
        }
        other => panic!("expected Done, got {other:?}"),
    }
}

#[tokio::test]
async fn queries_are_answered_with_their_ids() {
    let server = TestServer::start(FakeEngine::new(Duration::ZERO)).await;
    let mut raw = server.raw_welcomed().await;
    raw.send(&ClientMessage::Generate(request(1, "hi", 2)))
        .await;
    read_generation(&mut raw, 1).await;
    wait_until("the job to be recorded", || {
        server.engine.finished().len() == 1
    })
    .await;

    raw.send(&ClientMessage::Tokenize {
        id: 10,
        text: "a b c".into(),
        special: false,
    })
    .await;
    match raw.recv().await {
        Some(ServerMessage::Tokens { id: 10, tokens }) => {
            let pieces: Vec<_> = tokens.iter().map(|t| t.piece.as_str()).collect();
            assert_eq!(pieces, ["a ", "b ", "c"]);
        }
        other => panic!("expected Tokens, got {other:?}"),
    }
    raw.send(&ClientMessage::Tokenize {
        id: 11,
        text: String::new(),
        special: false,
    })
    .await;
    match raw.recv().await {
        Some(ServerMessage::Error(e)) => {
            assert_eq!((e.id, e.kind), (Some(11), ErrorKind::InvalidRequest))
        }
        other => panic!("expected an error for id 11, got {other:?}"),
    }
    raw.send(&ClientMessage::Status { id: 12 }).await;
    match raw.recv().await {
        Some(ServerMessage::Status { id: 12, status }) => assert_eq!(status.tokens_generated, 2),
        other => panic!("expected Status, got {other:?}"),
    }
    raw.send(&ClientMessage::Jobs { id: 13, limit: 10 }).await;
    match raw.recv().await {
        Some(ServerMessage::Jobs { id: 13, jobs }) => {
            assert_eq!(jobs.len(), 1);
            assert_eq!(jobs[0].request_id, 1);
        }
        other => panic!("expected Jobs, got {other:?}"),
    }
    raw.send(&ClientMessage::JobEntries { id: 16, limit: 10 })
        .await;
    match raw.recv().await {
        Some(ServerMessage::JobEntries { id: 16, jobs }) => {
            assert_eq!(jobs.len(), 1);
            assert_eq!(
                (jobs[0].record.request_id, jobs[0].cached_tokens),
                (1, Some(PROMPT_CACHED_TOKENS))
            );
        }
        other => panic!("expected JobEntries, got {other:?}"),
    }
    raw.send(&ClientMessage::Jobs { id: 14, limit: 0 }).await;
    assert!(
        matches!(raw.recv().await, Some(ServerMessage::Jobs { id: 14, jobs }) if jobs.is_empty())
    );
    raw.send(&ClientMessage::Models { id: 15 }).await;
    assert!(
        matches!(raw.recv().await, Some(ServerMessage::Models { id: 15, models }) if models.len() == 1)
    );
}

#[tokio::test]
async fn disconnect_mid_stream_cancels_the_connections_generations() {
    let server = TestServer::start(FakeEngine::new(Duration::from_millis(10))).await;
    let mut raw = server.raw_welcomed().await;
    raw.send(&ClientMessage::Generate(request(1, "hi", 10_000)))
        .await;
    raw.send(&ClientMessage::Generate(request(2, "hi", 10_000)))
        .await;
    assert!(matches!(raw.recv().await, Some(ServerMessage::Token(_))));
    let conn = server.engine.submissions()[0].0;
    drop(raw);

    wait_until("cancel_connection", || {
        server.engine.connection_cancels() == vec![conn]
    })
    .await;
    wait_until("both generations to end", || {
        server.engine.finished().len() == 2
    })
    .await;
    for (_, reason, sent) in server.engine.finished() {
        assert_eq!(reason, FinishReason::Disconnected);
        assert!(sent < 10_000);
    }
    assert_still_serving(&server).await;
}

#[tokio::test]
async fn idle_disconnect_does_not_bother_the_engine() {
    let server = TestServer::start(FakeEngine::new(Duration::ZERO)).await;
    let mut raw = server.raw_welcomed().await;
    raw.send(&ClientMessage::Generate(request(1, "hi", 1)))
        .await;
    read_generation(&mut raw, 1).await;
    drop(raw);
    assert_still_serving(&server).await;
    assert!(server.engine.connection_cancels().is_empty());
}

#[tokio::test]
async fn malformed_frame_gets_bad_frame_and_close() {
    let server = TestServer::start(FakeEngine::new(Duration::ZERO)).await;
    let mut raw = server.raw_welcomed().await;
    let mut frame = Vec::new();
    frame.put_u32(4);
    frame.extend_from_slice(&[0xde, 0xad, 0xbe, 0xef]);
    raw.send_bytes(&frame).await;
    assert_eq!(connection_error(raw.recv().await).kind, ErrorKind::BadFrame);
    raw.expect_closed().await;
    assert_still_serving(&server).await;
}

#[tokio::test]
async fn malformed_first_frame_gets_bad_frame() {
    let server = TestServer::start(FakeEngine::new(Duration::ZERO)).await;
    let mut raw = server.raw().await;
    raw.send_bytes(&[0, 0, 0, 1, 0xff]).await;
    assert_eq!(connection_error(raw.recv().await).kind, ErrorKind::BadFrame);
    raw.expect_closed().await;
    assert_still_serving(&server).await;
}

#[tokio::test]
async fn oversized_frame_gets_frame_too_large_and_close() {
    let server = TestServer::start_with(FakeEngine::new(Duration::ZERO), |c| {
        c.max_frame_bytes = 1024
    })
    .await;
    let mut raw = server.raw().await;
    assert_eq!(raw.hello().await.max_frame_bytes, 1024);
    raw.send(&ClientMessage::Tokenize {
        id: 1,
        text: "x".repeat(2000),
        special: false,
    })
    .await;
    let error = connection_error(raw.recv().await);
    assert_eq!(error.kind, ErrorKind::FrameTooLarge);
    assert!(
        error.message.contains("1024"),
        "message names the limit: {}",
        error.message
    );
    raw.expect_closed().await;
    assert_still_serving(&server).await;
}

#[tokio::test]
async fn oversized_header_is_refused_before_its_payload_arrives() {
    let server = TestServer::start(FakeEngine::new(Duration::ZERO)).await;
    let mut raw = server.raw_welcomed().await;
    // Announce 4 GiB and send nothing more: the daemon must not wait for (or allocate) it.
    raw.send_bytes(&u32::MAX.to_be_bytes()).await;
    assert_eq!(
        connection_error(raw.recv().await).kind,
        ErrorKind::FrameTooLarge
    );
    raw.expect_closed().await;
}

#[tokio::test]
async fn wrong_major_version_is_refused_naming_both_versions() {
    let server = TestServer::start(FakeEngine::new(Duration::ZERO)).await;
    let mut raw = server.raw().await;
    raw.send(&hello(PROTOCOL_MAJOR + 1, 7)).await;
    let error = connection_error(raw.recv().await);
    assert_eq!(error.kind, ErrorKind::VersionMismatch);
    let theirs = format!("{}.7", PROTOCOL_MAJOR + 1);
    let ours = format!("{PROTOCOL_MAJOR}.{PROTOCOL_MINOR}");
    assert!(
        error.message.contains(&theirs) && error.message.contains(&ours),
        "{}",
        error.message
    );
    raw.expect_closed().await;
    assert_still_serving(&server).await;
}

#[tokio::test]
async fn newer_minor_version_is_welcome() {
    let server = TestServer::start(FakeEngine::new(Duration::ZERO)).await;
    let mut raw = server.raw().await;
    raw.send(&hello(PROTOCOL_MAJOR, PROTOCOL_MINOR + 5)).await;
    assert!(matches!(raw.recv().await, Some(ServerMessage::Welcome(_))));
}

#[tokio::test]
async fn prefilled_reaches_only_clients_that_can_decode_it() {
    let server = TestServer::start(FakeEngine::with_prefill(Duration::ZERO)).await;
    // A 1.2 client: told how the prompt was read, once, before the first token.
    let mut current = server.raw().await;
    current.send(&hello(PROTOCOL_MAJOR, 2)).await;
    assert!(matches!(
        current.recv().await,
        Some(ServerMessage::Welcome(_))
    ));
    current
        .send(&ClientMessage::Generate(request(1, "hi", 3)))
        .await;
    assert_eq!(
        current.recv().await,
        Some(ServerMessage::Prefilled(PrefillEvent {
            id: 1,
            prompt_tokens: PROMPT_TOKENS,
            cached_tokens: PROMPT_CACHED_TOKENS,
        }))
    );
    let (tokens, done) = read_generation(&mut current, 1).await;
    assert_eq!((tokens.len(), done.usage.completion_tokens), (3, 3));

    // A 1.1 client would fail to decode it: it gets tokens and the Done only.
    let mut older = server.raw().await;
    older.send(&hello(PROTOCOL_MAJOR, 1)).await;
    assert!(matches!(
        older.recv().await,
        Some(ServerMessage::Welcome(_))
    ));
    older
        .send(&ClientMessage::Generate(request(1, "hi", 3)))
        .await;
    let (tokens, done) = read_generation(&mut older, 1).await;
    assert_eq!((tokens.len(), done.usage.completion_tokens), (3, 3));
}

#[tokio::test]
async fn calls_are_streamed_only_to_clients_that_can_decode_the_pieces() {
    let server = TestServer::start(FakeEngine::new(Duration::ZERO)).await;
    let streamed = |id| ClientMessage::GenerateWith {
        request: request(id, "hi", 1),
        format: OutputFormat::Text,
        options: vec![GenerateOption::StreamToolCalls],
    };
    // A client of 1.9 or later gets what it asked for.
    let mut current = server.raw().await;
    current.hello().await;
    current.send(&streamed(1)).await;
    read_generation(&mut current, 1).await;
    // One that announced 1.8 cannot decode `ToolCallDelta`: its calls come whole, and a
    // call cut short as text, so nothing is lost behind pieces it never sees.
    let mut older = server.raw().await;
    older.send(&hello(PROTOCOL_MAJOR, 8)).await;
    assert!(matches!(
        older.recv().await,
        Some(ServerMessage::Welcome(_))
    ));
    older.send(&streamed(2)).await;
    read_generation(&mut older, 2).await;
    assert_eq!(
        server.engine.options(),
        [(1, vec![GenerateOption::StreamToolCalls]), (2, Vec::new())]
    );
}

/// `Reasoning` (1.6) and `TokenBytes` (1.11) go only to clients that announced a minor
/// that decodes them: the server tells the engine which a client reads.
#[tokio::test]
async fn events_newer_than_a_clients_minor_are_not_asked_of_the_engine() {
    let server = TestServer::start(FakeEngine::new(Duration::ZERO)).await;
    for (id, minor) in [(1, 5), (2, 6), (3, 10), (4, 11), (5, PROTOCOL_MINOR)] {
        let mut client = server.raw().await;
        client.send(&hello(PROTOCOL_MAJOR, minor)).await;
        assert!(matches!(
            client.recv().await,
            Some(ServerMessage::Welcome(_))
        ));
        client
            .send(&ClientMessage::Generate(request(id, "hi", 1)))
            .await;
        read_generation(&mut client, id).await;
    }
    assert_eq!(
        server.engine.reads(),
        [
            (1, false, false),
            (2, true, false),
            (3, true, false),
            (4, true, true),
            (5, true, true)
        ]
    );
}

#[tokio::test]
async fn first_message_other_than_hello_is_a_handshake_error() {
    let server = TestServer::start(FakeEngine::new(Duration::ZERO)).await;
    let mut raw = server.raw().await;
    raw.send(&ClientMessage::Generate(request(1, "hi", 1)))
        .await;
    assert_eq!(
        connection_error(raw.recv().await).kind,
        ErrorKind::Handshake
    );
    raw.expect_closed().await;
    assert!(server.engine.submissions().is_empty());
    assert_still_serving(&server).await;
}

#[tokio::test]
async fn second_hello_is_a_handshake_error() {
    let server = TestServer::start(FakeEngine::new(Duration::ZERO)).await;
    let mut raw = server.raw_welcomed().await;
    raw.send(&hello(PROTOCOL_MAJOR, PROTOCOL_MINOR)).await;
    assert_eq!(
        connection_error(raw.recv().await).kind,
        ErrorKind::Handshake
    );
    raw.expect_closed().await;
}

#[tokio::test]
async fn silent_client_times_out_of_the_handshake() {
    let server = TestServer::start_with(FakeEngine::new(Duration::ZERO), |c| {
        c.handshake_timeout = Duration::from_millis(100)
    })
    .await;
    let mut raw = server.raw().await;
    assert_eq!(
        connection_error(raw.recv().await).kind,
        ErrorKind::Handshake
    );
    raw.expect_closed().await;
}

#[tokio::test]
async fn partial_frames_are_reassembled() {
    let server = TestServer::start(FakeEngine::new(Duration::ZERO)).await;
    let mut raw = server.raw().await;
    let mut bytes = bytes::BytesMut::new();
    spark_client::codec::encode_frame(&hello(PROTOCOL_MAJOR, PROTOCOL_MINOR), &mut bytes).unwrap();
    spark_client::codec::encode_frame(&ClientMessage::Status { id: 9 }, &mut bytes).unwrap();
    // One byte at a time, with pauses, across both frames.
    for byte in bytes.iter() {
        raw.send_bytes(&[*byte]).await;
        tokio::time::sleep(Duration::from_millis(1)).await;
    }
    assert!(matches!(raw.recv().await, Some(ServerMessage::Welcome(_))));
    assert!(matches!(
        raw.recv().await,
        Some(ServerMessage::Status { id: 9, .. })
    ));
}

#[tokio::test]
async fn a_frame_split_inside_its_payload_is_not_mistaken_for_a_header() {
    let server = TestServer::start(FakeEngine::new(Duration::ZERO)).await;
    let mut raw = server.raw_welcomed().await;
    let mut bytes = bytes::BytesMut::new();
    spark_client::codec::encode_frame(&ClientMessage::Generate(request(1, "hi", 2)), &mut bytes)
        .unwrap();
    // Header plus one payload byte, then the rest: the daemon sees the header, then
    // bytes that, read as a header, would announce a frame far over the limit.
    raw.send_bytes(&bytes[..5]).await;
    tokio::time::sleep(Duration::from_millis(20)).await;
    raw.send_bytes(&bytes[5..]).await;
    let (tokens, _) = read_generation(&mut raw, 1).await;
    assert_eq!(tokens.len(), 2);
}

#[tokio::test]
async fn record_job_is_answered_with_the_record_and_the_peers_credentials() {
    use spark_client::protocol::{CountSource, DecodeClock, ExternalJob, Timings, Usage};
    let server = TestServer::start(FakeEngine::new(Duration::from_millis(1))).await;
    let mut raw = server.raw_welcomed().await;
    let job = ExternalJob {
        engine: "ollama".into(),
        upstream: "http://127.0.0.1:11434".into(),
        model: "llama3.2".into(),
        request_id: 9,
        started_unix_ms: 10,
        finished_unix_ms: 20,
        usage: Usage {
            prompt_tokens: 26,
            completion_tokens: 9,
        },
        timings: Timings::default(),
        finish_reason: FinishReason::Stop,
        counts: CountSource::Estimated,
        decode_clock: DecodeClock::Stream,
        http_status: 200,
    };
    raw.send(&ClientMessage::RecordJob {
        id: 21,
        job: job.clone(),
    })
    .await;
    match raw.recv().await {
        Some(ServerMessage::Recorded {
            id: 21,
            job: record,
        }) => {
            assert_eq!(
                (record.engine.as_str(), record.model.as_str()),
                ("ollama", "llama3.2")
            );
            assert_eq!((record.request_id, record.usage), (9, job.usage));
            assert!(record.estimated, "estimated counts must say so");
            // The job is attributed to the connection that reported it.
            assert_eq!(record.client_pid, Some(std::process::id()));
        }
        other => panic!("expected Recorded, got {other:?}"),
    }
}
