// gemm.cu - tensor-core GEMM for prefill (activations x dequantized weights), and the
// f32 -> f16/bf16 conversion of its activation operand.
//
// extern "C" __global__ void gemm_f16(const u16* a, const u16* b, float* c,
//                                     const float* bias, int m, int n, int k,
//                                     int accumulate)
// extern "C" __global__ void gemm_bf16(... same ...)
//   c[i][j] = sum_t a[i][t] * b[j][t]  (+ bias[j] when bias is not null)
//             (+ the old c[i][j] when accumulate != 0: the fused residual add)
//   a : m x k activations (tokens x features), f16/bf16 bits, row-major, lda = k
//   b : n x k weights (output features x input features), row-major, ldb = k: the
//       dequant.cu output, i.e. the GGUF matrix as stored
//   c : m x n f32, row-major, ldc = n (same layout as the mat-vec output)
//   k : a multiple of 8; a and b 16-byte aligned
//   grid : (ceil(m / 128), ceil(n / 128)); block: 256 threads; static shared 48 KiB
//
// extern "C" __global__ void convert_f32_f16(const float* in, u16* out, i64 n)
// extern "C" __global__ void convert_f32_bf16(const float* in, u16* out, i64 n)
//   out[i] = in[i] rounded to nearest even (f16: saturating at +-65504, as every f16
//   activation; bf16 has f32's range). grid any (grid-stride), block 256.
//
// Design: 128 x 128 output tile per block, k in steps of 32 through a three-stage
// cp.async pipeline in shared memory: two k-slices are in flight while a third is
// multiplied (one stage of overlap hides too little of a memory latency behind 32 mma
// per warp). Eight warps in a 2 x 4 arrangement each own a 64 x 32 sub-tile: 4 x 4
// mma.sync m16n8k16 tiles with f32 accumulators, operands fetched with ldmatrix.
// Shared rows are 32 halves, four 16-byte chunks, unpadded so that three stages fit the
// 48 KiB of static shared memory; chunk c of row r is stored at c ^ ((r / 2) % 4), which
// spreads the eight rows one ldmatrix phase reads (r0 .. r0 + 7, r0 a multiple of 8)
// over 8 distinct 16-byte bank groups. Out-of-range rows and the k tail are zero-filled
// by cp.async, so any m, n and k % 8 == 0 work.
//
// Raster order: blockIdx.x runs over the activation tiles, so the blocks resident at
// once share a few weight panels and cover every activation tile. Each weight panel
// then comes from memory about once while the activations (2048 x 4096 f16 is 16 MiB)
// stay in L2; the other order streams the whole weight matrix, which outgrows L2 on an
// 8B model (117 MB for the FFN), once per 128 activation rows.
#include "common.cuh"

#define GEMM_BM 128
#define GEMM_BN 128
#define GEMM_BK 32
#define GEMM_STAGES 3
#define GEMM_THREADS 256

// Offset, in halves, of logical chunk `c` (8 halves) of row `r` in a swizzled stage.
static __device__ __forceinline__ int gemm_swizzle(int r, int c) {
    return r * GEMM_BK + ((c ^ ((r >> 1) & 3)) << 3);
}

// Loads the 128 x 32 slice of `src` (rows row0.., columns k0..) into `dst`.
static __device__ __forceinline__ void gemm_load_tile(u16* dst, const u16* __restrict__ src,
                                                      int row0, int n_rows, int k0, int k) {
    // 128 rows x 4 chunks of 8 halves = 512 16-byte chunks, two per thread.
#pragma unroll
    for (int i = 0; i < 2; ++i) {
        const int chunk = threadIdx.x + i * GEMM_THREADS;
        const int r = chunk >> 2, c = chunk & 3;
        const int gr = row0 + r, gk = k0 + c * 8;
        const bool ok = gr < n_rows && gk < k;
        const u16* p = ok ? src + (u64)gr * k + gk : src;
        cp_async16(dst + gemm_swizzle(r, c), p, ok ? 16u : 0u);
    }
}

