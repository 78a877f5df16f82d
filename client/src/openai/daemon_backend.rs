//! `Backend` for the real daemon: a shared `Client`, connected on first use and replaced
//! when the daemon restarts.

use std::future::Future;
use std::path::PathBuf;

use futures::future::BoxFuture;
use futures::stream::StreamExt;
use tokio::sync::Mutex;

use super::backend::{Backend, BackendError, BackendEvent, EventStream};
use crate::protocol::{
    CacheReport, ChatFormatReport, ExternalJob, GenerateOption, GenerateRequest, JobEntry,
    JobRecord, ModelInfo, OutputFormat, StatusReport,
};
use crate::{Client, ClientError, GenerationEvent};

/// Talks to the daemon on `socket_path`. All HTTP requests share one multiplexed
/// connection; it is opened lazily, so the shim starts (and `/health` answers 503) while
/// the daemon is down, and it is reopened after the daemon restarts.
pub struct DaemonBackend {
    socket_path: PathBuf,
    client: Mutex<Option<Client>>,
}

impl DaemonBackend {
    pub fn new(socket_path: PathBuf) -> Self {
        Self {
            socket_path,
            client: Mutex::new(None),
        }
    }

    async fn connected(&self) -> Result<Client, BackendError> {
        let mut slot = self.client.lock().await;
        if let Some(client) = slot.as_ref() {
            return Ok(client.clone());
        }
        let client = Client::connect(&self.socket_path)
            .await
            .map_err(backend_error)?;
        *slot = Some(client.clone());
        Ok(client)
    }

    /// Runs `call` on the shared connection. A connection found closed is dropped and the
    /// call tried once more on a fresh one: after a daemon restart the first request
    /// should not fail just because the old connection was cached.
    async fn with_client<T, F, Fut>(&self, call: F) -> Result<T, BackendError>
    where
        F: Fn(Client) -> Fut,
        Fut: Future<Output = Result<T, ClientError>>,
    {
        let mut retried = false;
        loop {
            let client = self.connected().await?;
            let err = match call(client).await {
                Ok(value) => return Ok(value),
                Err(err) => err,
            };
            if !may_mean_closed(&err) {
                return Err(backend_error(err));
            }
            *self.client.lock().await = None;
            if retried {
                return Err(backend_error(err));
            }
            retried = true;
        }
    }
}

/// Errors a call returns when the cached connection is (or may be) closed. A closed
/// connection answers every call with the reason it closed for, and a daemon that shut
/// down says `ShuttingDown`, which the client reports as `Busy`. Queue-full refusals of a
/// generation arrive on its stream, never here, so retrying on `Busy` costs at most one
/// extra status request.
fn may_mean_closed(err: &ClientError) -> bool {
    matches!(
        err,
        ClientError::Disconnected
            | ClientError::Io(_)
            | ClientError::Busy(_)
            | ClientError::Protocol(_)
    )
}

fn backend_error(err: ClientError) -> BackendError {
    let message = err.to_string();
    match err {
        ClientError::DaemonNotRunning { .. }
        | ClientError::Connect { .. }
        | ClientError::NotAllowed(_)
        | ClientError::Disconnected
        | ClientError::Io(_) => BackendError::Unavailable(message),
        ClientError::VersionMismatch { .. } | ClientError::Protocol(_) => {
            BackendError::Protocol(message)
        }
        ClientError::Busy(message) => BackendError::Busy(message),
        ClientError::InvalidRequest { kind, message } => BackendError::Rejected { kind, message },
        ClientError::Engine(message) => BackendError::Engine(message),
    }
}

fn backend_event(event: GenerationEvent) -> BackendEvent {
    match event {
        GenerationEvent::Prefilled(prefill) => BackendEvent::Prefilled(prefill),
        GenerationEvent::Token(token) => BackendEvent::Token(token),
        GenerationEvent::ToolCall(call) => BackendEvent::ToolCall(call),
        GenerationEvent::ToolCallDelta(delta) => BackendEvent::ToolCallDelta(delta),
        GenerationEvent::Reasoning(reasoning) => BackendEvent::Reasoning(reasoning),
        GenerationEvent::TokenBytes(bytes) => BackendEvent::TokenBytes(bytes),
        GenerationEvent::Done(done) => BackendEvent::Done(done),
    }
}

impl Backend for DaemonBackend {
    fn generate(
        &self,
        req: GenerateRequest,
        format: OutputFormat,
        options: Vec<GenerateOption>,
    ) -> BoxFuture<'_, Result<EventStream, BackendError>> {
        Box::pin(async move {
            let generation = self
                .with_client(|client| {
                    let mut req = req.clone();
                    let format = format.clone();
                    // (A daemon older than 1.9 is not asked for calls in pieces: it
                    // sends each whole, which the stream then gives in two chunks.)
                    let options = options.clone();
                    async move {
                        req.id = client.next_request_id();
                        client.generate_with(req, format, options).await
                    }
                })
                .await?;
            // The `Generation` moves into the stream: dropping the stream cancels it.
            let events = generation.map(|item| item.map(backend_event).map_err(backend_error));
            Ok(events.boxed())
        })
    }

    fn models(&self) -> BoxFuture<'_, Result<Vec<ModelInfo>, BackendError>> {
        Box::pin(self.with_client(|client| async move { client.models().await }))
    }

    fn status(&self) -> BoxFuture<'_, Result<StatusReport, BackendError>> {
        Box::pin(self.with_client(|client| async move { client.status().await }))
    }

    fn cache_status(&self) -> BoxFuture<'_, Result<CacheReport, BackendError>> {
        Box::pin(self.with_client(|client| async move { client.cache_status().await }))
    }

    fn chat_format(&self) -> BoxFuture<'_, Result<ChatFormatReport, BackendError>> {
        Box::pin(self.with_client(|client| async move { client.chat_format().await }))
    }

    fn jobs(&self, limit: u32) -> BoxFuture<'_, Result<Vec<JobEntry>, BackendError>> {
        Box::pin(self.with_client(move |client| async move { client.job_entries(limit).await }))
    }

    fn record_job(&self, job: ExternalJob) -> BoxFuture<'_, Result<JobRecord, BackendError>> {
        Box::pin(self.with_client(move |client| {
            let job = job.clone();
            async move { client.record_job(job).await }
        }))
    }
}
