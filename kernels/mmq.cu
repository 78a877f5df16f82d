// mmq.cu - quantized weights x a batch of f16 activation rows on the tensor cores, for
// decode steps with more sequences than the mat-vec serves well.
//
// extern "C" __global__ void mmq_<fmt>_n<NT>(const u8* w, const u16* x, float* y,
//                                            const float* bias, int rows, int cols,
//                                            int n, int accumulate)
//   <fmt> : f32 f16 bf16 q4_0 q4_1 q5_0 q5_1 q8_0 q2_k q3_k q4_k q5_k q6_k iq4_nl
//           iq4_xs (the weight's GGUF type)
//   <NT>  : 8, 16, 32 or 64: the most activation rows the kernel handles; launch the
//           smallest variant with NT >= n (n is clamped to NT)
//   w     : rows x cols weights in the GGUF block layout, row-major (as matvec.cu)
//   x     : n x cols f16 activations (convert_f32_f16's output), row-major, 8-byte aligned
//   y     : n x rows f32 outputs: y[b][r] = sum_k w[r][k] * x[b][k]
//           (+ bias[r] when bias is not null) (+ the old y[b][r] when accumulate != 0)
//   cols  : a multiple of the format's block size (32 legacy, 256 K-quants) and of 8
//   grid  : (ceil(rows / SPARKD_MMQ_ROWS)); block: SPARKD_MMQ_WARPS * 32 = 256 threads;
//           static shared memory SPARKD_MMQ_WARPS * SPARKD_MMQ_ROWS * NT * 4 bytes
//
// extern "C" __global__ void mmq_glu_<fmt>_n<NT>(const u8* w_gate, const u8* w_up,
//                                                const u16* x, u16* out, int rows,
//                                                int cols, int n)
//   The FFN's gate and up products and SwiGLU in one launch, straight to the down
//   projection's f16 operand: out[b][r] = f16(silu(w_gate[r] . x[b]) * (w_up[r] . x[b])),
//   both matrices rows x cols of one format; out must not alias x. grid:
//   (ceil(rows / (SPARKD_MMQ_ROWS / 2))): a block's m16 tile is 8 rows of each matrix,
//   so a lane's accumulators hold a gate and its up side by side.
//
// Why: the mat-vec multiplies on the CUDA cores, one FMA per weight per sequence, with
// the activations read from shared memory for each; past a few sequences that, not
// DRAM, bounds a decode step. Here each weight is still read from DRAM once per step
// and dequantized once, but the multiply runs on the tensor cores (mma.sync m16n8k16,
// f16 inputs, f32 accumulators), so 8 to 64 sequences cost about what one does.
//
// Design: a block owns SPARKD_MMQ_ROWS (16) weight rows: the M side of the mma tiles, so
// weight rows are the A operand and sequences the B operand. The warps split K: warp w
// takes 32-column "quads" w, w + WARPS, ... so the block streams each row front to back.
// Within a quad, lane (g, c) (g = lane / 4, c = lane % 4) dequantizes group 4 * quad + c
// (quant.cuh dq8: eight weights as two runs of four) of rows g and g + 8, straight into
// the A fragment registers, no shared memory. The mma sums over its 16 k slots in any
// order, so the k slots lane c holds ({2c, 2c+1, 2c+8, 2c+9} in A and in B alike) are
// mapped to the four elements of one run; its B fragment is the same four activations
// of sequence g, two 32-bit loads. Each quad is two mma per 8 sequences (one per run).
// The warps' partial tiles are summed through shared memory in a fixed order.
//
// Precision: weights and activations are rounded to f16 (as the prefill GEMM does), so
// results agree with the f32 mat-vec to about 2^-11 relative per term.
#include "quant.cuh"

