//! Server tests against a fake engine: through raw protocol bytes, and through the
//! client crate.

mod fake_engine;
mod lifecycle;
mod raw;
mod stall;
mod via_client;

use std::{
    path::{Path, PathBuf},
    sync::{
        atomic::{AtomicU64, Ordering},
        Arc,
    },
    time::{Duration, Instant},
};

use bytes::BytesMut;
use futures::StreamExt;
use spark_client::{
    codec::{encode_frame, CodecError, MessageCodec},
    protocol::{
        ClientMessage, GenerateRequest, Hello, PromptInput, SamplingParams, ServerMessage, Welcome,
        PROTOCOL_MAJOR, PROTOCOL_MINOR,
    },
};
use tokio::{io::AsyncWriteExt, net::UnixStream, task::JoinHandle};
use tokio_util::{codec::Framed, sync::CancellationToken};

use self::fake_engine::FakeEngine;
use super::{bind, peercred::AllowList, serve::serve_with, ServerConfig, ServerError};

/// Upper bound on any single wait in these tests; they normally take milliseconds.
const PATIENCE: Duration = Duration::from_secs(10);

/// A directory removed on drop, short enough for a socket path (108 bytes).
pub struct TempDir(PathBuf);

impl TempDir {
    pub fn new() -> Self {
        static NEXT: AtomicU64 = AtomicU64::new(0);
        let n = NEXT.fetch_add(1, Ordering::Relaxed);
        let path = std::env::temp_dir().join(format!("sparkd-srv-{}-{n}", std::process::id()));
        let _ = std::fs::remove_dir_all(&path);
        std::fs::create_dir_all(&path).expect("create temp dir");
        Self(path)
    }

    pub fn path(&self) -> &Path {
        &self.0
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// A server on a temp socket, serving a fake engine on the current runtime.
pub struct TestServer {
    pub path: PathBuf,
    pub engine: Arc<FakeEngine>,
    pub shutdown: CancellationToken,
    pub task: JoinHandle<Result<(), ServerError>>,
    _dir: TempDir,
}

impl TestServer {
    pub async fn start(engine: Arc<FakeEngine>) -> Self {
        Self::start_with(engine, |_| {}).await
    }

    pub async fn start_with(
        engine: Arc<FakeEngine>,
        tweak: impl FnOnce(&mut ServerConfig),
    ) -> Self {
        let dir = TempDir::new();
        let mut config = ServerConfig::new(dir.path().join("sparkd.sock"));
        tweak(&mut config);
        let allow = AllowList::for_this_process(&config);
        Self::start_in(dir, config, engine, allow).await
    }

    pub async fn start_in(
        dir: TempDir,
        config: ServerConfig,
        engine: Arc<FakeEngine>,
        allow: AllowList,
    ) -> Self {
        let listener = bind(&config).await.expect("bind");
        let shutdown = CancellationToken::new();
        let path = config.socket_path.clone();
        let task = tokio::spawn(serve_with(
            listener,
            config,
            engine.clone(),
            shutdown.clone(),
            allow,
        ));
        Self {
            path,
            engine,
            shutdown,
            task,
            _dir: dir,
        }
    }

    pub async fn raw(&self) -> Raw {
        Raw::connect(&self.path).await
    }

    /// A raw connection past its handshake.
    pub async fn raw_welcomed(&self) -> Raw {
        let mut raw = self.raw().await;
        raw.hello().await;
        raw
    }

    pub async fn client(&self) -> spark_client::Client {
        spark_client::Client::connect(&self.path)
            .await
            .expect("client connects")
    }
}

/// A connection driven frame by frame, with raw bytes where a test needs them.
pub struct Raw {
    framed: Framed<UnixStream, MessageCodec<ServerMessage, ClientMessage>>,
}

impl Raw {
    pub async fn connect(path: &Path) -> Self {
        let stream = UnixStream::connect(path).await.expect("connect");
        Self {
            framed: Framed::new(stream, MessageCodec::new(64 << 20)),
        }
    }

    pub async fn send(&mut self, message: &ClientMessage) {
        let mut buf = BytesMut::new();
        encode_frame(message, &mut buf).expect("encode");
        self.send_bytes(&buf).await;
    }

    pub async fn send_bytes(&mut self, bytes: &[u8]) {
        self.framed.get_mut().write_all(bytes).await.expect("write");
    }

    /// The next frame, or `None` once the daemon closed the connection.
    pub async fn recv(&mut self) -> Option<ServerMessage> {
        match tokio::time::timeout(PATIENCE, self.framed.next()).await {
            Err(_) => panic!("no frame from the daemon within {PATIENCE:?}"),
            Ok(Some(Ok(message))) => Some(message),
            Ok(Some(Err(CodecError::Io(_)))) | Ok(None) => None,
            Ok(Some(Err(err))) => panic!("undecodable frame from the daemon: {err}"),
        }
    }

    pub async fn hello(&mut self) -> Welcome {
        self.send(&hello(PROTOCOL_MAJOR, PROTOCOL_MINOR)).await;
        match self.recv().await {
            Some(ServerMessage::Welcome(welcome)) => welcome,
            other => panic!("expected Welcome, got {other:?}"),
        }
    }

    pub async fn expect_closed(&mut self) {
        if let Some(message) = self.recv().await {
            panic!("expected the daemon to close the connection, got {message:?}");
        }
    }
}

pub fn hello(major: u16, minor: u16) -> ClientMessage {
    ClientMessage::Hello(Hello {
        major,
        minor,
        client: "server-tests".into(),
    })
}

pub fn request(id: u64, prompt: &str, max_tokens: u32) -> GenerateRequest {
    GenerateRequest {
        id,
        model: None,
        input: PromptInput::Raw {
            text: prompt.into(),
            special: false,
        },
        sampling: SamplingParams::default(),
        max_tokens: Some(max_tokens),
        stop: Vec::new(),
        logprobs: None,
    }
}

pub async fn wait_until(what: &str, mut condition: impl FnMut() -> bool) {
    let deadline = Instant::now() + PATIENCE;
    while !condition() {
        assert!(Instant::now() < deadline, "timed out waiting for {what}");
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
}
