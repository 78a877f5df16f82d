//! The CPU backend: quantized matrix kernels (scalar, AVX2, AVX-512 VNNI, NEON) and the
//! thread pool that runs them.
//!
//! `matmul` is the entry point: `y = x * W^T` for a weight matrix (in its GGUF layout, or
//! packed at load where the kernels want it, see `packed.rs`) and a batch of `f32`
//! activation rows. Activations are quantized once per call (to the
//! 8-bit format that pairs with the weight type, as ggml does) and each thread takes
//! chunks of weight rows, running every activation row against them while they are in
//! cache. The SIMD path is picked once at run time from the CPU's features.

mod acts;
mod attn;
mod backend;
mod dot;
mod matmul;
mod packed;
mod pool;
#[cfg(test)]
mod testutil;

pub use acts::{MatmulMode, MatmulScratch};
pub use attn::{attn_kernels, AttnKernels, Softmax};
pub use backend::CpuBackend;
pub use matmul::{dequantize_row, matmul, Weight, WeightMatrix};
pub use packed::{should_pack, PackedMatrix};
pub use pool::{physical_cores, ThreadPool};

use crate::quant::GgmlType;

/// Why a weight matrix cannot be used by the CPU kernels.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum KernelError {
    #[error("{0} weights are not supported by the CPU matmul")]
    UnsupportedType(GgmlType),
    #[error("a row of {cols} elements is not a whole number of {ty} blocks")]
    RaggedRow { ty: GgmlType, cols: usize },
    #[error("{rows}x{cols} {ty} weights take {expected} bytes, got {got}")]
    SizeMismatch {
        ty: GgmlType,
        rows: usize,
        cols: usize,
        expected: u64,
        got: usize,
    },
}

/// The active SIMD path: "avx512-vnni", "avx2", "neon-dotprod", "neon" or "scalar".
pub fn kernel_name() -> &'static str {
    dot::best().name
}
