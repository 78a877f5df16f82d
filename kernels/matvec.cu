// matvec.cu - quantized weight x small batch of activation rows, for decode.
//
// extern "C" __global__ void mmv_<fmt>_b<NB>(const u8* w, const float* x, float* y,
//                                            const float* bias, int rows, int cols,
//                                            int nb, int accumulate,
//                                            const float* norm_gain, float norm_eps)
//   <fmt> : f32 f16 bf16 q4_0 q4_1 q5_0 q5_1 q8_0 q2_k q3_k q4_k q5_k q6_k iq4_nl
//           iq4_xs (the weight's GGUF type)
//   <NB>  : 1, 4, 8 or 16: the most activation rows the kernel handles; launch the
//           smallest variant with NB >= nb (nb is clamped to NB)
//   w     : rows x cols weights in the GGUF block layout, row-major (row r starts at
//           r * (cols / block_elems) * block_bytes)
//   x     : nb x cols f32 activations, row-major, 16-byte aligned
//   y     : nb x rows f32 outputs: y[b][r] = sum_k w[r][k] * x'[b][k]
//           (+ bias[r] when bias is not null) (+ the old y[b][r] when accumulate != 0,
//           which fuses the residual add of the attention output and FFN down matrices)
//   norm_gain : null: x' = x. Else the RMSNorm in front is fused in: x is the residual
//           stream and x'[b] = rmsnorm(x[b]) * norm_gain (cols floats, 16-byte aligned),
//           as rmsnorm.cu computes it, up to rounding: the sum of squares comes from
//           the same pass over x, and the row's scale multiplies the finished sum
//           (w . (x * gain)) * scale, so the step needs no normalized copy of x and no
//           launch to make it
//   cols  : a multiple of the format's block size (32 legacy, 256 K-quants) and of 8
//   grid  : (ceil(rows / SPARKD_MMV_ROWS)); block: SPARKD_MMV_WARPS * 32 = 256 threads;
//           static shared memory SPARKD_MMV_WARPS * (SPARKD_MMV_ROWS + 1) * NB * 4 bytes
//
// extern "C" __global__ void mmv_glu_<fmt>_b<NB>(const u8* w_gate, const u8* w_up,
//                                                const float* x, float* y, int rows,
//                                                int cols, int nb,
//                                                const float* norm_gain, float norm_eps)
//   The FFN's gate and up products and SwiGLU in one launch, for decode batches of up to
//   NB = 1 or 4 rows (larger ones take the tensor-core mat-mul):
//   y[b][r] = silu(w_gate[r] . x'[b]) * (w_up[r] . x'[b]); both matrices rows x cols of
//   one format; x' as above. grid: (ceil(rows / (SPARKD_MMV_ROWS / 2))), block and
//   shared as above: a block owns SPARKD_MMV_ROWS / 2 rows of each matrix, so it keeps
//   as many weight loads in flight as the plain kernel, and the step saves two launches
//   a layer (the up product's and SwiGLU's) and the round trip of both products through
//   memory.
//
// extern "C" __global__ void mmv3_<fmt>_b<NB>(const u8* w0, const u8* w1, const u8* w2,
//         float* y0, float* y1, float* y2, const float* b0, const float* b1,
//         const float* b2, int rows0, int rows1, int rows2, const float* x, int cols,
//         int nb, const float* norm_gain, float norm_eps)
//   Up to three mmv_<fmt>_b<NB> products of one x in one launch (a layer's q, k and v;
//   rows2 = 0 for two): y_i = x' w_i^T (+ b_i), no accumulate. NB = 1 or 4.
//   grid: (sum of ceil(rows_i / SPARKD_MMV_ROWS)), block and shared as mmv.
//
// Design: decode is bound by reading the weights, so each weight is read from memory
// exactly once per step whatever the batch, and the kernel's job is to keep enough
// bytes in flight to cover DRAM latency (about 3 MB across an H200). A block owns
// SPARKD_MMV_ROWS rows and its warps split K: warp w takes groups of eight weights
// (quant.cuh dq8) 32w + lane, 32w + lane + 256, ... of every one of its rows, so the
// block streams its rows front to back and a warp has only cols / 2048 steps to take,
// each with SPARKD_MMV_ROWS independent weight loads (two steps unrolled). Each group
// is dequantized once into registers and multiplied into all NB activation rows; the
// activations come straight from global memory (L1/L2: every block reads the same
// few KiB), each load serving all of the block's rows, so the cache traffic per weight
// is 4 / SPARKD_MMV_ROWS bytes per activation row. Partial sums are reduced across the
// warp with shuffles (warp_sum_split: about one per sum), then across the warps through
// shared memory in a fixed order.
#include "quant.cuh"

