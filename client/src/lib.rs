//! Client library for sparkd: the wire protocol, its framing, and an async client.

pub mod protocol;
pub mod models;
