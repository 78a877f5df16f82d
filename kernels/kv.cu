// kv.cu - writes the new tokens' keys and values into the paged KV cache.
//
// extern "C" __global__ void kv_write_f32(const float* k, const float* v, float* k_cache,
//                                         float* v_cache, const i32* slots, int n_tokens,
//                                         int kv_dim)
// extern "C" __global__ void kv_write_f16(const float* k, const float* v, u16* k_cache,
//                                         u16* v_cache, const i32* slots, int n_tokens,
//                                         int kv_dim)
//   k, v     : n_tokens x kv_dim f32 (after bias, q/k norm and RoPE)
//   k_cache, v_cache : this layer's cache, [n_blocks][SPARKD_KV_BLOCK_TOKENS][kv_dim]
//              (the layout of daemon/src/model/kv.rs, in f32 or f16)
//   slots    : per token, block * SPARKD_KV_BLOCK_TOKENS + slot, from the sequence's
//              block table; a negative slot skips the token (padding)
//   grid: any (ceil(n_tokens * kv_dim / 256) recommended, grid-stride), block 256
#include "common.cuh"

template <typename KV>
static __device__ void kv_write(const float* __restrict__ k, const float* __restrict__ v,
                                KV* __restrict__ k_cache, KV* __restrict__ v_cache,
                                const i32* __restrict__ slots, int n_tokens, int kv_dim) {
    const i64 total = (i64)n_tokens * kv_dim;
    for (i64 i = (i64)blockIdx.x * blockDim.x + threadIdx.x; i < total;
         i += (i64)gridDim.x * blockDim.x) {
        const i64 t = i / kv_dim;
        const int d = (int)(i % kv_dim);
        const i32 slot = slots[t];
        if (slot < 0) continue;
        const u64 dst = (u64)slot * kv_dim + d;
        kv_store(k_cache + dst, k[i]);
        kv_store(v_cache + dst, v[i]);
    }
}

extern "C" __global__ void kv_write_f32(const float* k, const float* v, float* k_cache,
                                        float* v_cache, const i32* slots, int n_tokens,
                                        int kv_dim) {
    kv_write<float>(k, v, k_cache, v_cache, slots, n_tokens, kv_dim);
}

extern "C" __global__ void kv_write_f16(const float* k, const float* v, u16* k_cache,
                                        u16* v_cache, const i32* slots, int n_tokens,
                                        int kv_dim) {
    kv_write<u16>(k, v, k_cache, v_cache, slots, n_tokens, kv_dim);
}