// GLU: `w` is the gate matrix, `w_up` the up matrix; the block's weight rows are
// OUT_ROWS rows of gate, then the same rows of up.
// `block`: the block's index among those covering this matrix (blockIdx.x, or less
// where one launch covers several matrices).
template <int T, int NB, bool GLU>
static __device__ void mmv(int block, const u8* __restrict__ w, const u8* __restrict__ w_up,
                           const float* __restrict__ x, float* __restrict__ y,
                           const float* __restrict__ bias, int rows, int cols, int nb,
                           int accumulate, const float* __restrict__ norm_gain,
                           float norm_eps) {
    constexpr int WARPS = SPARKD_MMV_WARPS;
    constexpr int ROWS = SPARKD_MMV_ROWS;
    constexpr int OUT_ROWS = GLU ? ROWS / 2 : ROWS;
    __shared__ float part[WARPS][ROWS * NB];
    __shared__ float part_sq[WARPS][NB];  // sums of squares of x (fused norm)

    nb = nb < NB ? nb : NB;
    const int warp = threadIdx.x >> 5;
    const int row0 = block * OUT_ROWS;
    const u64 rb = row_bytes<T>(cols);
    const bool norm = norm_gain != nullptr;  // uniform
    // Rows past the end read the last row again; their sums are never written.
    const u8* wr[ROWS];
#pragma unroll
    for (int r = 0; r < ROWS; ++r) {
        const int row = row0 + r % OUT_ROWS;
        wr[r] = (GLU && r >= OUT_ROWS ? w_up : w) + (u64)(row < rows ? row : rows - 1) * rb;
    }

    float acc[ROWS][NB], sq[NB];
#pragma unroll
    for (int b = 0; b < NB; ++b) {
        sq[b] = 0.0f;
#pragma unroll
        for (int r = 0; r < ROWS; ++r) acc[r][b] = 0.0f;
    }

    // The block's warps cover every group of x once, so the fused norm's sums of
    // squares come out of this same pass.
    const int groups = cols / 8;
#pragma unroll 2
    for (int g = warp * 32 + (threadIdx.x & 31); g < groups; g += WARPS * 32) {
        float wv[ROWS][8];
        int e0 = 0, e1 = 0;
#pragma unroll
        for (int r = 0; r < ROWS; ++r) dq8<T>(wr[r], g, wv[r], e0, e1);
        float4 ga = make_float4(1.0f, 1.0f, 1.0f, 1.0f), gc = ga;
        if (norm) {
            ga = *(const float4*)(norm_gain + e0);
            gc = *(const float4*)(norm_gain + e1);
        }
#pragma unroll
        for (int b = 0; b < NB; ++b) {
            if (b >= nb) break;  // uniform
            float4 a = *(const float4*)(x + (u64)b * cols + e0);
            float4 c = *(const float4*)(x + (u64)b * cols + e1);
            if (norm) {
                sq[b] += a.x * a.x + a.y * a.y + a.z * a.z + a.w * a.w + c.x * c.x +
                         c.y * c.y + c.z * c.z + c.w * c.w;
                a = make_float4(a.x * ga.x, a.y * ga.y, a.z * ga.z, a.w * ga.w);
                c = make_float4(c.x * gc.x, c.y * gc.y, c.z * gc.z, c.w * gc.w);
            }
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

    float sums[ROWS * NB];
#pragma unroll
    for (int r = 0; r < ROWS; ++r)
#pragma unroll
        for (int b = 0; b < NB; ++b) sums[r * NB + b] = acc[r][b];
    warp_sums_to_shared(sums, part[warp]);
    if (norm) warp_sums_to_shared(sq, part_sq[warp]);
    __syncthreads();
    for (int i = threadIdx.x; i < OUT_ROWS * NB; i += blockDim.x) {
        const int r = i / NB, b = i % NB, row = row0 + r;
        if (row >= rows || b >= nb) continue;
        float s = 0.0f;
#pragma unroll
        for (int wp = 0; wp < WARPS; ++wp) s += part[wp][i];
        float scale = 1.0f;
        if (norm) {
            float total = 0.0f;
#pragma unroll
            for (int wp = 0; wp < WARPS; ++wp) total += part_sq[wp][b];
            scale = 1.0f / sqrtf(total / (float)cols + norm_eps);  // rmsnorm.cu's formula
        }
        if constexpr (GLU) {
            float up = 0.0f;
#pragma unroll
            for (int wp = 0; wp < WARPS; ++wp) up += part[wp][OUT_ROWS * NB + i];
            y[(u64)b * rows + row] = silu_mul(s * scale, up * scale);
        } else {
            store_output(y + (u64)b * rows + row, s * scale, bias, row, accumulate);
        }
    }
}

// Up to three matrices of one format that read the same x (a layer's q, k and v) in
// one launch: the first blocks cover matrix 0, the next matrix 1, then matrix 2
// (rows2 = 0 for a pair). The choice is uniform over a block.
template <int T, int NB>
static __device__ void mmv3(const u8* w0, const u8* w1, const u8* w2, float* y0, float* y1,
                            float* y2, const float* b0, const float* b1, const float* b2,
                            int rows0, int rows1, int rows2, const float* x, int cols,
                            int nb, const float* norm_gain, float norm_eps) {
    constexpr int ROWS = SPARKD_MMV_ROWS;
    const int blocks0 = (rows0 + ROWS - 1) / ROWS, blocks1 = (rows1 + ROWS - 1) / ROWS;
    int block = blockIdx.x;
    const u8* w = w0;
    float* y = y0;
    const float* bias = b0;
    int rows = rows0;
    if (block >= blocks0) {
        block -= blocks0;
        w = w1, y = y1, bias = b1, rows = rows1;
        if (block >= blocks1) {
            block -= blocks1;
            w = w2, y = y2, bias = b2, rows = rows2;
        }
    }
    prefetch_rows_l2<T>(w, nullptr, block * ROWS, ROWS, rows, cols);
    pdl_enter();
    if (block * ROWS < rows) {
        mmv<T, NB, false>(block, w, nullptr, x, y, bias, rows, cols, nb, 0, norm_gain,
                          norm_eps);
    }
}

#define MMV_ENTRY(name, T, NB)                                                            \
    extern "C" __global__ void __launch_bounds__(SPARKD_MMV_WARPS * 32, 1)               \
        mmv_##name##_b##NB(const u8* w, const float* x, float* y, const float* bias,     \
                           int rows, int cols, int nb, int accumulate,                   \
                           const float* norm_gain, float norm_eps) {                     \
        prefetch_rows_l2<T>(w, nullptr, blockIdx.x * SPARKD_MMV_ROWS, SPARKD_MMV_ROWS,   \
                            rows, cols);                                                  \
        pdl_enter();                                                                      \
        mmv<T, NB, false>(blockIdx.x, w, nullptr, x, y, bias, rows, cols, nb, accumulate, \
                          norm_gain, norm_eps);                                           \
    }
#define MMV_GLU_ENTRY(name, T, NB)                                                        \
    extern "C" __global__ void __launch_bounds__(SPARKD_MMV_WARPS * 32, 1)               \
        mmv_glu_##name##_b##NB(const u8* w_gate, const u8* w_up, const float* x,         \
                               float* y, int rows, int cols, int nb,                     \
                               const float* norm_gain, float norm_eps) {                 \
        prefetch_rows_l2<T>(w_gate, w_up, blockIdx.x * (SPARKD_MMV_ROWS / 2),           \
                            SPARKD_MMV_ROWS / 2, rows, cols);                             \
        pdl_enter();                                                                      \
        mmv<T, NB, true>(blockIdx.x, w_gate, w_up, x, y, nullptr, rows, cols, nb, 0,     \
                         norm_gain, norm_eps);                                            \
    }
