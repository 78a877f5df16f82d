//! Client library for sparkd: the wire protocol, its framing, and an async client.

pub mod openai;
pub mod protocol;
