// dequant.cu - weight rows dequantized to f16 or bf16, the operand of the prefill GEMM.
//
// extern "C" __global__ void dequant_<fmt>_<out>(const u8* w, u16* out, int rows, int cols)
//   <fmt> : f32 f16 bf16 q4_0 q4_1 q5_0 q5_1 q8_0 q2_k q3_k q4_k q5_k q6_k iq4_nl
//           iq4_xs (the weight's GGUF type)
//   <out> : f16 or bf16 (out holds the raw 16-bit values)
//   w     : rows x cols weights in the GGUF block layout; to convert a panel of rows
//           r0..r0+rows of a larger matrix, pass w + r0 * row_bytes
//   out   : rows x cols row-major (leading dimension cols), 8-byte aligned
//   cols  : a multiple of the format's block size and of 8
//   grid  : any (ceil(rows * cols / 8 / 256) recommended, grid-stride), block 256
//
// Prefill multiplies hundreds of tokens by each weight matrix, which is compute-bound:
// the host dequantizes a panel of rows into a scratch buffer with this kernel and runs
// gemm.cu's tensor-core GEMM on it, panel by panel, so the scratch stays small. Values
// are the CPU reference's f32 dequantization rounded to nearest even.
#include "quant.cuh"

template <int T, bool BF16>
static __device__ void dequant(const u8* __restrict__ w, u16* __restrict__ out, int rows,
                               int cols) {
    const int gpr = cols / 8;
    const i64 total = (i64)rows * gpr;
    const u64 rb = row_bytes<T>(cols);
    for (i64 i = (i64)blockIdx.x * blockDim.x + threadIdx.x; i < total;
         i += (i64)gridDim.x * blockDim.x) {
        const i64 r = i / gpr;
        const int g = (int)(i % gpr);
        float v[8];
        int e0, e1;
        dq8<T>(w + r * rb, g, v, e0, e1);
        u16 h[8];
#pragma unroll
        for (int j = 0; j < 8; ++j) h[j] = BF16 ? f32_to_bf16(v[j]) : f32_to_f16(v[j]);
        u16* o = out + r * cols;
        *(uint2*)(o + e0) = make_uint2((u32)h[0] | ((u32)h[1] << 16), (u32)h[2] | ((u32)h[3] << 16));
        *(uint2*)(o + e1) = make_uint2((u32)h[4] | ((u32)h[5] << 16), (u32)h[6] | ((u32)h[7] << 16));
    }
}

#define DEQUANT_ENTRIES(name, T)                                                            \
    extern "C" __global__ void dequant_##name##_f16(const u8* w, u16* out, int rows, int cols) { \
        pdl_enter();                                                                         \
        dequant<T, false>(w, out, rows, cols);                                               \
    }                                                                                        \
    extern "C" __global__ void dequant_##name##_bf16(const u8* w, u16* out, int rows, int cols) { \
        pdl_enter();                                                                         \
        dequant<T, true>(w, out, rows, cols);                                                \
    }
SPARKD_FOR_EACH_WTYPE(DEQUANT_ENTRIES)
