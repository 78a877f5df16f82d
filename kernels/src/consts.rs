//! Shapes the kernels are built around, mirrored from the `#define`s in common.cuh (a
//! test checks that they agree). Hosts size grids, scratch buffers and checks with them.

/// Positions per paged KV block; must equal the daemon's `model::kv::BLOCK_TOKENS`.
pub const KV_BLOCK_TOKENS: usize = 16;
/// Largest batch one decode mat-vec launch handles.
pub const MMV_MAX_BATCH: usize = 16;
/// Warps per block of the mat-vec kernels (they split K).
pub const MMV_WARPS: usize = 8;
/// Most activation rows one tensor-core mat-mul (`mmq`) launch handles.
pub const MMQ_MAX_TOKENS: usize = 64;
/// Warps per block of the `mmq` kernels (they split K).
pub const MMQ_WARPS: usize = 8;
/// Weight rows one `mmq` block covers: the grid is `rows.div_ceil(MMQ_ROWS)`.
pub const MMQ_ROWS: usize = 16;
/// Threads per `mmq` block.
pub const MMQ_THREADS: u32 = (MMQ_WARPS * 32) as u32;
/// Positions per block (split) of the decode attention.
pub const ATTN_PARTITION: usize = 256;
/// Query heads per kv head the attention kernels handle.
pub const MAX_GQA_GROUP: usize = 16;
/// Largest head size the attention kernels handle.
pub const MAX_HEAD_DIM: usize = 256;

/// Weight rows one mat-vec block covers: the grid is `rows.div_ceil(MMV_ROWS_PER_BLOCK)`.
pub const MMV_ROWS_PER_BLOCK: usize = 4;
/// Rows of each matrix one fused gate/up mat-vec (`mmv_glu`) block covers.
pub const MMV_GLU_ROWS_PER_BLOCK: usize = MMV_ROWS_PER_BLOCK / 2;
/// Threads per mat-vec block.
pub const MMV_THREADS: u32 = (MMV_WARPS * 32) as u32;
/// Output tile and threads of the prefill GEMM: grid `(tokens / 128, weight rows / 128)`,
/// each rounded up.
pub const GEMM_TILE: usize = 128;
pub const GEMM_THREADS: u32 = 256;
/// Threads of the decode attention and its reduction.
pub const ATTN_DECODE_THREADS: u32 = 128;
/// Queries per block and threads of the prefill attention.
pub const ATTN_PREFILL_QUERIES: usize = 16;
pub const ATTN_PREFILL_THREADS: u32 = 256;
/// Queries per block and threads of the tensor-core prefill attention.
pub const ATTN_PREFILL_TC_QUERIES: usize = 64;
pub const ATTN_PREFILL_TC_THREADS: u32 = 128;

#[cfg(test)]
mod tests {
    use super::*;
    use crate::sources::{source, HEADERS};

    /// The value of `#define NAME value` in `text`.
    fn define(text: &str, name: &str) -> Option<usize> {
        text.lines().find_map(|l| {
            let mut it = l.split_whitespace();
            (it.next() == Some("#define") && it.next() == Some(name))
                .then(|| it.next()?.parse().ok())?
        })
    }

    #[test]
    fn rust_constants_match_the_cuda_defines() {
        let common = HEADERS.iter().find(|(n, _)| *n == "common.cuh").unwrap().1;
        for (name, value) in [
            ("SPARKD_KV_BLOCK_TOKENS", KV_BLOCK_TOKENS),
            ("SPARKD_MMV_MAX_BATCH", MMV_MAX_BATCH),
            ("SPARKD_MMV_WARPS", MMV_WARPS),
            ("SPARKD_MMV_ROWS", MMV_ROWS_PER_BLOCK),
            ("SPARKD_MMQ_WARPS", MMQ_WARPS),
            ("SPARKD_MMQ_ROWS", MMQ_ROWS),
            ("SPARKD_ATTN_PARTITION", ATTN_PARTITION),
            ("SPARKD_MAX_GQA_GROUP", MAX_GQA_GROUP),
            ("SPARKD_MAX_HEAD_DIM", MAX_HEAD_DIM),
        ] {
            assert_eq!(define(common, name), Some(value), "{name}");
        }
        let gemm = source("gemm.cu").unwrap();
        assert_eq!(define(gemm, "GEMM_BM"), Some(GEMM_TILE));
        assert_eq!(define(gemm, "GEMM_BN"), Some(GEMM_TILE));
        assert_eq!(define(gemm, "GEMM_THREADS"), Some(GEMM_THREADS as usize));
        let dec = source("attn_decode.cu").unwrap();
        assert_eq!(
            define(dec, "DEC_THREADS"),
            Some(ATTN_DECODE_THREADS as usize)
        );
        let pre = source("attn_prefill.cu").unwrap();
        assert_eq!(
            define(pre, "PRE_THREADS"),
            Some(ATTN_PREFILL_THREADS as usize)
        );
        assert_eq!(define(pre, "PRE_QUERIES"), Some(ATTN_PREFILL_QUERIES));
        assert_eq!(
            define(pre, "PRE_TC_THREADS"),
            Some(ATTN_PREFILL_TC_THREADS as usize)
        );
        assert_eq!(define(pre, "PRE_TC_QUERIES"), Some(ATTN_PREFILL_TC_QUERIES));
    }
}
