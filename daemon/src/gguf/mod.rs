//! GGUF: reading (memory-mapped, hardened against crafted files) and writing.
//!
//! [`GgufFile`] parses only the header (metadata and tensor infos) and validates every
//! tensor's byte range; tensor data is borrowed from the mapping on demand.
//! [`GgufWriter`] builds files for tests, fixtures and synthetic models.

mod cursor;
mod error;
mod metadata;
mod parse;
mod reader;
mod tensor;
mod value;
mod writer;

#[cfg(test)]
mod tests;

pub use error::GgufError;
pub use metadata::Metadata;
pub use reader::GgufFile;
pub use tensor::{TensorInfo, MAX_DIMS};
pub use value::Value;
pub use writer::GgufWriter;
