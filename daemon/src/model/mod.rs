//! Llama-family models: configuration from GGUF metadata, weights, the batched forward and the paged KV cache.
