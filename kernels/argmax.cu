// argmax.cu - greedy sampling on the device: the index of each row's largest logit.
//
// extern "C" __global__ void argmax_f32(const float* logits, int n, u32* out)
//   out[r] = the lowest index i with logits[r][i] == max over the row, NaNs ignored;
//   0 when the row is all NaN. This is exactly the CPU sampler's greedy pick
//   (daemon/src/text/sampler.rs argmax), so greedy outputs agree token for token.
//   grid: (rows); block: a multiple of 32 threads, at most 1024 (1024 recommended)
//
// extern "C" __global__ void logit_bias_f32(float* logits, int n, const int* bias_rows,
//                                           const int* tokens, const float* values)
//   logits[r][tokens[e]] += values[e] for e in bias_rows[r] .. bias_rows[r + 1], in that
//   order, ids outside 0..n skipped: a greedy request's logit_bias, added before
//   argmax_f32 exactly as the CPU sampler adds it (one thread a row, so that an id
//   listed twice gets both values in the same order).
//   grid: (rows); block: 32
#include "common.cuh"

// (value, index) pairs: the larger value wins, the lower index on ties. NaN never wins
// because every comparison with it is false.
static __device__ __forceinline__ void better(float& v, int& i, float ov, int oi) {
    if (ov > v || (ov == v && oi < i)) {
        v = ov;
        i = oi;
    }
}

extern "C" __global__ void argmax_f32(const float* logits, int n, u32* out) {
    pdl_enter();
    __shared__ float sv[32];
    __shared__ int si[32];
    const float* x = logits + (u64)blockIdx.x * n;
    // `n` is the "nothing found" index; it loses every tie with a real index.
    float v = -__int_as_float(0x7f800000);  // -inf
    int idx = n;
    for (int i = threadIdx.x; i < n; i += blockDim.x) better(v, idx, x[i], i);
#pragma unroll
    for (int o = 16; o > 0; o >>= 1)
        better(v, idx, __shfl_xor_sync(SPARKD_FULL_MASK, v, o),
               __shfl_xor_sync(SPARKD_FULL_MASK, idx, o));
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    if (lane == 0) {
        sv[warp] = v;
        si[warp] = idx;
    }
    __syncthreads();
    if (warp == 0) {
        const int n_warps = blockDim.x >> 5;
        v = lane < n_warps ? sv[lane] : -__int_as_float(0x7f800000);
        idx = lane < n_warps ? si[lane] : n;
#pragma unroll
        for (int o = 16; o > 0; o >>= 1)
            better(v, idx, __shfl_xor_sync(SPARKD_FULL_MASK, v, o),
                   __shfl_xor_sync(SPARKD_FULL_MASK, idx, o));
        if (lane == 0) out[blockIdx.x] = idx < n ? (u32)idx : 0u;
    }
}

extern "C" __global__ void logit_bias_f32(float* logits, int n, const int* bias_rows,
                                          const int* tokens, const float* values) {
    pdl_enter();
    if (threadIdx.x != 0) return;
    float* x = logits + (u64)blockIdx.x * n;
    for (int e = bias_rows[blockIdx.x]; e < bias_rows[blockIdx.x + 1]; ++e) {
        const int t = tokens[e];
        if (t >= 0 && t < n) x[t] += values[e];
    }
}