template <bool BF16>
static __device__ void gemm(const u16* __restrict__ a, const u16* __restrict__ b,
                            float* __restrict__ c, const float* __restrict__ bias, int m,
                            int n, int k, int accumulate) {
    constexpr int STAGE = GEMM_BM * GEMM_BK;  // halves per operand per stage
    __shared__ __align__(128) u16 sa[GEMM_STAGES * STAGE];
    __shared__ __align__(128) u16 sb[GEMM_STAGES * STAGE];

    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    const int wm = warp >> 2, wn = warp & 3;  // 2 x 4 warps
    const int bm = blockIdx.x * GEMM_BM, bn = blockIdx.y * GEMM_BN;

    float acc[4][4][4];
#pragma unroll
    for (int i = 0; i < 4; ++i)
#pragma unroll
        for (int j = 0; j < 4; ++j)
#pragma unroll
            for (int e = 0; e < 4; ++e) acc[i][j][e] = 0.0f;

    const int kt_count = (k + GEMM_BK - 1) / GEMM_BK;
    // Prologue: the first GEMM_STAGES - 1 slices. Every step commits one group, empty or
    // not, so that "all but the newest GEMM_STAGES - 2 groups" is always the slice about
    // to be used.
#pragma unroll
    for (int st = 0; st < GEMM_STAGES - 1; ++st) {
        if (st < kt_count) {
            gemm_load_tile(sa + st * STAGE, a, bm, m, st * GEMM_BK, k);
            gemm_load_tile(sb + st * STAGE, b, bn, n, st * GEMM_BK, k);
        }
        cp_async_commit();
    }

    for (int kt = 0; kt < kt_count; ++kt) {
        cp_async_wait<GEMM_STAGES - 2>();
        // Slice kt is visible to all, and every warp is done with slice kt - 1, whose
        // stage the prefetch below overwrites.
        __syncthreads();
        const int next = kt + GEMM_STAGES - 1;
        if (next < kt_count) {
            const int st = next % GEMM_STAGES;
            gemm_load_tile(sa + st * STAGE, a, bm, m, next * GEMM_BK, k);
            gemm_load_tile(sb + st * STAGE, b, bn, n, next * GEMM_BK, k);
        }
        cp_async_commit();

        const u16* cur_a = sa + (kt % GEMM_STAGES) * STAGE;
        const u16* cur_b = sb + (kt % GEMM_STAGES) * STAGE;
#pragma unroll
        for (int kk = 0; kk < GEMM_BK; kk += 16) {
            u32 af[4][4];
#pragma unroll
            for (int mt = 0; mt < 4; ++mt) {
                // Matrices: rows 0-7 / 8-15 x k 0-7, then the same rows x k 8-15.
                const int r = wm * 64 + mt * 16 + (lane & 15);
                ldmatrix_x4(af[mt], cur_a + gemm_swizzle(r, (kk >> 3) + (lane >> 4)));
            }
            u32 bf[4][2];
#pragma unroll
            for (int np = 0; np < 2; ++np) {
                // Matrices: (n 0-7, k 0-7), (n 0-7, k 8-15), (n 8-15, k 0-7), (n 8-15, k 8-15)
                // = b0, b1 of n-tile 2np, then b0, b1 of n-tile 2np + 1.
                const int r = wn * 32 + np * 16 + (lane >> 4) * 8 + (lane & 7);
                u32 t[4];
                ldmatrix_x4(t, cur_b + gemm_swizzle(r, (kk >> 3) + ((lane >> 3) & 1)));
                bf[2 * np][0] = t[0];
                bf[2 * np][1] = t[1];
                bf[2 * np + 1][0] = t[2];
                bf[2 * np + 1][1] = t[3];
            }
#pragma unroll
            for (int mt = 0; mt < 4; ++mt)
#pragma unroll
                for (int nt = 0; nt < 4; ++nt)
                    mma_16816<BF16>(acc[mt][nt], af[mt], bf[nt][0], bf[nt][1]);
        }
    }

    // Accumulator layout of m16n8: elements 0,1 at (row lane/4, cols 2(lane%4) + 0,1),
    // elements 2,3 eight rows further down.
#pragma unroll
    for (int mt = 0; mt < 4; ++mt)
#pragma unroll
        for (int nt = 0; nt < 4; ++nt)
#pragma unroll
            for (int e = 0; e < 4; ++e) {
                const int row = bm + wm * 64 + mt * 16 + (lane >> 2) + (e >> 1) * 8;
                const int col = bn + wn * 32 + nt * 8 + (lane & 3) * 2 + (e & 1);
                if (row < m && col < n) {
                    store_output(c + (u64)row * n + col, acc[mt][nt][e], bias, col,
                                 accumulate);
                }
            }
}

extern "C" __global__ void __launch_bounds__(GEMM_THREADS)
    gemm_f16(const u16* a, const u16* b, float* c, const float* bias, int m, int n, int k,
             int accumulate) {
    pdl_enter();
    gemm<false>(a, b, c, bias, m, n, k, accumulate);
}

extern "C" __global__ void __launch_bounds__(GEMM_THREADS)
    gemm_bf16(const u16* a, const u16* b, float* c, const float* bias, int m, int n, int k,
              int accumulate) {
    pdl_enter();
    gemm<true>(a, b, c, bias, m, n, k, accumulate);
}

extern "C" __global__ void convert_f32_f16(const float* in, u16* out, i64 n) {
    pdl_enter();
    for (i64 i = (i64)blockIdx.x * blockDim.x + threadIdx.x; i < n;
         i += (i64)gridDim.x * blockDim.x)
        out[i] = f32_to_f16_sat(in[i]);
}

extern "C" __global__ void convert_f32_bf16(const float* in, u16* out, i64 n) {
    pdl_enter();
    for (i64 i = (i64)blockIdx.x * blockDim.x + threadIdx.x; i < n;
         i += (i64)gridDim.x * blockDim.x)
        out[i] = f32_to_bf16(in[i]);
}
