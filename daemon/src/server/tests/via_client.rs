//! The server through the client crate, as the CLI and other programs use it.

use std::time::Duration;

use futures::{future::join_all, StreamExt};
use spark_client::{
    protocol::{ErrorKind, FinishReason, OutputFormat},
    Client, ClientError, ConnectOptions, GenerationEvent,
};

use super::{
    fake_engine::{
        FakeEngine, BUSY_PROMPT, CACHE_REPORT, FAIL_PROMPT, PROMPT_CACHED_TOKENS, PROMPT_TOKENS,
    },
    request, wait_until, TempDir, TestServer,
};

#[tokio::test]
async fn generation_streams_to_done() {
    let server = TestServer::start(FakeEngine::new(Duration::from_millis(1))).await;
    let client = server.client().await;
    assert_eq!(client.daemon().daemon_version, env!("CARGO_PKG_VERSION"));
    let id = client.next_request_id();
    let (text, done) = client
        .generate(request(id, "hi", 3))
        .await
        .unwrap()
        .collect_text()
        .await
        .unwrap();
    assert_eq!(text, "t0 t1 t2 ");
    assert_eq!(
        (done.id, done.finish_reason, done.usage.completion_tokens),
        (id, FinishReason::Length, 3)
    );
}

#[tokio::test]
async fn the_stream_tells_how_the_prompt_was_read_before_its_first_token() {
    let server = TestServer::start(FakeEngine::with_prefill(Duration::from_millis(1))).await;
    let client = server.client().await;
    let id = client.next_request_id();
    let events: Vec<GenerationEvent> = client
        .generate(request(id, "hi", 2))
        .await
        .unwrap()
        .map(Result::unwrap)
        .collect()
        .await;
    let kinds: Vec<&str> = events
        .iter()
        .map(|e| match e {
            GenerationEvent::Prefilled(p) => {
                assert_eq!(
                    (p.id, p.prompt_tokens, p.cached_tokens),
                    (id, PROMPT_TOKENS, PROMPT_CACHED_TOKENS)
                );
                "prefilled"
            }
            GenerationEvent::Token(_) => "token",
            GenerationEvent::ToolCall(_) => "tool call",
            GenerationEvent::ToolCallDelta(_) => "tool call delta",
            GenerationEvent::Reasoning(_) => "reasoning",
            GenerationEvent::TokenBytes(_) => "token bytes",
            GenerationEvent::Done(_) => "done",
        })
        .collect();
    assert_eq!(kinds, ["prefilled", "token", "token", "done"]);
}

#[tokio::test]
async fn cache_status_is_the_engines() {
    let server = TestServer::start(FakeEngine::new(Duration::ZERO)).await;
    let client = server.client().await;
    assert_eq!(client.cache_status().await.unwrap(), CACHE_REPORT);
}

#[tokio::test]
async fn chat_format_is_the_engines() {
    let server = TestServer::start(FakeEngine::new(Duration::ZERO)).await;
    let client = server.client().await;
    let format = client.chat_format().await.unwrap();
    assert_eq!(format.tools, "hermes");
    assert_eq!(format.variables, ["enable_thinking"]);
}

#[tokio::test]
async fn request_ids_are_unique_and_growing() {
    let server = TestServer::start(FakeEngine::new(Duration::ZERO)).await;
    let client = server.client().await;
    let ids: Vec<u64> = (0..5).map(|_| client.next_request_id()).collect();
    assert!(ids.windows(2).all(|w| w[0] < w[1]), "{ids:?}");
}

