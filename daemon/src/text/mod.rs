//! Text in, text out: tokenizers from GGUF metadata, chat templates, sampling, stop strings.
