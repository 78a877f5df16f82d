//! Binding, access control, connection limits, slow clients and shutdown.

use std::{
    os::unix::fs::{FileTypeExt, PermissionsExt},
    time::Duration,
};

use spark_client::protocol::{ClientMessage, ErrorKind, FinishReason, ServerMessage};
use tokio_util::sync::CancellationToken;

use super::{
    super::{bind, serve, Listener, ServerConfig, ServerError},
    fake_engine::FakeEngine,
    request, wait_until, Raw, TempDir, TestServer, PATIENCE,
};
use crate::server::peercred::AllowList;

#[tokio::test]
async fn bind_sets_the_socket_mode_and_drop_removes_the_file() {
    let dir = TempDir::new();
    let mut config = ServerConfig::new(dir.path().join("run/sparkd/sparkd.sock"));
    config.socket_mode = 0o600;
    let listener = bind(&config).await.expect("bind");
    let meta = std::fs::symlink_metadata(&config.socket_path).unwrap();
    assert!(meta.file_type().is_socket());
    assert_eq!(meta.permissions().mode() & 0o777, 0o600);
    // The missing parent directories were created.
    let parent = std::fs::metadata(dir.path().join("run/sparkd")).unwrap();
    assert_eq!(
        parent.permissions().mode() & 0o777,
        0o755 & !current_umask()
    );
    assert_eq!(listener.socket_path(), Some(config.socket_path.as_path()));
    drop(listener);
    assert!(!config.socket_path.exists());
}

fn current_umask() -> u32 {
    // Read it without changing it: /proc/self/status has a `Umask:` line.
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| {
            s.lines()
                .find_map(|l| l.strip_prefix("Umask:").map(|v| v.trim().to_owned()))
        })
        .and_then(|v| u32::from_str_radix(&v, 8).ok())
        .unwrap_or(0o022)
}

#[tokio::test]
async fn stale_socket_is_removed() {
    let dir = TempDir::new();
    let config = ServerConfig::new(dir.path().join("sparkd.sock"));
    // A listener that is closed leaves its socket file behind, with nobody answering.
    drop(std::os::unix::net::UnixListener::bind(&config.socket_path).unwrap());
    assert!(config.socket_path.exists());
    let listener = bind(&config)
        .await
        .expect("a stale socket does not stop bind");
    let server = tokio::spawn(serve(
        listener,
        config.clone(),
        FakeEngine::new(Duration::ZERO),
        CancellationToken::new(),
    ));
    Raw::connect(&config.socket_path).await.hello().await;
    server.abort();
}

#[tokio::test]
async fn second_daemon_on_a_live_socket_is_refused() {
    let server = TestServer::start(FakeEngine::new(Duration::ZERO)).await;
    let config = ServerConfig::new(&server.path);
    match bind(&config).await {
        Err(ServerError::AlreadyRunning { path }) => assert_eq!(path, server.path),
        other => panic!("expected AlreadyRunning, got {other:?}"),
    }
    // The first daemon's socket is untouched.
    server.raw_welcomed().await;
}

#[tokio::test]
async fn a_file_that_is_not_a_socket_is_left_alone() {
    let dir = TempDir::new();
    let config = ServerConfig::new(dir.path().join("sparkd.sock"));
    std::fs::write(&config.socket_path, b"precious").unwrap();
    assert!(matches!(
        bind(&config).await,
        Err(ServerError::NotASocket { .. })
    ));
    assert_eq!(std::fs::read(&config.socket_path).unwrap(), b"precious");
}

#[tokio::test]
async fn dropping_a_listener_spares_a_newer_daemons_socket() {
    let dir = TempDir::new();
    let config = ServerConfig::new(dir.path().join("sparkd.sock"));
    let old = bind(&config).await.unwrap();
    // Someone replaced our socket file with theirs (say, after deleting ours by hand).
    std::fs::remove_file(&config.socket_path).unwrap();
    let newer = std::os::unix::net::UnixListener::bind(&config.socket_path).unwrap();
    drop(old);
    assert!(config.socket_path.exists());
    drop(newer);
}

