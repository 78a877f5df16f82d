//! Text in, text out: tokenizers from GGUF metadata, streaming detokenization, chat
//! templates, sampling and stop strings.

mod bpe;
pub mod constraint;
mod error;
mod fxhash;
pub mod json;
mod plain_marks;
mod pretokenize;
pub mod reasoning;
pub mod sampler;
pub mod schema;
mod spec;
mod special;
mod spm;
mod stop;
mod stream;
mod template;
mod template_compat;
mod template_vars;
mod tokenizer;
pub mod tools;
mod unicode;
mod unicode_data;

pub use error::TextError;
pub use plain_marks::PlainMarks;
pub use pretokenize::PreTokenizer;
pub use sampler::Sampler;
pub use spec::TokenizerSpec;
pub use stop::{StopMatcher, StopOutput};
pub use stream::StreamDecoder;
pub use template::ChatTemplate;
pub use template_vars::TemplateVars;
/// A small byte-level vocabulary, for tests outside `text`.
#[cfg(test)]
pub(crate) use tokenizer::tests::bpe_spec;
pub use tokenizer::Tokenizer;
