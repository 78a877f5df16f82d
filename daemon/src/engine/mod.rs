//! The engine: a dedicated thread that owns the model, schedules sequences into batched
//! forward steps, samples, and streams each sequence's events to its own channel.

pub mod api;

pub use api::{ClientInfo, ConnId, Engine, Submission};
