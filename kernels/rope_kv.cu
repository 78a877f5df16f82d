// rope_kv.cu - rotary position embeddings on the new tokens' q and k, and their keys
// and values written into the paged KV cache: one launch per layer.
//
// extern "C" __global__ void rope_kv_write_f32(float* q, const float* k, const float* v,
//         float* k_cache, float* v_cache, const i32* pos, const i32* slots,
//         const float* inv_freq, int n_tokens, int n_q_heads, int n_kv_heads,
//         int head_dim, int n_pairs, float linear_scale, int neox, float magnitude,
//         float q_temp_scale, int q_temp_floor)
// extern "C" __global__ void rope_kv_write_f16(... u16* k_cache, u16* v_cache ...)
//   q        : n_tokens x n_q_heads x head_dim f32, rotated in place (unused, and may be
//              null, when n_q_heads is 0)
//   k, v     : n_tokens x n_kv_heads x head_dim f32 (after bias and q/k norm); k is
//              read, rotated and stored to the cache, left as it was in memory
//   k_cache, v_cache : this layer's cache, [n_blocks][SPARKD_KV_BLOCK_TOKENS][kv_dim]
//              (the layout of daemon/src/model/kv.rs, in f32 or f16)
//   pos      : n_tokens absolute positions
//   slots    : per token, block * SPARKD_KV_BLOCK_TOKENS + slot, from the sequence's
//              block table; a negative slot skips the token's keys and values (padding)
//   inv_freq : n_pairs inverse frequencies (rope_dim / 2; Llama 3 frequency factors
//              already applied, as daemon/src/model/weights.rs builds them)
//   linear_scale : positions are divided by it (linear RoPE scaling; 1 when unused)
//   neox     : 0 rotates pairs (2i, 2i+1) (llama); 1 rotates (i, i + n_pairs) (qwen)
//   magnitude : the rotated pairs of q and k are scaled by it (YaRN's attention factor;
//              1 when unused)
//   q_temp_scale, q_temp_floor : Llama 4 style attention temperature (Ministral 3):
//              every dimension of q grows by 1 + q_temp_scale * ln(floor(pos /
//              q_temp_floor) + 1); q_temp_scale 0 leaves q as rotated (and q_temp_floor
//              unread)
//   Dimensions past 2 * n_pairs pass through unchanged; n_pairs 0 stores k unrotated.
//   grid: any (ceil(total / 256) recommended), block: 256, where
//   total = n_tokens * (n_q_heads + n_kv_heads) * head_dim / 2: one thread per pair of
//   dimensions of a head (a q head, or a kv head's key and value).
//
// Matches daemon/src/model/ops.rs rope: angle = (pos / linear_scale) * inv_freq[i] in f32,
// accurate sincosf (no fast math), sine and cosine times magnitude; and
// daemon/src/model/rope.rs AttnTemperature::factor (to an ulp: in float here).
#include "common.cuh"

// Pair `pair` of a head (pair < n_pairs): the dimensions it rotates, and x rotated.
static __device__ __forceinline__ void rope_pair(const float* h, int pair, int n_pairs,
                                                 int neox, float angle, float magnitude,
                                                 int& a, int& b, float& y0, float& y1) {
    a = neox ? pair : 2 * pair;
    b = neox ? pair + n_pairs : 2 * pair + 1;
    float s, c;
    sincosf(angle, &s, &c);
    s *= magnitude;
    c *= magnitude;
    const float x0 = h[a], x1 = h[b];
    y0 = x0 * c - x1 * s;
    y1 = x0 * s + x1 * c;
}