#[tokio::test]
async fn concurrent_generations_on_one_connection() {
    let server = TestServer::start(FakeEngine::new(Duration::from_millis(1))).await;
    let client = server.client().await;
    let runs = (1..=6u32).map(|n| {
        let client = client.clone();
        async move {
            let id = client.next_request_id();
            let (text, done) = client
                .generate(request(id, "hi", n * 3))
                .await?
                .collect_text()
                .await?;
            Ok::<_, ClientError>((n, id, text, done))
        }
    });
    for result in join_all(runs).await {
        let (n, id, text, done) = result.unwrap();
        assert_eq!(done.id, id);
        assert_eq!(done.usage.completion_tokens, n * 3);
        assert_eq!(text.split_whitespace().count() as u32, n * 3);
    }
    // All on one connection.
    let conns: std::collections::HashSet<_> =
        server.engine.submissions().iter().map(|s| s.0).collect();
    assert_eq!(conns.len(), 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_generations_on_many_connections() {
    let server = TestServer::start(FakeEngine::new(Duration::from_millis(1))).await;
    let runs = (0..12).map(|_| {
        let path = server.path.clone();
        tokio::spawn(async move {
            let client = Client::connect(&path).await?;
            let a = client
                .generate(request(client.next_request_id(), "hi", 8))
                .await?;
            let b = client
                .generate(request(client.next_request_id(), "hi", 4))
                .await?;
            let (a, b) = tokio::join!(a.collect_text(), b.collect_text());
            Ok::<_, ClientError>((a?.1.usage.completion_tokens, b?.1.usage.completion_tokens))
        })
    });
    for result in join_all(runs).await {
        assert_eq!(result.unwrap().unwrap(), (8, 4));
    }
    let conns: std::collections::HashSet<_> =
        server.engine.submissions().iter().map(|s| s.0).collect();
    assert_eq!(conns.len(), 12);
}

#[tokio::test]
async fn cancel_through_the_client_ends_with_done_cancelled() {
    let server = TestServer::start(FakeEngine::new(Duration::from_millis(10))).await;
    let client = server.client().await;
    let id = client.next_request_id();
    let mut generation = client.generate(request(id, "hi", 10_000)).await.unwrap();
    assert!(matches!(
        generation.next().await,
        Some(Ok(GenerationEvent::Token(_)))
    ));
    client.cancel(id).await.unwrap();
    let mut last = None;
    while let Some(event) = generation.next().await {
        last = Some(event.unwrap());
    }
    match last {
        Some(GenerationEvent::Done(done)) => {
            assert_eq!(done.finish_reason, FinishReason::Cancelled)
        }
        other => panic!("expected Done, got {other:?}"),
    }
}

#[tokio::test]
async fn generation_cancel_keeps_the_stream_until_done() {
    let server = TestServer::start(FakeEngine::new(Duration::from_millis(10))).await;
    let client = server.client().await;
    let generation = client
        .generate(request(client.next_request_id(), "hi", 10_000))
        .await
        .unwrap();
    generation.cancel().unwrap();
    let (_, done) = generation.collect_text().await.unwrap();
    assert_eq!(done.finish_reason, FinishReason::Cancelled);
}

#[tokio::test]
async fn dropping_a_generation_cancels_only_it() {
    let server = TestServer::start(FakeEngine::new(Duration::from_millis(5))).await;
    let client = server.client().await;
    let dropped_id = client.next_request_id();
    let mut dropped = client
        .generate(request(dropped_id, "hi", 10_000))
        .await
        .unwrap();
    let kept = client
        .generate(request(client.next_request_id(), "hi", 20))
        .await
        .unwrap();
    assert!(matches!(
        dropped.next().await,
        Some(Ok(GenerationEvent::Token(_)))
    ));
    drop(dropped);
    wait_until("the dropped generation's cancel", || {
        server.engine.cancels().iter().any(|c| c.1 == dropped_id)
    })
    .await;
    let (_, done) = kept.collect_text().await.unwrap();
    assert_eq!(
        (done.finish_reason, done.usage.completion_tokens),
        (FinishReason::Length, 20)
    );
    wait_until("the dropped generation to end", || {
        server.engine.running() == 0
    })
    .await;
}

#[tokio::test]
async fn a_generation_outlives_its_client_handle() {
    let server = TestServer::start(FakeEngine::new(Duration::from_millis(1))).await;
    let client = server.client().await;
    let generation = client
        .generate(request(client.next_request_id(), "hi", 5))
        .await
        .unwrap();
    drop(client);
    let (_, done) = generation.collect_text().await.unwrap();
    assert_eq!(done.usage.completion_tokens, 5);
}

#[tokio::test]
async fn dropping_every_handle_closes_the_connection() {
    // One connection slot: a second client gets in only once the first connection closed.
    let server = TestServer::start_with(FakeEngine::new(Duration::from_millis(5)), |c| {
        c.max_connections = 1
    })
    .await;
    let options = ConnectOptions {
        handshake_timeout: Duration::from_secs(3),
        ..ConnectOptions::default()
    };
    let first = Client::connect_with(&server.path, &options).await.unwrap();
    let generation = first
        .generate(request(first.next_request_id(), "hi", 100_000))
        .await
        .unwrap();
    wait_until("the generation to start", || server.engine.running() == 1).await;
    drop(first);
    drop(generation);
    let second = Client::connect_with(&server.path, &options)
        .await
        .expect("the slot was freed");
    wait_until("the abandoned generation to end", || {
        server.engine.running() == 0
    })
    .await;
    assert_eq!(second.models().await.unwrap().len(), 1);
}

#[tokio::test]
async fn rejection_is_the_streams_only_item() {
    let server = TestServer::start(FakeEngine::new(Duration::ZERO)).await;
    let client = server.client().await;
    let mut generation = client
        .generate(request(client.next_request_id(), BUSY_PROMPT, 5))
        .await
        .unwrap();
    match generation.next().await {
        Some(Err(ClientError::Busy(message))) => assert_eq!(message, "queue full"),
        other => panic!("expected Busy, got {other:?}"),
    }
    assert!(generation.next().await.is_none());
    // The connection is fine.
    assert_eq!(client.models().await.unwrap().len(), 1);
}

#[tokio::test]
async fn engine_failure_ends_the_stream_with_an_error() {
    let server = TestServer::start(FakeEngine::new(Duration::ZERO)).await;
    let client = server.client().await;
    let mut generation = client
        .generate(request(client.next_request_id(), FAIL_PROMPT, 5))
        .await
        .unwrap();
    assert!(matches!(
        generation.next().await,
        Some(Ok(GenerationEvent::Token(_)))
    ));
    assert!(matches!(
        generation.next().await,
        Some(Err(ClientError::Engine(_)))
    ));
    assert!(generation.next().await.is_none());
    assert!(client.status().await.is_ok());
}

#[tokio::test]
async fn duplicate_id_is_caught_by_the_client() {
    let server = TestServer::start(FakeEngine::new(Duration::from_millis(10))).await;
    let client = server.client().await;
    let _running = client.generate(request(7, "hi", 1000)).await.unwrap();
    match client.generate(request(7, "hi", 1)).await {
        Err(ClientError::InvalidRequest {
            kind: ErrorKind::DuplicateId,
            ..
        }) => {}
        other => panic!("expected DuplicateId, got {other:?}"),
    }
    wait_until("the first generation to reach the engine", || {
        !server.engine.submissions().is_empty()
    })
    .await;
    tokio::time::sleep(Duration::from_millis(50)).await;
    assert_eq!(
        server.engine.submissions().len(),
        1,
        "the duplicate was not sent"
    );
}

#[tokio::test]
async fn queries() {
    let server = TestServer::start(FakeEngine::new(Duration::ZERO)).await;
    let client = server.client().await;
    let tokens = client.tokenize("one two", true).await.unwrap();
    assert_eq!(tokens.iter().map(|t| t.id).collect::<Vec<_>>(), [100, 101]);
    match client.tokenize("", false).await {
        Err(ClientError::InvalidRequest {
            kind: ErrorKind::InvalidRequest,
            ..
        }) => {}
        other => panic!("expected InvalidRequest, got {other:?}"),
    }
    client
        .generate(request(client.next_request_id(), "hi", 2))
        .await
        .unwrap()
        .collect_text()
        .await
        .unwrap();
    wait_until("the job to be recorded", || {
        server.engine.finished().len() == 1
    })
    .await;
    assert_eq!(client.status().await.unwrap().tokens_generated, 2);
    assert_eq!(client.jobs(5).await.unwrap().len(), 1);
    assert_eq!(client.models().await.unwrap()[0].name, "fake-model");
}

#[tokio::test]
async fn the_client_keeps_to_the_announced_frame_limit() {
    let server = TestServer::start_with(FakeEngine::new(Duration::ZERO), |c| {
        c.max_frame_bytes = 4096
    })
    .await;
    let client = server.client().await;
    match client.tokenize(&"word ".repeat(2000), false).await {
        Err(ClientError::InvalidRequest {
            kind: ErrorKind::FrameTooLarge,
            ..
        }) => {}
        other => panic!("expected FrameTooLarge, got {other:?}"),
    }
    // The connection survived: nothing oversized reached the daemon.
    assert_eq!(client.tokenize("a b", false).await.unwrap().len(), 2);
}

#[tokio::test]
async fn missing_or_stale_socket_is_daemon_not_running() {
    let dir = TempDir::new();
    let missing = dir.path().join("missing.sock");
    assert!(matches!(
        Client::connect(&missing).await,
        Err(ClientError::DaemonNotRunning { .. })
    ));
    let stale = dir.path().join("stale.sock");
    drop(std::os::unix::net::UnixListener::bind(&stale).unwrap());
    match Client::connect(&stale).await {
        Err(err @ ClientError::DaemonNotRunning { .. }) => assert!(err.is_unavailable()),
        other => panic!("expected DaemonNotRunning, got {other:?}"),
    }
}

#[tokio::test]
async fn shutdown_ends_generations_then_requests_fail_as_busy() {
    let server = TestServer::start(FakeEngine::new(Duration::from_millis(5))).await;
    let client = server.client().await;
    let mut generation = client
        .generate(request(client.next_request_id(), "hi", 100_000))
        .await
        .unwrap();
    assert!(matches!(
        generation.next().await,
        Some(Ok(GenerationEvent::Token(_)))
    ));
    server.shutdown.cancel();
    server.engine.shutdown();
    let (_, done) = generation.collect_text().await.unwrap();
    assert_eq!(done.finish_reason, FinishReason::Shutdown);
    // The daemon closed the connection, saying why.
    let deadline = std::time::Instant::now() + Duration::from_secs(5);
    loop {
        match client.status().await {
            Err(ClientError::Busy(message)) => {
                assert!(message.contains("shutting down"), "{message}");
                break;
            }
            Ok(_) => assert!(std::time::Instant::now() < deadline, "still answering"),
            Err(other) => panic!("expected Busy, got {other:?}"),
        }
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
}

#[test]
fn blocking_client_streams_and_queries() {
    // The server runs on its own runtime thread; the blocking client owns another.
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .enable_all()
        .build()
        .unwrap();
    let server = runtime.block_on(TestServer::start(FakeEngine::new(Duration::from_millis(1))));
    let client = spark_client::blocking::Client::connect(&server.path).unwrap();
    let id = client.next_request_id();
    let events: Vec<_> = client
        .generate(request(id, "hi", 4))
        .unwrap()
        .collect::<Result<_, _>>()
        .unwrap();
    assert_eq!(events.len(), 5);
    assert!(
        matches!(&events[4], GenerationEvent::Done(d) if d.id == id && d.usage.completion_tokens == 4)
    );
    let (text, _) = client
        .generate(request(client.next_request_id(), "hi", 2))
        .unwrap()
        .collect_text()
        .unwrap();
    assert_eq!(text, "t0 t1 ");
    assert_eq!(client.models().unwrap().len(), 1);
    drop(client);
    drop(server);
}

#[tokio::test]
async fn the_output_format_reaches_the_engine_with_its_request() {
    let server = TestServer::start(FakeEngine::new(Duration::from_millis(1))).await;
    let client = server.client().await;
    let schema = OutputFormat::JsonSchema {
        schema: r#"{"type":"object"}"#.into(),
    };
    let formats = [
        (1, OutputFormat::JsonObject),
        (2, OutputFormat::Text),
        (3, schema),
    ];
    for (id, format) in formats.clone() {
        let (_, done) = client
            .generate_as(request(id, "hi", 2), format)
            .await
            .unwrap()
            .collect_text()
            .await
            .unwrap();
        assert_eq!(done.id, id);
    }
    assert_eq!(server.engine.formats(), formats);
}
