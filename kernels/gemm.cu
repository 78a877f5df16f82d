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
//   grid : (ceil(m / 128), ceil(n / 128)); block: 256 threads; static shared 40 KiB
//
// extern "C" __global__ void convert_f32_f16(const float* in, u16* out, i64 n)
// extern "C" __global__ void convert_f32_bf16(const float* in, u16* out, i64 n)
//   out[i] = in[i] rounded to nearest even. grid any (grid-stride), block 256.
//
// Design: 128 x 128 output tile per block, k in steps of 32, double-buffered in shared
// memory with cp.async (the next k-slice loads while the current one is multiplied).
// Eight warps in a 2 x 4 arrangement each own a 64 x 32 sub-tile: 4 x 4 mma.sync
// m16n8k16 tiles with f32 accumulators, operands fetched with ldmatrix. Shared rows are
// padded from 32 to 40 halves (80 bytes), which makes every ldmatrix phase hit 8
// distinct 16-byte bank groups. Out-of-range rows and the k tail are zero-filled by
// cp.async, so any m, n and k % 8 == 0 work.
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
#define GEMM_SK 40  // padded shared row, in halves
#define GEMM_THREADS 256

// Loads the 128 x 32 slice of `src` (rows row0.., columns k0..) into `dst`.
static __device__ __forceinline__ void gemm_load_tile(u16* dst, const u16* __restrict__ src,
                                                      int row0, int n_rows, int k0, int k) {
    // 128 rows x 4 chunks of 8 halves = 512 16-byte chunks, two per thread.
#pragma unroll
    for (int i = 0; i < 2; ++i) {
        const int chunk = threadIdx.x + i * GEMM_THREADS;
        const int r = chunk >> 2, kc = (chunk & 3) * 8;
        const int gr = row0 + r, gk = k0 + kc;
        const bool ok = gr < n_rows && gk < k;
        const u16* p = ok ? src + (u64)gr * k + gk : src;
        cp_async16(dst + r * GEMM_SK + kc, p, ok ? 16u : 0u);
    }
}

template <bool BF16>
static __device__ void gemm(const u16* __restrict__ a, const u16* __restrict__ b,
                            float* __restrict__ c, const float* __restrict__ bias, int m,
                            int n, int k, int accumulate) {
    __shared__ __align__(16) u16 sa[2][GEMM_BM * GEMM_SK];
    __shared__ __align__(16) u16 sb[2][GEMM_BN * GEMM_SK];

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
    gemm_load_tile(sa[0], a, bm, m, 0, k);
    gemm_load_tile(sb[0], b, bn, n, 0, k);
    cp_async_commit();

    for (int kt = 0; kt < kt_count; ++kt) {
        const int s = kt & 1;
        if (kt + 1 < kt_count) {
            gemm_load_tile(sa[s ^ 1], a, bm, m, (kt + 1) * GEMM_BK, k);
            gemm_load_tile(sb[s ^ 1], b, bn, n, (kt + 1) * GEMM_BK, k);
        }
        // Always commit (possibly an empty group) so that "all but the newest group"
        // is exactly the slice about to be used.
        cp_async_commit();
        cp_async_wait<1>();
        __syncthreads();

#pragma unroll
        for (int kk = 0; kk < GEMM_BK; kk += 16) {
            u32 af[4][4];
#pragma unroll
            for (int mt = 0; mt < 4; ++mt) {
                // Matrices: rows 0-7 / 8-15 x k 0-7, then the same rows x k 8-15.
                const int r = wm * 64 + mt * 16 + (lane & 15);
                ldmatrix_x4(af[mt], &sa[s][r * GEMM_SK + kk + (lane >> 4) * 8]);
            }
            u32 bf[4][2];
#pragma unroll
            for (int np = 0; np < 2; ++np) {
                // Matrices: (n 0-7, k 0-7), (n 0-7, k 8-15), (n 8-15, k 0-7), (n 8-15, k 8-15)
                // = b0, b1 of n-tile 2np, then b0, b1 of n-tile 2np + 1.
                const int r = wn * 32 + np * 16 + (lane >> 4) * 8 + (lane & 7);
                u32 t[4];
                ldmatrix_x4(t, &sb[s][r * GEMM_SK + kk + ((lane >> 3) & 1) * 8]);
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
        __syncthreads();  // the next iteration's loads overwrite this stage
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
    gemm<false>(a, b, c, bias, m, n, k, accumulate);
}

extern "C" __global__ void __launch_bounds__(GEMM_THREADS)
    gemm_bf16(const u16* a, const u16* b, float* c, const float* bias, int m, int n, int k,
              int accumulate) {
    gemm<true>(a, b, c, bias, m, n, k, accumulate);
}

extern "C" __global__ void convert_f32_f16(const float* in, u16* out, i64 n) {
    for (i64 i = (i64)blockIdx.x * blockDim.x + threadIdx.x; i < n;
         i += (i64)gridDim.x * blockDim.x)
        out[i] = f32_to_f16(in[i]);
}

extern "C" __global__ void convert_f32_bf16(const float* in, u16* out, i64 n) {
    for (i64 i = (i64)blockIdx.x * blockDim.x + threadIdx.x; i < n;
         i += (i64)gridDim.x * blockDim.x)
        out[i] = f32_to_bf16(in[i]);
}
