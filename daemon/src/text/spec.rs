//! `TokenizerSpec`: everything a tokenizer is built from, as plain data (usually read
//! from a GGUF file's `tokenizer.ggml.*` metadata).

use super::{PreTokenizer, TextError};
use crate::gguf::{GgufError, Metadata, Value};

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

impl TokenizerSpec {
    /// Reads `tokenizer.ggml.*` from GGUF metadata, resolving defaults the way llama.cpp
    /// does: `llama` vocabularies add BOS and a space prefix unless told otherwise and
    /// default to BOS 1 / EOS 2 / UNK 0; `gpt2` vocabularies add BOS only for
    /// pre-tokenizers that llama.cpp says need it (Llama 3).
    pub fn from_gguf(meta: &Metadata) -> Result<Self, TextError> {
        let model = meta.get_str("tokenizer.ggml.model")?.to_string();
        let pre = meta.opt_str("tokenizer.ggml.pre")?.map(str::to_string);
        let tokens: Vec<String> = meta
            .get_str_array("tokenizer.ggml.tokens")?
            .into_iter()
            .map(str::to_string)
            .collect();
        let token_types = optional(meta, "tokenizer.ggml.token_type", Metadata::get_i32_array)?;
        let scores = optional(meta, "tokenizer.ggml.scores", Metadata::get_f32_array)?;
        let is_spm = model == "llama";
        let merges = if model == "gpt2" {
            meta.get_str_array("tokenizer.ggml.merges")?
                .into_iter()
                .map(str::to_string)
                .collect()
        } else {
            Vec::new()
        };

        // llama.cpp's defaults for SentencePiece vocabularies, dropped when out of range.
        let n = tokens.len();
        let spm_default = |id: u32| (is_spm && (id as usize) < n).then_some(id);
        let default_add_bos = match (is_spm, pre.as_deref()) {
            (true, _) => true,
            (false, Some(name)) => PreTokenizer::from_name(name)?.default_add_bos(),
            (false, None) => false,
        };
        Ok(Self {
            bos: special_id(meta, "tokenizer.ggml.bos_token_id")?.or(spm_default(1)),
            eos: special_id(meta, "tokenizer.ggml.eos_token_id")?.or(spm_default(2)),
            eot: special_id(meta, "tokenizer.ggml.eot_token_id")?,
            eom: special_id(meta, "tokenizer.ggml.eom_token_id")?,
            pad: special_id(meta, "tokenizer.ggml.padding_token_id")?,
            unk: special_id(meta, "tokenizer.ggml.unknown_token_id")?.or(spm_default(0)),
            add_bos: meta
                .opt_bool("tokenizer.ggml.add_bos_token")?
                .unwrap_or(default_add_bos),
            add_eos: meta
                .opt_bool("tokenizer.ggml.add_eos_token")?
                .unwrap_or(false),
            add_space_prefix: meta
                .opt_bool("tokenizer.ggml.add_space_prefix")?
                .unwrap_or(is_spm),
            model,
            pre,
            tokens,
            token_types,
            merges,
            scores,
        })
    }
}

fn optional<'a, T>(
    meta: &'a Metadata,
    key: &str,
    get: impl FnOnce(&'a Metadata, &str) -> Result<T, GgufError>,
) -> Result<Option<T>, TextError> {
    if meta.contains_key(key) {
        Ok(Some(get(meta, key)?))
    } else {
        Ok(None)
    }
}

/// A special token id; a negative value (some converters write -1 for "none") is absent.
fn special_id(meta: &Metadata, key: &str) -> Result<Option<u32>, TextError> {
    match meta.get(key) {
        Some(Value::I32(v)) if *v < 0 => Ok(None),
        Some(Value::I64(v)) if *v < 0 => Ok(None),
        _ => Ok(meta.opt_u32(key)?),
    }
}
