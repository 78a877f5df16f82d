//! The accept loop: a bounded number of connection tasks, backoff when `accept` fails,
//! and a graceful drain on shutdown.

use std::{sync::Arc, time::Duration};

use tokio::{
    net::UnixStream,
    sync::{OwnedSemaphorePermit, Semaphore},
    task::JoinSet,
};
use tokio_util::sync::CancellationToken;

#[cfg(test)]
use super::peercred::AllowList;
use super::{
    connection::{self, Shared},
    peercred::Access,
    Listener, ServerConfig, ServerError,
};
use crate::engine::{ConnId, Engine};

const FIRST_BACKOFF: Duration = Duration::from_millis(10);
const MAX_BACKOFF: Duration = Duration::from_secs(2);

/// Serves connections on `listener` until `shutdown` is cancelled, then waits for the
/// connections to finish their generations (at most `config.shutdown_grace`).
///
/// The listener (and with it the socket file) is dropped as soon as shutdown begins, so
/// a new daemon can bind while this one drains.
pub async fn serve(
    listener: Listener,
    config: ServerConfig,
    engine: Arc<dyn Engine>,
    shutdown: CancellationToken,
) -> Result<(), ServerError> {
    let access = Access::for_this_process(&config);
    serve_with_access(listener, config, engine, shutdown, access).await
}

/// [`serve`] with an allow-list the caller keeps a handle to, to change it while the
/// server runs (`Access::update`, on SIGHUP).
pub async fn serve_with_access(
    listener: Listener,
    config: ServerConfig,
    engine: Arc<dyn Engine>,
    shutdown: CancellationToken,
    access: Access,
) -> Result<(), ServerError> {
    run(listener, config, engine, shutdown, access).await
}

/// [`serve`] with the allow-list given, so tests can be strangers to themselves.
#[cfg(test)]
pub(crate) async fn serve_with(
    listener: Listener,
    config: ServerConfig,
    engine: Arc<dyn Engine>,
    shutdown: CancellationToken,
    allow: AllowList,
) -> Result<(), ServerError> {
    run(listener, config, engine, shutdown, Access::from_list(allow)).await
}

async fn run(
    listener: Listener,
    config: ServerConfig,
    engine: Arc<dyn Engine>,
    shutdown: CancellationToken,
    allow: Access,
) -> Result<(), ServerError> {
    let shared = Arc::new(Shared {
        engine,
        max_frame_bytes: config.max_frame_bytes,
        handshake_timeout: config.handshake_timeout,
        allow,
        stall_timeout: config.stall_timeout,
        max_backlog_frames: config.max_backlog_frames,
    });
    // Taken before `accept`, so that past the limit clients wait in the kernel's backlog
    // instead of costing us a task and a file descriptor each.
    let slots = Arc::new(Semaphore::new(config.max_connections.max(1)));
    let mut tasks = JoinSet::new();
    let mut next_conn: ConnId = 1;
    let mut backoff = FIRST_BACKOFF;

    tracing::info!(
        socket = ?listener.socket_path(),
        max_connections = config.max_connections,
        "listening"
    );
    loop {
        tokio::select! {
            _ = shutdown.cancelled() => break,
            Some(joined) = tasks.join_next(), if !tasks.is_empty() => report_task_end(joined),
            (permit, accepted) = accept(&listener, &slots) => match accepted {
                Ok(stream) => {
                    backoff = FIRST_BACKOFF;
                    let conn = next_conn;
                    next_conn += 1;
                    let shared = Arc::clone(&shared);
                    let shutdown = shutdown.clone();
                    tasks.spawn(async move {
                        connection::run(shared, stream, conn, shutdown).await;
                        drop(permit);
                    });
                }
                Err(err) => {
                    // Usually out of file descriptors: wait for connections to close.
                    tracing::error!(%err, retry_in = ?backoff, "accept failed");
                    tokio::select! {
                        _ = shutdown.cancelled() => break,
                        _ = tokio::time::sleep(backoff) => {}
                    }
                    backoff = (backoff * 2).min(MAX_BACKOFF);
                }
            },
        }
    }

    drop(listener);
    tracing::info!(
        connections = tasks.len(),
        "shutting down: no longer accepting"
    );
    let drained = tokio::time::timeout(config.shutdown_grace, async {
        while let Some(joined) = tasks.join_next().await {
            report_task_end(joined);
        }
    })
    .await;
    if drained.is_err() {
        tracing::warn!(
            connections = tasks.len(),
            grace = ?config.shutdown_grace,
            "connections still streaming after the grace period; dropping them"
        );
        tasks.shutdown().await;
    }
    Ok(())
}

async fn accept(
    listener: &Listener,
    slots: &Arc<Semaphore>,
) -> (Option<OwnedSemaphorePermit>, std::io::Result<UnixStream>) {
    // The semaphore is never closed, so `acquire_owned` cannot fail; `None` would only
    // mean an unbounded connection.
    let permit = Arc::clone(slots).acquire_owned().await.ok();
    (permit, listener.accept().await)
}

fn report_task_end(joined: Result<(), tokio::task::JoinError>) {
    if let Err(err) = joined {
        if err.is_panic() {
            tracing::error!("a connection task panicked");
        }
    }
}
