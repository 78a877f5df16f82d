//! `TokenizerSpec`: everything a tokenizer is built from, as plain data (usually read
//! from a GGUF file's `tokenizer.ggml.*` metadata).

/// The vocabulary and its settings. Flags hold final values: defaults that depend on the
/// model type are resolved by whoever builds the spec (see `from_gguf`).
#[derive(Debug, Clone, Default, PartialEq)]
pub struct TokenizerSpec {
    /// `gpt2` (byte-level BPE) or `llama` (SentencePiece BPE).
    pub model: String,
    /// The pre-tokenizer name for `gpt2` vocabularies (`tokenizer.ggml.pre`).
    pub pre: Option<String>,
    pub tokens: Vec<String>,
    /// GGUF token types (1 normal, 2 unknown, 3 control, 4 user-defined, 5 unused, 6 byte).
    pub token_types: Option<Vec<i32>>,
    /// `"left right"` merge rules in rank order (`gpt2` only).
    pub merges: Vec<String>,
    /// Merge scores (`llama` only).
    pub scores: Option<Vec<f32>>,
    pub bos: Option<u32>,
    pub eos: Option<u32>,
    /// End of turn; found by name (e.g. `<|im_end|>`) when `None`, as llama.cpp does.
    pub eot: Option<u32>,
    /// End of message (`<|eom_id|>`); found by name when `None`.
    pub eom: Option<u32>,
    pub pad: Option<u32>,
    pub unk: Option<u32>,
    pub add_bos: bool,
    pub add_eos: bool,
    /// `llama` only: prefix a space to text at the start and after special tokens.
    pub add_space_prefix: bool,
}