// GLU: the tile's rows 0-7 are rows of `w` (the gate), rows 8-15 the same rows of
// `w_up`, and the output is silu(gate) * up in f16 at `out16`, 8 rows a block.
template <int T, int NT, bool GLU>
static __device__ void mmq(const u8* __restrict__ w, const u8* __restrict__ w_up,
                           const u16* __restrict__ x, float* __restrict__ y,
                           u16* __restrict__ out16, const float* __restrict__ bias, int rows,
                           int cols, int n, int accumulate) {
    constexpr int WARPS = SPARKD_MMQ_WARPS;
    constexpr int ROWS = SPARKD_MMQ_ROWS;
    constexpr int OUT_ROWS = GLU ? ROWS / 2 : ROWS;
    constexpr int TILES = NT / 8;
    static_assert(ROWS == 16, "one m16 tile of rows per block");
    static_assert(NT % 8 == 0, "whole n8 tiles");
    __shared__ float4 part[WARPS][TILES][32];  // each warp's accumulators, by lane

    n = n < NT ? n : NT;
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    const int g = lane >> 2, c = lane & 3;
    const int row0 = blockIdx.x * OUT_ROWS;
    // Each output row depends on its own A row alone, so rows past the end are read
    // from the last row (dq8 also yields the run positions, which every lane of a
    // column c must agree on) and their sums are never written.
    const int ra = row0 + g, rb = GLU ? row0 + g : row0 + g + 8;
    const u64 rbytes = row_bytes<T>(cols);
    const u8* wa = w + (u64)(ra < rows ? ra : rows - 1) * rbytes;
    const u8* wb = (GLU ? w_up : w) + (u64)(rb < rows ? rb : rows - 1) * rbytes;
    const int groups = cols / 8;
    prefetch_rows_l2<T>(w, GLU ? w_up : nullptr, row0, OUT_ROWS, rows, cols);
    pdl_enter();

    float acc[TILES][4];
#pragma unroll
    for (int t = 0; t < TILES; ++t)
#pragma unroll
        for (int e = 0; e < 4; ++e) acc[t][e] = 0.0f;

#pragma unroll 2
    for (int quad = warp; 4 * quad < groups; quad += WARPS) {
        const int grp = 4 * quad + c;
        // Past the row's last group (a quad can be partial when cols % 32 != 0) the
        // column's lanes hold zeros in A and B alike.
        const bool ok_g = grp < groups;  // the same for every lane of column c
        float va[8] = {}, vb[8] = {};
        int e0 = 0, e1 = 0;
        if (ok_g) {
            dq8<T>(wa, grp, va, e0, e1);
            dq8<T>(wb, grp, vb, e0, e1);
        }
        // A fragment of m16n8k16: {row g, k 2c..2c+1}, {row g+8, same}, {row g, k
        // 2c+8..2c+9}, {row g+8, same}; here k slots 2c, 2c+1, 2c+8, 2c+9 = one run.
        const u32 a_lo[4] = {pack_f16x2(va[0], va[1]), pack_f16x2(vb[0], vb[1]),
                             pack_f16x2(va[2], va[3]), pack_f16x2(vb[2], vb[3])};
        const u32 a_hi[4] = {pack_f16x2(va[4], va[5]), pack_f16x2(vb[4], vb[5]),
                             pack_f16x2(va[6], va[7]), pack_f16x2(vb[6], vb[7])};
#pragma unroll
        for (int t = 0; t < TILES; ++t) {
            if (8 * t >= n) break;  // warp-uniform
            const int seq = 8 * t + g;
            // B fragment: {k 2c..2c+1, n g}, {k 2c+8..2c+9, n g}: the run's four values.
            // Columns past n, like rows past the end, are computed and not written.
            uint2 lo = make_uint2(0u, 0u), hi = make_uint2(0u, 0u);
            if (ok_g && seq < n) {
                const u16* xr = x + (u64)seq * cols;
                lo = *(const uint2*)(xr + e0);
                hi = *(const uint2*)(xr + e1);
            }
            mma_16816<false>(acc[t], a_lo, lo.x, lo.y);
            mma_16816<false>(acc[t], a_hi, hi.x, hi.y);
        }
    }

#pragma unroll
    for (int t = 0; t < TILES; ++t)
        part[warp][t][lane] = make_float4(acc[t][0], acc[t][1], acc[t][2], acc[t][3]);
    __syncthreads();
    if constexpr (GLU) {
        // Elements 0, 1 of lane l hold the gate of row l / 4, elements 2, 3 its up,
        // for sequences 8 t + 2 (l % 4) + 0, 1.
        for (int i = threadIdx.x; i < OUT_ROWS * NT; i += blockDim.x) {
            const int t = i / 64, l = (i / 2) % 32, e = i % 2;
            const int row = row0 + (l >> 2), seq = 8 * t + 2 * (l & 3) + e;
            if (row >= rows || seq >= n) continue;
            float gate = 0.0f, up = 0.0f;
#pragma unroll
            for (int wp = 0; wp < WARPS; ++wp) {
                const float4 p = part[wp][t][l];
                gate += e == 0 ? p.x : p.y;
                up += e == 0 ? p.z : p.w;
            }
            out16[(u64)seq * rows + row] = f32_to_f16_sat(silu_mul(gate, up));
        }
    } else {
        // Accumulator element e of lane l in tile t: row (l / 4) + 8 (e / 2), sequence
        // 8 t + 2 (l % 4) + e % 2.
        for (int i = threadIdx.x; i < ROWS * NT; i += blockDim.x) {
            const int t = i / 128, l = (i / 4) % 32, e = i % 4;
            const int row = row0 + (l >> 2) + 8 * (e >> 1);
            const int seq = 8 * t + 2 * (l & 3) + (e & 1);
            if (row >= rows || seq >= n) continue;
            float s = 0.0f;
#pragma unroll
            for (int wp = 0; wp < WARPS; ++wp) {
                const float4 p = part[wp][t][l];
                s += e == 0 ? p.x : e == 1 ? p.y : e == 2 ? p.z : p.w;
            }
            store_output(y + (u64)seq * rows + row, s, bias, row, accumulate);
        }
    }
}

#define MMQ_ENTRY(name, T, NT)                                                            \
    extern "C" __global__ void __launch_bounds__(SPARKD_MMQ_WARPS * 32, 1)                \
        mmq_##name##_n##NT(const u8* w, const u16* x, float* y, const float* bias,       \
                           int rows, int cols, int n, int accumulate) {                  \
        mmq<T, NT, false>(w, nullptr, x, y, nullptr, bias, rows, cols, n, accumulate);   \
    }
#define MMQ_GLU_ENTRY(name, T, NT)                                                        \
    extern "C" __global__ void __launch_bounds__(SPARKD_MMQ_WARPS * 32, 1)                \
        mmq_glu_##name##_n##NT(const u8* w_gate, const u8* w_up, const u16* x, u16* out, \
                               int rows, int cols, int n) {                              \
        mmq<T, NT, true>(w_gate, w_up, x, nullptr, out, nullptr, rows, cols, n, 0);      \
    }
#define MMQ_ALL_WIDTHS(name, T) \
    MMQ_ENTRY(name, T, 8)       \
    MMQ_ENTRY(name, T, 16)      \
    MMQ_ENTRY(name, T, 32)      \
    MMQ_ENTRY(name, T, 64)      \
    MMQ_GLU_ENTRY(name, T, 8)   \
    MMQ_GLU_ENTRY(name, T, 16)  \
    MMQ_GLU_ENTRY(name, T, 32)  \
    MMQ_GLU_ENTRY(name, T, 64)
SPARKD_FOR_EACH_WTYPE(MMQ_ALL_WIDTHS)
