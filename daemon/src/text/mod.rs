//! Text in, text out: tokenizers from GGUF metadata, streaming detokenization, chat
//! templates, sampling and stop strings.

mod bpe;
mod error;
mod fxhash;
mod pretokenize;
mod spec;
mod special;
mod spm;
mod tokenizer;
mod unicode;
mod unicode_data;

pub use error::TextError;
pub use pretokenize::PreTokenizer;
pub use spec::TokenizerSpec;
pub use tokenizer::Tokenizer;
