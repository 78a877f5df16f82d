//! Client library for sparkd: the wire protocol, its framing, and an async client.
//!
//! ```no_run
//! # async fn demo() -> Result<(), spark_client::ClientError> {
//! use futures::StreamExt;
//! use spark_client::{protocol::*, Client, GenerationEvent};
//!
//! let client = Client::connect(spark_client::resolve_socket_path(None)).await?;
//! let request = GenerateRequest {
//!     id: client.next_request_id(),
//!     model: None,
//!     input: PromptInput::Chat { messages: vec![ChatMessage::new("user", "Hello!")] },
//!     sampling: SamplingParams::default(),
//!     max_tokens: Some(64),
//!     stop: Vec::new(),
//!     logprobs: None,
//! };
//! let mut generation = client.generate(request).await?;
//! while let Some(event) = generation.next().await {
//!     match event? {
//!         GenerationEvent::Prefilled(p) => eprintln!("{} prompt tokens cached", p.cached_tokens),
//!         GenerationEvent::Token(token) => print!("{}", token.text),
//!         GenerationEvent::ToolCall(c) => println!("\n{}({})", c.call.name, c.call.arguments),
//!         // Only for requests with `GenerateOption::StreamToolCalls`.
//!         GenerationEvent::ToolCallDelta(_) => {}
//!         GenerationEvent::Reasoning(r) => eprint!("{}", r.text),
//!         // Only for requests with logprobs.
//!         GenerationEvent::TokenBytes(_) => {}
//!         GenerationEvent::Done(done) => println!("\n{:?}", done.finish_reason),
//!     }
//! }
//! # Ok(()) }
//! ```

pub mod blocking;
mod client;
pub mod codec;
mod error;
mod generation;
pub mod limits;
pub mod models;
pub mod openai;
pub mod protocol;
mod socket_path;

pub use client::{Client, ConnectOptions, CLIENT_MAX_FRAME_BYTES};
pub use error::{kind_name, ClientError};
pub use generation::{Generation, GenerationEvent};
pub use socket_path::{
    current_uid, default_socket_path, resolve_socket_path, system_socket_path, SOCKET_ENV,
    SYSTEM_SOCKET_PATH,
};
