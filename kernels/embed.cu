// embed.cu - token embedding lookup: one weight row per token, dequantized to f32.
//
// extern "C" __global__ void embed_<fmt>(const u8* table, const u32* tokens, float* out,
//                                        int n_tokens, int cols, int vocab)
//   <fmt>  : f32 f16 bf16 q4_0 q4_1 q5_0 q5_1 q8_0 q2_k q3_k q4_k q5_k q6_k iq4_nl
//            iq4_xs (the table's GGUF type)
//   table  : vocab rows of `cols` elements in the GGUF block layout, row-major
//   tokens : n_tokens token ids
//   out    : n_tokens x cols f32, row t = table row tokens[t]
//   cols   : a multiple of the format's block size (32 legacy, 256 K-quants) and of 8
//   grid   : (n_tokens); block: any multiple of 32 threads (256 recommended)
// A token id >= vocab is a host bug; its row is written as NaN rather than read out of
// bounds.
#include "quant.cuh"

template <int T>
static __device__ void embed(const u8* __restrict__ table, const u32* __restrict__ tokens,
                             float* __restrict__ out, int n_tokens, int cols, int vocab) {
    const int t = blockIdx.x;
    if (t >= n_tokens) return;
    const u32 tok = tokens[t];
    float* o = out + (u64)t * cols;
    if (tok >= (u32)vocab) {
        for (int i = threadIdx.x; i < cols; i += blockDim.x) o[i] = quiet_nan();
        return;
    }
    const u8* row = table + (u64)tok * row_bytes<T>(cols);
    for (int g = threadIdx.x; g < cols / 8; g += blockDim.x) {
        float w[8];
        int e0, e1;
        dq8<T>(row, g, w, e0, e1);
        *(float4*)(o + e0) = make_float4(w[0], w[1], w[2], w[3]);
        *(float4*)(o + e1) = make_float4(w[4], w[5], w[6], w[7]);
    }
}

#define EMBED_ENTRY(name, T)                                                             \
    extern "C" __global__ void embed_##name(const u8* table, const u32* tokens,          \
                                            float* out, int n_tokens, int cols, int vocab) { \
        pdl_enter();                                                                     \
        embed<T>(table, tokens, out, n_tokens, cols, vocab);                             \
    }
SPARKD_FOR_EACH_WTYPE(EMBED_ENTRY)
