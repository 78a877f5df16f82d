//! Quantized tensor formats: block layouts, dequantization and reference quantizers.

mod dequant;
mod quantize;
mod quantize_iq;
mod quantize_k;
pub mod types;

pub use dequant::dequantize;
pub(crate) use dequant::{iq4_xs_scale, k_2bit_level, q3_k_scale};
pub use quantize::quantize;
pub use types::*;

/// Why a (de)quantization request was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum QuantError {
    #[error("{elems} elements are not a whole number of {ty} blocks")]
    NotBlockMultiple { ty: GgmlType, elems: usize },
    #[error("{elems} elements of {ty} take {expected} bytes, got {got}")]
    LengthMismatch {
        ty: GgmlType,
        elems: usize,
        expected: u64,
        got: usize,
    },
}

#[cfg(test)]
mod tests;