#define MMV3_ENTRY(name, T, NB)                                                           \
    extern "C" __global__ void __launch_bounds__(SPARKD_MMV_WARPS * 32, 1)               \
        mmv3_##name##_b##NB(const u8* w0, const u8* w1, const u8* w2, float* y0,         \
                            float* y1, float* y2, const float* b0, const float* b1,      \
                            const float* b2, int rows0, int rows1, int rows2,            \
                            const float* x, int cols, int nb, const float* norm_gain,    \
                            float norm_eps) {                                             \
        mmv3<T, NB>(w0, w1, w2, y0, y1, y2, b0, b1, b2, rows0, rows1, rows2, x, cols, nb, \
                    norm_gain, norm_eps);                                                 \
    }
#define MMV_ALL_BATCHES(name, T) \
    MMV_ENTRY(name, T, 1)        \
    MMV_ENTRY(name, T, 4)        \
    MMV_ENTRY(name, T, 8)        \
    MMV_ENTRY(name, T, 16)       \
    MMV_GLU_ENTRY(name, T, 1)    \
    MMV_GLU_ENTRY(name, T, 4)    \
    MMV3_ENTRY(name, T, 1)       \
    MMV3_ENTRY(name, T, 4)
SPARKD_FOR_EACH_WTYPE(MMV_ALL_BATCHES)
