//! One generation's event stream, as the client sees it.

use std::{
    pin::Pin,
    sync::Arc,
    task::{Context, Poll},
};

use futures::{Stream, StreamExt};
use tokio::sync::mpsc;

use crate::{
    client::Routes,
    error::ClientError,
    protocol::{
        ClientMessage, DoneEvent, PrefillEvent, ReasoningEvent, ServerMessage, TokenBytesEvent,
        TokenEvent, ToolCallDeltaEvent, ToolCallEvent,
    },
};

/// An event of a running generation.
#[derive(Debug, Clone, PartialEq)]
pub enum GenerationEvent {
    /// How the prompt was read, right before the first token (daemons speaking protocol
    /// 1.2 or later; older ones never send it).
    Prefilled(PrefillEvent),
    Token(TokenEvent),
    /// A function call the model made (`PromptInput::ChatWithTools` only).
    ToolCall(ToolCallEvent),
    /// A piece of a function call being written, for requests with
    /// [`GenerateOption::StreamToolCalls`](crate::protocol::GenerateOption::StreamToolCalls)
    /// (daemons speaking protocol 1.9 or later; see [`ServerMessage::ToolCallDelta`]).
    ToolCallDelta(ToolCallDeltaEvent),
    /// A thinking model's reasoning, right before the `Token` that wrote it (daemons
    /// speaking protocol 1.6 or later; see [`ServerMessage::Reasoning`]).
    Reasoning(ReasoningEvent),
    /// The raw bytes of the next `Token` and of its alternatives, right before it, for
    /// requests with logprobs (daemons speaking protocol 1.11 or later; see
    /// [`ServerMessage::TokenBytes`]).
    TokenBytes(TokenBytesEvent),
    /// Always the last event.
    Done(DoneEvent),
}

impl GenerationEvent {
    /// The wire message this event arrived as.
    pub fn into_message(self) -> ServerMessage {
        match self {
            GenerationEvent::Prefilled(event) => ServerMessage::Prefilled(event),
            GenerationEvent::Token(event) => ServerMessage::Token(event),
            GenerationEvent::ToolCall(event) => ServerMessage::ToolCall(event),
            GenerationEvent::ToolCallDelta(event) => ServerMessage::ToolCallDelta(event),
            GenerationEvent::Reasoning(event) => ServerMessage::Reasoning(event),
            GenerationEvent::TokenBytes(event) => ServerMessage::TokenBytes(event),
            GenerationEvent::Done(event) => ServerMessage::Done(event),
        }
    }
}

/// The stream of one generation: any number of `Ok(Token)`, then exactly one final item,
/// `Ok(Done)` or `Err`, then the end.
///
/// An `Err` is final: a rejection (busy, invalid request...) has no `Done`, and for an
/// engine failure the daemon's trailing `Done` is not surfaced. Dropping the stream
/// before its final item cancels the generation.
pub struct Generation {
    id: u64,
    events: mpsc::UnboundedReceiver<Result<GenerationEvent, ClientError>>,
    outgoing: mpsc::UnboundedSender<ClientMessage>,
    routes: Arc<Routes>,
    ended: bool,
}

impl Generation {
    pub(crate) fn new(
        id: u64,
        events: mpsc::UnboundedReceiver<Result<GenerationEvent, ClientError>>,
        outgoing: mpsc::UnboundedSender<ClientMessage>,
        routes: Arc<Routes>,
    ) -> Self {
        Self {
            id,
            events,
            outgoing,
            routes,
            ended: false,
        }
    }

    /// The request id of this generation.
    pub fn id(&self) -> u64 {
        self.id
    }

    /// Asks the daemon to stop; the stream goes on to its `Done` (usually `cancelled`).
    pub fn cancel(&self) -> Result<(), ClientError> {
        if self.ended {
            return Ok(());
        }
        self.outgoing
            .send(ClientMessage::Cancel { id: self.id })
            .map_err(|_| self.routes.closed_error())
    }

    /// Reads the stream to its end: the generated text and the final `Done` (tool
    /// calls are left out: see [`Generation::collect`]).
    pub async fn collect_text(self) -> Result<(String, DoneEvent), ClientError> {
        let (text, _, done) = self.collect().await?;
        Ok((text, done))
    }

    /// Reads the stream to its end: the generated text (the answer: a thinking model's
    /// reasoning is left out), the tool calls the model made, and the final `Done`.
    /// Streamed pieces of calls are left out, and with them a call that was cut short
    /// after its pieces began.
    pub async fn collect(
        mut self,
    ) -> Result<(String, Vec<crate::protocol::ToolCall>, DoneEvent), ClientError> {
        let mut text = String::new();
        let mut calls = Vec::new();
        while let Some(event) = self.next().await {
            match event? {
                GenerationEvent::Token(token) => text.push_str(&token.text),
                GenerationEvent::ToolCall(event) => calls.push(event.call),
                GenerationEvent::Prefilled(_)
                | GenerationEvent::Reasoning(_)
                | GenerationEvent::TokenBytes(_)
                | GenerationEvent::ToolCallDelta(_) => {}
                GenerationEvent::Done(done) => return Ok((text, calls, done)),
            }
        }
        Err(ClientError::Disconnected)
    }
}

impl Stream for Generation {
    type Item = Result<GenerationEvent, ClientError>;

    fn poll_next(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Self::Item>> {
        if self.ended {
            return Poll::Ready(None);
        }
        let item = match self.events.poll_recv(cx) {
            Poll::Pending => return Poll::Pending,
            Poll::Ready(Some(Ok(
                event @ (GenerationEvent::Token(_)
                | GenerationEvent::Prefilled(_)
                | GenerationEvent::ToolCall(_)
                | GenerationEvent::ToolCallDelta(_)
                | GenerationEvent::Reasoning(_)
                | GenerationEvent::TokenBytes(_)),
            ))) => return Poll::Ready(Some(Ok(event))),
            Poll::Ready(Some(last)) => last,
            // The route was dropped without a final item: the connection ended.
            Poll::Ready(None) => Err(self.routes.closed_error()),
        };
        self.ended = true;
        Poll::Ready(Some(item))
    }
}

impl Drop for Generation {
    fn drop(&mut self) {
        if !self.ended {
            self.routes.remove(self.id);
            // If the connection is already gone there is nothing left to cancel.
            let _ = self.outgoing.send(ClientMessage::Cancel { id: self.id });
        }
    }
}

impl std::fmt::Debug for Generation {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Generation")
            .field("id", &self.id)
            .field("ended", &self.ended)
            .finish()
    }
}