template <typename KV>
static __device__ void rope_kv_write(float* __restrict__ q, const float* __restrict__ k,
                                     const float* __restrict__ v, KV* __restrict__ k_cache,
                                     KV* __restrict__ v_cache, const i32* __restrict__ pos,
                                     const i32* __restrict__ slots,
                                     const float* __restrict__ inv_freq, int n_tokens,
                                     int n_q_heads, int n_kv_heads, int head_dim,
                                     int n_pairs, float linear_scale, int neox,
                                     float magnitude, float q_temp_scale, int q_temp_floor) {
    const int heads = n_q_heads + n_kv_heads, half = head_dim / 2;
    const int kv_dim = n_kv_heads * head_dim;
    const i64 total = (i64)n_tokens * heads * half;
    for (i64 idx = (i64)blockIdx.x * blockDim.x + threadIdx.x; idx < total;
         idx += (i64)gridDim.x * blockDim.x) {
        const int j = (int)(idx % half);
        const i64 rest = idx / half;
        const int head = (int)(rest % heads);
        const i64 t = rest / heads;
        const float angle = j < n_pairs ? (float)pos[t] / linear_scale * inv_freq[j] : 0.0f;
        if (head < n_q_heads) {
            float* h = q + ((u64)t * n_q_heads + head) * head_dim;
            // Integer steps, as the CPU takes them; logf, not log: FP64 is slow on GB10
            // and a prefill makes this once per q element.
            const float temp =
                q_temp_scale != 0.0f
                    ? 1.0f + q_temp_scale * logf((float)(pos[t] / q_temp_floor) + 1.0f)
                    : 1.0f;
            if (j >= n_pairs) {  // a pass-through pair: dimensions 2j, 2j + 1
                if (temp != 1.0f) {
                    h[2 * j] *= temp;
                    h[2 * j + 1] *= temp;
                }
                continue;
            }
            int a, b;
            float y0, y1;
            rope_pair(h, j, n_pairs, neox, angle, magnitude, a, b, y0, y1);
            h[a] = y0 * temp;
            h[b] = y1 * temp;
            continue;
        }
        const i32 slot = slots[t];
        if (slot < 0) continue;
        const int kh = head - n_q_heads;
        const u64 src = (u64)t * kv_dim + (u64)kh * head_dim;
        const u64 dst = (u64)slot * kv_dim + (u64)kh * head_dim;
        // The key: a rotated pair, or dimensions 2j, 2j + 1 past the rotated ones
        // (every dimension once either way); the value: dimensions 2j, 2j + 1.
        int a = 2 * j, b = 2 * j + 1;
        float y0 = k[src + a], y1 = k[src + b];
        if (j < n_pairs) rope_pair(k + src, j, n_pairs, neox, angle, magnitude, a, b, y0, y1);
        store_as(k_cache + dst + a, y0);
        store_as(k_cache + dst + b, y1);
        store_as(v_cache + dst + 2 * j, v[src + 2 * j]);
        store_as(v_cache + dst + 2 * j + 1, v[src + 2 * j + 1]);
    }
}

extern "C" __global__ void rope_kv_write_f32(float* q, const float* k, const float* v,
                                             float* k_cache, float* v_cache, const i32* pos,
                                             const i32* slots, const float* inv_freq,
                                             int n_tokens, int n_q_heads, int n_kv_heads,
                                             int head_dim, int n_pairs, float linear_scale,
                                             int neox, float magnitude, float q_temp_scale,
                                             int q_temp_floor) {
    pdl_enter();
    rope_kv_write<float>(q, k, v, k_cache, v_cache, pos, slots, inv_freq, n_tokens,
                         n_q_heads, n_kv_heads, head_dim, n_pairs, linear_scale, neox,
                         magnitude, q_temp_scale, q_temp_floor);
}

extern "C" __global__ void rope_kv_write_f16(float* q, const float* k, const float* v,
                                             u16* k_cache, u16* v_cache, const i32* pos,
                                             const i32* slots, const float* inv_freq,
                                             int n_tokens, int n_q_heads, int n_kv_heads,
                                             int head_dim, int n_pairs, float linear_scale,
                                             int neox, float magnitude, float q_temp_scale,
                                             int q_temp_floor) {
    pdl_enter();
    rope_kv_write<u16>(q, k, v, k_cache, v_cache, pos, slots, inv_freq, n_tokens,
                       n_q_heads, n_kv_heads, head_dim, n_pairs, linear_scale, neox,
                         magnitude, q_temp_scale, q_temp_floor);
}
