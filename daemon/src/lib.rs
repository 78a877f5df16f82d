//! sparkd: a resident LLM daemon. The model is loaded once and serves generate requests
//! over a Unix socket, batching concurrent requests into shared forward steps.

pub mod backend;
pub mod bench;
pub mod bench_cuda;
pub mod cli;
pub mod daemon;
pub mod engine;
pub mod gguf;
pub mod model;
pub mod model_watch;
pub mod notify;
pub mod quant;
pub mod server;
pub mod text;
