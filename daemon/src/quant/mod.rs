//! Quantized tensor formats: block layouts, dequantization and reference quantizers.

pub mod types;

pub use types::*;
