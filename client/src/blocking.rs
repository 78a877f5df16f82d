//! A blocking client for programs without an async runtime. It owns a current-thread
//! runtime, which drives the connection only while one of its calls is running; do not
//! use it from inside an async context.

use std::{path::Path, sync::Arc};

use futures::StreamExt;
use tokio::runtime::Runtime;

use crate::{
    error::ClientError,
    generation::GenerationEvent,
    protocol::{
        CacheReport, ChatFormatReport, DoneEvent, GenerateRequest, JobRecord, ModelInfo,
        OutputFormat, StatusReport, TokenPiece,
    },
};

pub struct Client {
    runtime: Arc<Runtime>,
    inner: crate::Client,
}

impl Client {
    pub fn connect(path: impl AsRef<Path>) -> Result<Client, ClientError> {
        let runtime = Arc::new(
            tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()?,
        );
        let inner = runtime.block_on(crate::Client::connect(path))?;
        Ok(Client { runtime, inner })
    }

    /// The async client this wraps, sharing its connection.
    pub fn as_async(&self) -> &crate::Client {
        &self.inner
    }

    pub fn next_request_id(&self) -> u64 {
        self.inner.next_request_id()
    }

    pub fn generate(&self, request: GenerateRequest) -> Result<Generation, ClientError> {
        self.generate_as(request, OutputFormat::Text)
    }

    /// See [`crate::Client::generate_as`].
    pub fn generate_as(
        &self,
        request: GenerateRequest,
        format: OutputFormat,
    ) -> Result<Generation, ClientError> {
        let inner = self
            .runtime
            .block_on(self.inner.generate_as(request, format))?;
        Ok(Generation {
            runtime: Arc::clone(&self.runtime),
            inner,
        })
    }

    pub fn cancel(&self, id: u64) -> Result<(), ClientError> {
        self.runtime.block_on(self.inner.cancel(id))
    }

    pub fn tokenize(&self, text: &str, special: bool) -> Result<Vec<TokenPiece>, ClientError> {
        self.runtime.block_on(self.inner.tokenize(text, special))
    }

    pub fn status(&self) -> Result<StatusReport, ClientError> {
        self.runtime.block_on(self.inner.status())
    }

    /// The prefix cache's state and totals (daemons speaking protocol 1.2 or later).
    pub fn cache_status(&self) -> Result<CacheReport, ClientError> {
        self.runtime.block_on(self.inner.cache_status())
    }

    /// How the daemon renders the model's chats (daemons speaking protocol 1.8 or later).
    pub fn chat_format(&self) -> Result<ChatFormatReport, ClientError> {
        self.runtime.block_on(self.inner.chat_format())
    }

    pub fn jobs(&self, limit: u32) -> Result<Vec<JobRecord>, ClientError> {
        self.runtime.block_on(self.inner.jobs(limit))
    }

    pub fn models(&self) -> Result<Vec<ModelInfo>, ClientError> {
        self.runtime.block_on(self.inner.models())
    }
}

/// A generation as an iterator, with the same items and end as the async stream.
pub struct Generation {
    runtime: Arc<Runtime>,
    inner: crate::Generation,
}

impl Generation {
    pub fn id(&self) -> u64 {
        self.inner.id()
    }

    pub fn cancel(&self) -> Result<(), ClientError> {
        self.inner.cancel()
    }

    pub fn collect_text(self) -> Result<(String, DoneEvent), ClientError> {
        let Generation { runtime, inner } = self;
        runtime.block_on(inner.collect_text())
    }
}

impl Iterator for Generation {
    type Item = Result<GenerationEvent, ClientError>;

    fn next(&mut self) -> Option<Self::Item> {
        self.runtime.block_on(self.inner.next())
    }
}
