// matvec.cu - quantized weight x small batch of activation rows, for decode.
//
// extern "C" __global__ void mmv_<fmt>_b<NB>(const u8* w, const float* x, float* y,
//                                            const float* bias, int rows, int cols,
//                                            int nb, int accumulate)
//   <fmt> : f32 f16 bf16 q4_0 q4_1 q5_0 q5_1 q8_0 q4_k q5_k q6_k (the weight's GGUF type)
//   <NB>  : 1, 4, 8 or 16: the most activation rows the kernel handles; launch the
//           smallest variant with NB >= nb (nb is clamped to NB)
//   w     : rows x cols weights in the GGUF block layout, row-major (row r starts at
//           r * (cols / block_elems) * block_bytes)
//   x     : nb x cols f32 activations, row-major, 16-byte aligned
//   y     : nb x rows f32 outputs: y[b][r] = sum_k w[r][k] * x[b][k]
//           (+ bias[r] when bias is not null) (+ the old y[b][r] when accumulate != 0,
//           which fuses the residual add of the attention output and FFN down matrices)
//   cols  : a multiple of the format's block size (32 legacy, 256 K-quants) and of 8
//   grid  : (ceil(rows / (SPARKD_MMV_WARPS * SPARKD_MMV_ROWS_PER_WARP))) = rows / 16
//   block : SPARKD_MMV_WARPS * 32 = 256 threads; static shared memory NB * 2 KiB
//
// Design: decode is bound by reading the weights, so each weight is read from memory
// exactly once per step whatever the batch: a warp owns SPARKD_MMV_ROWS_PER_WARP rows,
// its lanes walk the rows in groups of eight weights (quant.cuh dq8), dequantize each
// group once into registers and multiply it into all NB activation rows, keeping NB
// partial sums per row in registers. The activations are staged in shared memory in
// SPARKD_MMV_TILE-element slices that every warp of the block reuses. Partial sums are
// reduced across the warp with shuffles at the end.
#include "quant.cuh"

template <int T, int NB>
static __device__ void mmv(const u8* __restrict__ w, const float* __restrict__ x,
                           float* __restrict__ y, const float* __restrict__ bias, int rows,
                           int cols, int nb, int accumulate) {
    constexpr int TILE = SPARKD_MMV_TILE;
    constexpr int ROWS = SPARKD_MMV_ROWS_PER_WARP;
    static_assert(TILE % 256 == 0, "a tile holds whole K-quant super-blocks");
    __shared__ float4 xs4[NB * TILE / 4];
    const float* xs = (const float*)xs4;

    nb = nb < NB ? nb : NB;
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    const int row0 = (blockIdx.x * SPARKD_MMV_WARPS + warp) * ROWS;
    const u64 rb = row_bytes<T>(cols);

    float acc[ROWS][NB];
#pragma unroll
    for (int r = 0; r < ROWS; ++r)
#pragma unroll
        for (int b = 0; b < NB; ++b) acc[r][b] = 0.0f;

    for (int k0 = 0; k0 < cols; k0 += TILE) {
        const int len = cols - k0 < TILE ? cols - k0 : TILE;
        __syncthreads();  // the previous slice is no longer being read
        for (int i = threadIdx.x; i < NB * (TILE / 4); i += blockDim.x) {
            const int b = i / (TILE / 4), j = 4 * (i % (TILE / 4));
            xs4[i] = b < nb && j < len ? *(const float4*)(x + (u64)b * cols + k0 + j)
                                       : make_float4(0.0f, 0.0f, 0.0f, 0.0f);
        }
        __syncthreads();
        const int groups = len / 8;
        // The row loop sits inside the group loop so that each activation read from
        // shared memory serves all of the warp's rows: shared-memory bandwidth, not
        // DRAM, would otherwise bound the larger batches. Each (row, batch) sum still
        // takes its terms in the same order.
        for (int gl = lane; row0 < rows && gl < groups; gl += 32) {
            float wv[ROWS][8];
            int e0 = 0, e1 = 0;
#pragma unroll
            for (int r = 0; r < ROWS; ++r) {
                if (row0 + r < rows) {  // warp-uniform
                    dq8<T>(w + (u64)(row0 + r) * rb, k0 / 8 + gl, wv[r], e0, e1);
                } else {
#pragma unroll
                    for (int i = 0; i < 8; ++i) wv[r][i] = 0.0f;
                }
            }
            e0 -= k0;
            e1 -= k0;
#pragma unroll
            for (int b = 0; b < NB; ++b) {
                const float4 a = *(const float4*)(xs + b * TILE + e0);
                const float4 c = *(const float4*)(xs + b * TILE + e1);
#pragma unroll
                for (int r = 0; r < ROWS; ++r) {
                    float s = acc[r][b];
                    s = fmaf(wv[r][0], a.x, s);
                    s = fmaf(wv[r][1], a.y, s);
                    s = fmaf(wv[r][2], a.z, s);
                    s = fmaf(wv[r][3], a.w, s);
                    s = fmaf(wv[r][4], c.x, s);
                    s = fmaf(wv[r][5], c.y, s);
                    s = fmaf(wv[r][6], c.z, s);
                    s = fmaf(wv[r][7], c.w, s);
                    acc[r][b] = s;
                }
            }
        }
    }

#pragma unroll
    for (int r = 0; r < ROWS; ++r) {
        const int row = row0 + r;
#pragma unroll
        for (int b = 0; b < NB; ++b) {
            const float v = warp_sum(acc[r][b]);
            if (lane == 0 && row < rows && b < nb) {
                float* dst = y + (u64)b * rows + row;
                const float out = v + (bias ? bias[row] : 0.0f);
                *dst = accumulate ? *dst + out : out;
            }
        }
    }
}

#define MMV_ENTRY(name, T, NB)                                                            \
    extern "C" __global__ void __launch_bounds__(SPARKD_MMV_WARPS * 32, 1)               \
        mmv_##name##_b##NB(const u8* w, const float* x, float* y, const float* bias,     \
                           int rows, int cols, int nb, int accumulate) {                 \
        mmv<T, NB>(w, x, y, bias, rows, cols, nb, accumulate);                           \
    }
#define MMV_ALL_BATCHES(name, T) \
    MMV_ENTRY(name, T, 1)        \
    MMV_ENTRY(name, T, 4)        \
    MMV_ENTRY(name, T, 8)        \
    MMV_ENTRY(name, T, 16)
SPARKD_FOR_EACH_WTYPE(MMV_ALL_BATCHES)