#[tokio::test]
async fn inherited_listener_serves_and_its_file_is_left_alone() {
    let dir = TempDir::new();
    let path = dir.path().join("activated.sock");
    let std_listener = std::os::unix::net::UnixListener::bind(&path).unwrap();
    let listener = Listener::from_std(std_listener).expect("from_std");
    assert_eq!(listener.socket_path(), None);
    let shutdown = CancellationToken::new();
    let task = tokio::spawn(serve(
        listener,
        ServerConfig::new(&path),
        FakeEngine::new(Duration::ZERO),
        shutdown.clone(),
    ));
    Raw::connect(&path).await.hello().await;
    shutdown.cancel();
    task.await.unwrap().unwrap();
    assert!(path.exists(), "systemd's socket file is not ours to remove");
}

#[tokio::test]
async fn strangers_get_not_allowed_and_are_closed() {
    let dir = TempDir::new();
    let mut config = ServerConfig::new(dir.path().join("sparkd.sock"));
    config.allowed_uids = Some(vec![u32::MAX - 1]);
    config.allowed_gids = Some(vec![u32::MAX - 1]);
    // No exemptions: the test process (root or not) is a stranger.
    let allow = AllowList::new(&config, Vec::new());
    let server = TestServer::start_in(dir, config, FakeEngine::new(Duration::ZERO), allow).await;
    let mut raw = server.raw().await;
    match raw.recv().await {
        Some(ServerMessage::Error(e)) => {
            assert_eq!((e.id, e.kind), (None, ErrorKind::NotAllowed));
            assert!(e.message.contains(&spark_client::current_uid().to_string()));
        }
        other => panic!("expected NotAllowed, got {other:?}"),
    }
    raw.expect_closed().await;

    let err = spark_client::Client::connect(&server.path)
        .await
        .expect_err("refused");
    assert!(
        matches!(err, spark_client::ClientError::NotAllowed(_)),
        "{err:?}"
    );
}

#[tokio::test]
async fn listed_user_is_allowed() {
    let dir = TempDir::new();
    let mut config = ServerConfig::new(dir.path().join("sparkd.sock"));
    config.allowed_uids = Some(vec![spark_client::current_uid()]);
    let allow = AllowList::new(&config, Vec::new());
    let server = TestServer::start_in(dir, config, FakeEngine::new(Duration::ZERO), allow).await;
    server.raw_welcomed().await;
}

#[tokio::test]
async fn connections_past_the_limit_wait_for_a_slot() {
    let server =
        TestServer::start_with(FakeEngine::new(Duration::ZERO), |c| c.max_connections = 1).await;
    let first = server.raw_welcomed().await;
    let mut second = server.raw().await;
    second
        .send(&super::hello(spark_client::protocol::PROTOCOL_MAJOR, 0))
        .await;
    // Not served while the first holds the only slot...
    let early = tokio::time::timeout(Duration::from_millis(200), second.recv()).await;
    assert!(
        early.is_err(),
        "second connection served past the limit: {early:?}"
    );
    // ...and served as soon as it frees it.
    drop(first);
    assert!(matches!(
        second.recv().await,
        Some(ServerMessage::Welcome(_))
    ));
}

#[tokio::test]
async fn a_client_that_does_not_read_does_not_hold_up_others() {
    // 64 KiB per token: the idle client's socket buffers fill after a few tokens.
    let engine = FakeEngine::with_text(Duration::ZERO, 64 << 10);
    let server = TestServer::start(engine).await;
    let mut sleeper = server.raw_welcomed().await;
    sleeper
        .send(&ClientMessage::Generate(request(1, "hi", 200)))
        .await;
    // The engine finishes the sleeper's generation without waiting for it to read.
    wait_until("the unread generation to finish in the engine", || {
        server.engine.finished().iter().any(|f| f.0 == 1)
    })
    .await;

    let mut reader = server.raw_welcomed().await;
    reader
        .send(&ClientMessage::Generate(request(2, "hi", 20)))
        .await;
    let mut tokens = 0;
    loop {
        match reader.recv().await {
            Some(ServerMessage::Token(_)) => tokens += 1,
            Some(ServerMessage::Done(_)) => break,
            other => panic!("unexpected {other:?}"),
        }
    }
    assert_eq!(tokens, 20);

    // Everything is still delivered to the sleeper when it reads at last.
    let mut got = 0;
    loop {
        match sleeper.recv().await {
            Some(ServerMessage::Token(t)) => {
                assert_eq!(t.text.len(), 64 << 10);
                got += 1;
            }
            Some(ServerMessage::Done(d)) => {
                assert_eq!(d.usage.completion_tokens, 200);
                break;
            }
            other => panic!("unexpected {other:?}"),
        }
    }
    assert_eq!(got, 200);
}

