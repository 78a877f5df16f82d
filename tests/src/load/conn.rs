//! One raw protocol connection, frame by frame, so that the harness sees exactly what the
//! daemon sends (the client library folds an engine failure's `Error` + `Done` into one
//! item, and sends `Cancel` when a stream is dropped: the harness needs neither).

use std::path::Path;
use std::time::Duration;

use anyhow::{anyhow, bail, Context};
use futures::{SinkExt, StreamExt};
use spark_client::codec::MessageCodec;
use spark_client::protocol::{ClientMessage, Hello, ServerMessage, PROTOCOL_MAJOR, PROTOCOL_MINOR};
use spark_client::CLIENT_MAX_FRAME_BYTES;
use tokio::net::UnixStream;
use tokio_util::codec::Framed;

pub struct Conn {
    framed: Framed<UnixStream, MessageCodec<ServerMessage, ClientMessage>>,
}

impl Conn {
    /// Connects and completes the handshake.
    pub async fn connect(socket: &Path, timeout: Duration) -> anyhow::Result<Conn> {
        let stream = UnixStream::connect(socket)
            .await
            .with_context(|| format!("connecting to {}", socket.display()))?;
        let mut conn = Conn {
            framed: Framed::new(stream, MessageCodec::new(CLIENT_MAX_FRAME_BYTES)),
        };
        conn.send(ClientMessage::Hello(Hello {
            major: PROTOCOL_MAJOR,
            minor: PROTOCOL_MINOR,
            client: "sparkd-load".into(),
        }))
        .await?;
        match conn.recv(timeout).await? {
            ServerMessage::Welcome(_) => Ok(conn),
            other => bail!("expected Welcome, got {other:?}"),
        }
    }

    pub async fn send(&mut self, message: ClientMessage) -> anyhow::Result<()> {
        self.framed
            .send(message)
            .await
            .map_err(|e| anyhow!("write failed: {e}"))
    }

    /// The next frame; an error when none comes within `timeout` (a hang) or the daemon
    /// closed the connection.
    pub async fn recv(&mut self, timeout: Duration) -> anyhow::Result<ServerMessage> {
        match tokio::time::timeout(timeout, self.framed.next()).await {
            Err(_) => bail!("no frame within {timeout:?}"),
            Ok(None) => bail!("the daemon closed the connection"),
            Ok(Some(Err(e))) => bail!("read failed: {e}"),
            Ok(Some(Ok(message))) => Ok(message),
        }
    }
}
