//! JSON output held to a JSON Schema (`OutputFormat::JsonSchema`).
//!
//! [`Schema::compile`] turns the schema document into a graph of nodes, one per kind of
//! value (object, array, string, number, literal texts, a choice between alternatives),
//! with `$ref`s resolved into edges, so recursive schemas cost nothing more. The
//! [`SchemaState`] then follows a JSON text through that graph one byte at a time, on
//! top of [`JsonAcceptor`](super::json::JsonAcceptor)'s syntax: it refuses a byte as
//! soon as no text that starts with it could still match the schema. The state is
//! `Copy` (the frames of enclosing containers live in a [`FrameStack`] that only grows
//! while a mask is built), which is what the constrained sampler's trie walk needs.
//!
//! What the schema may say, and what is refused with a clear error rather than
//! silently not enforced, is listed on [`Schema::compile`].

mod accept;
mod compile;
mod format;
mod number;
mod pattern;

pub use accept::{FrameStack, PatternString, SchemaState};
pub use compile::{Schema, SchemaError};
pub use pattern::{Pattern, PatternWalk};

#[cfg(test)]
mod tests;
