//! The error type of GGUF reading, metadata lookup and writing.

use std::path::PathBuf;

/// Everything that can go wrong reading or writing a GGUF file.
///
/// Parse errors name the field (key, tensor) and the byte offset where the problem was
/// found, so a user with a broken file can see what is wrong without a hex editor.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum GgufError {
    #[error("{}: {source}", path.display())]
    Io {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },

    #[error("not a GGUF file (the first four bytes are not \"GGUF\")")]
    BadMagic,

    #[error(
        "big-endian GGUF file (version {0} byte-swapped): only little-endian files are supported"
    )]
    BigEndian(u32),

    #[error("unsupported GGUF version {0}: only versions 2 and 3 are supported{hint}", hint = version_hint(*.0))]
    UnsupportedVersion(u32),

    #[error("file truncated: {what} at offset {offset} runs past the end of the file")]
    Truncated { what: String, offset: u64 },

    #[error("{what} at offset {offset} is {value}, above the limit of {limit}")]
    TooLarge {
        what: String,
        value: u64,
        limit: u64,
        offset: u64,
    },

    #[error("{what} at offset {offset} is not valid UTF-8")]
    BadUtf8 { what: String, offset: u64 },

    #[error("metadata key `{key}` at offset {offset} has unknown value type {type_id}")]
    UnknownValueType {
        key: String,
        type_id: u32,
        offset: u64,
    },

    #[error("metadata key `{key}` appears twice (second time at offset {offset})")]
    DuplicateKey { key: String, offset: u64 },

    #[error("bad `general.alignment`: {reason}")]
    BadAlignment { reason: String },

    #[error("metadata key `{key}` is missing")]
    MissingKey { key: String },

    #[error("metadata key `{key}` has type {found}, expected {expected}")]
    WrongType {
        key: String,
        expected: &'static str,
        found: &'static str,
    },

    #[error("metadata key `{key}` holds {value}, which does not fit in {target}")]
    OutOfRange {
        key: String,
        value: String,
        target: &'static str,
    },

    #[error("tensor `{tensor}` has type id {type_id}, which sparkd does not support")]
    UnknownTensorType { tensor: String, type_id: u32 },

    #[error("tensor `{tensor}`: {reason}")]
    BadTensor { tensor: String, reason: String },

    #[error("tensor `{0}` appears twice")]
    DuplicateTensor(String),

    #[error("tensor `{0}` is missing")]
    MissingTensor(String),

    /// A value handed to [`GgufWriter`](super::GgufWriter) cannot be encoded as GGUF.
    #[error("cannot write GGUF: {0}")]
    Unencodable(String),
}

fn version_hint(version: u32) -> &'static str {
    if version == 1 {
        " (version 1 is obsolete: re-convert the model with a current llama.cpp)"
    } else {
        ""
    }
}
