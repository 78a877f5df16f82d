//! Clients that stop reading: cut off after the stall timeout or past the backlog cap,
//! their generations cancelled, while a slow reader that keeps reading is left alone.

use std::time::Duration;

use spark_client::protocol::{ClientMessage, FinishReason, ServerMessage};

use super::{fake_engine::FakeEngine, request, wait_until, TestServer, PATIENCE};

/// 4 KiB per token, one every millisecond: a client that does not read fills its socket
/// after a few dozen tokens.
fn flooding_engine() -> std::sync::Arc<FakeEngine> {
    FakeEngine::with_text(Duration::from_millis(1), 4 << 10)
}

/// The (reason, tokens sent) of request `id` once the fake engine has ended it.
async fn ended(server: &TestServer, id: u64) -> (FinishReason, u32) {
    let mut found = None;
    wait_until("the generation to end", || {
        found = server
            .engine
            .finished()
            .into_iter()
            .find(|f| f.0 == id)
            .map(|f| (f.1, f.2));
        found.is_some()
    })
    .await;
    found.expect("found above")
}

#[tokio::test]
async fn a_client_that_stops_reading_is_cut_off_after_the_stall_timeout() {
    let server = TestServer::start_with(flooding_engine(), |c| {
        c.stall_timeout = Duration::from_millis(200);
    })
    .await;
    let mut sleeper = server.raw_welcomed().await;
    // Endless, unless something stops it.
    sleeper
        .send(&ClientMessage::Generate(request(1, "hi", 1_000_000)))
        .await;
    let (reason, sent) = ended(&server, 1).await;
    assert_eq!(reason, FinishReason::Disconnected);
    assert_eq!(server.engine.connection_cancels().len(), 1);
    assert!(
        sent < 10_000,
        "{sent} tokens were produced for a client that never read"
    );

    // What was already in its socket is still there to read; then the connection ends,
    // without a Done.
    let mut tokens = 0;
    while let Some(message) = sleeper.recv().await {
        match message {
            ServerMessage::Token(_) => tokens += 1,
            other => panic!("unexpected {other:?}"),
        }
    }
    assert!(tokens > 0 && tokens < sent, "{tokens} of {sent}");

    // Everyone else is still served.
    let mut other = server.raw_welcomed().await;
    other
        .send(&ClientMessage::Generate(request(2, "hi", 3)))
        .await;
    let mut got = 0;
    loop {
        match other.recv().await {
            Some(ServerMessage::Token(_)) => got += 1,
            Some(ServerMessage::Done(d)) => {
                assert_eq!((d.usage.completion_tokens, got), (3, 3));
                break;
            }
            other => panic!("unexpected {other:?}"),
        }
    }
}

#[tokio::test]
async fn a_backlog_past_the_cap_cuts_the_client_off_before_the_timeout() {
    let server = TestServer::start_with(flooding_engine(), |c| {
        // The timeout alone would take far longer than this test may.
        c.stall_timeout = PATIENCE * 10;
        c.max_backlog_frames = 64;
    })
    .await;
    let mut sleeper = server.raw_welcomed().await;
    sleeper
        .send(&ClientMessage::Generate(request(1, "hi", 1_000_000)))
        .await;
    let (reason, sent) = ended(&server, 1).await;
    assert_eq!(reason, FinishReason::Disconnected);
    // Socket buffers (a few hundred KiB: ~100 tokens), one write batch (256) and the
    // backlog cap, plus what the engine made before the cut took effect.
    assert!(
        sent < 2_000,
        "{sent} tokens were buffered for a stalled client"
    );
}

#[tokio::test]
async fn a_slow_reader_that_keeps_reading_is_not_cut_off() {
    // Linux wakes a writer blocked on a full Unix socket only once the reader has drained
    // about 3/4 of the buffer (~40 of these tokens, ~120 ms at this reader's pace): the
    // timeout is set above that, and far below the whole read.
    let server = TestServer::start_with(flooding_engine(), |c| {
        c.stall_timeout = Duration::from_millis(400);
    })
    .await;
    let mut reader = server.raw_welcomed().await;
    reader
        .send(&ClientMessage::Generate(request(1, "hi", 400)))
        .await;
    // Three times slower than the engine: its socket stays full, yet bytes keep moving,
    // and the whole read (~1.2 s) takes far longer than the stall timeout.
    let mut tokens = 0;
    loop {
        tokio::time::sleep(Duration::from_millis(3)).await;
        match reader.recv().await {
            Some(ServerMessage::Token(_)) => tokens += 1,
            Some(ServerMessage::Done(d)) => {
                assert_eq!(d.finish_reason, FinishReason::Length);
                assert_eq!(d.usage.completion_tokens, 400);
                break;
            }
            other => panic!("unexpected {other:?}"),
        }
    }
    assert_eq!(tokens, 400);
    assert!(server.engine.connection_cancels().is_empty());
}