#[tokio::test]
async fn shutdown_drains_running_generations_then_closes() {
    let server = TestServer::start(FakeEngine::new(Duration::from_millis(5))).await;
    let mut busy = server.raw_welcomed().await;
    let mut idle = server.raw_welcomed().await;
    busy.send(&ClientMessage::Generate(request(1, "hi", 100_000)))
        .await;
    assert!(matches!(busy.recv().await, Some(ServerMessage::Token(_))));

    server.shutdown.cancel();
    // The idle connection is told and closed at once.
    match idle.recv().await {
        Some(ServerMessage::Error(e)) => {
            assert_eq!((e.id, e.kind), (None, ErrorKind::ShuttingDown))
        }
        other => panic!("expected ShuttingDown, got {other:?}"),
    }
    idle.expect_closed().await;
    // No new connections: the socket file is gone.
    wait_until("the socket file to go", || !server.path.exists()).await;

    // The busy connection keeps streaming, and new generations on it are refused.
    busy.send(&ClientMessage::Generate(request(2, "hi", 1)))
        .await;
    let mut refused = false;
    let mut tokens_after = 0;
    for _ in 0..20 {
        match busy.recv().await {
            Some(ServerMessage::Token(t)) if t.id == 1 => tokens_after += 1,
            Some(ServerMessage::Error(e)) if e.id == Some(2) => {
                assert_eq!(e.kind, ErrorKind::ShuttingDown);
                refused = true;
            }
            other => panic!("unexpected {other:?}"),
        }
    }
    assert!(refused && tokens_after >= 19);
    assert!(
        !server.task.is_finished(),
        "serve returned while a generation was running"
    );

    // The engine stops: the last Done goes out, then the connection closes.
    server.engine.shutdown();
    loop {
        match busy.recv().await {
            Some(ServerMessage::Token(_)) => {}
            Some(ServerMessage::Done(d)) => {
                assert_eq!((d.id, d.finish_reason), (1, FinishReason::Shutdown));
                break;
            }
            other => panic!("unexpected {other:?}"),
        }
    }
    match busy.recv().await {
        Some(ServerMessage::Error(e)) => {
            assert_eq!((e.id, e.kind), (None, ErrorKind::ShuttingDown))
        }
        other => panic!("expected ShuttingDown, got {other:?}"),
    }
    busy.expect_closed().await;
    tokio::time::timeout(PATIENCE, server.task)
        .await
        .expect("serve returns")
        .unwrap()
        .unwrap();
}

#[tokio::test]
async fn shutdown_grace_bounds_a_stuck_drain() {
    let server = TestServer::start_with(FakeEngine::new(Duration::from_millis(5)), |c| {
        c.shutdown_grace = Duration::from_millis(100)
    })
    .await;
    let mut raw = server.raw_welcomed().await;
    raw.send(&ClientMessage::Generate(request(1, "hi", 100_000)))
        .await;
    assert!(matches!(raw.recv().await, Some(ServerMessage::Token(_))));
    server.shutdown.cancel();
    // The engine never stops the generation; serve gives up after the grace period.
    tokio::time::timeout(PATIENCE, server.task)
        .await
        .expect("serve returns")
        .unwrap()
        .unwrap();
    wait_until("the abandoned generation to end", || {
        server.engine.running() == 0
    })
    .await;
}
