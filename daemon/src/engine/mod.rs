//! The engine: a dedicated thread that owns the model's working state, schedules
//! sequences into batched forward steps, samples, and streams each sequence's events
//! to its own channel.

pub mod api;
mod core;
pub mod handle;
pub mod jobs;
pub mod scheduler;
pub mod sequence;
#[cfg(test)]
mod tests;

pub use api::{ClientInfo, ConnId, Engine, Submission};
pub use handle::{resident_bytes, EngineConfig, EngineError, EngineHandle, QueueLimits};
