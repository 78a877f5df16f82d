//! Errors of the text layer: tokenizer loading, templates, sampling parameters.

use thiserror::Error;

#[derive(Debug, Error)]
pub enum TextError {
    #[error("unknown tokenizer model type '{0}' (supported: gpt2, llama)")]
    UnknownModel(String),
    #[error("unknown pre-tokenizer '{0}': refusing to guess how this vocabulary splits text")]
    UnknownPreTokenizer(String),
    #[error("special token {name} = {id} is outside the vocabulary (size {vocab_size})")]
    SpecialTokenOutOfRange {
        name: &'static str,
        id: u32,
        vocab_size: usize,
    },
    #[error("the vocabulary asks to add {0} but does not define its id")]
    MissingSpecialToken(&'static str),
    #[error("invalid vocabulary: {0}")]
    InvalidVocab(String),
    #[error("tokenizer metadata: {0}")]
    Gguf(#[from] crate::gguf::GgufError),
    #[error("chat template does not compile: {0}")]
    TemplateSyntax(String),
    #[error("chat template failed to render: {0}")]
    TemplateRender(String),
    #[error("chat_template_kwargs: {0}")]
    TemplateVariables(String),
    #[error("invalid sampling parameter {field}: {message}")]
    InvalidSampling {
        field: &'static str,
        message: String,
    },
}

impl TextError {
    pub(crate) fn sampling(field: &'static str, message: impl Into<String>) -> Self {
        TextError::InvalidSampling {
            field,
            message: message.into(),
        }
    }
}
