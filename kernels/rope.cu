// rope.cu - rotary position embeddings on q and k, in place, per-token positions.
//
// extern "C" __global__ void rope_f32(float* q, float* k, const i32* pos,
//                                     const float* inv_freq, int n_tokens, int n_q_heads,
//                                     int n_kv_heads, int head_dim, int n_pairs,
//                                     float linear_scale, int neox)
//   q        : n_tokens x n_q_heads x head_dim f32 (rotated in place)
//   k        : n_tokens x n_kv_heads x head_dim f32 (rotated in place)
//   pos      : n_tokens absolute positions
//   inv_freq : n_pairs inverse frequencies (rope_dim / 2; Llama 3 frequency factors
//              already applied, as daemon/src/model/weights.rs builds them)
//   linear_scale : positions are divided by it (linear RoPE scaling; 1 when unused)
//   neox     : 0 rotates pairs (2i, 2i+1) (llama); 1 rotates (i, i + n_pairs) (qwen)
//   Dimensions past 2 * n_pairs pass through unchanged.
//   grid: any (ceil(total / 256) recommended), block: 256, where
//   total = n_tokens * (n_q_heads + n_kv_heads) * n_pairs; one thread per rotated pair.
//
// Matches daemon/src/model/ops.rs rope: angle = (pos / linear_scale) * inv_freq[i] in f32,
// accurate sincosf (no fast math).
#include "common.cuh"

extern "C" __global__ void rope_f32(float* q, float* k, const i32* pos, const float* inv_freq,
                                    int n_tokens, int n_q_heads, int n_kv_heads, int head_dim,
                                    int n_pairs, float linear_scale, int neox) {
    const int heads = n_q_heads + n_kv_heads;
    const i64 total = (i64)n_tokens * heads * n_pairs;
    for (i64 idx = (i64)blockIdx.x * blockDim.x + threadIdx.x; idx < total;
         idx += (i64)gridDim.x * blockDim.x) {
        const int pair = (int)(idx % n_pairs);
        const i64 rest = idx / n_pairs;
        const int head = (int)(rest % heads);
        const i64 t = rest / heads;
        float* h = head < n_q_heads ? q + ((u64)t * n_q_heads + head) * head_dim
                                    : k + ((u64)t * n_kv_heads + (head - n_q_heads)) * head_dim;
        const float p = (float)pos[t] / linear_scale;
        float s, c;
        sincosf(p * inv_freq[pair], &s, &c);
        const int a = neox ? pair : 2 * pair;
        const int b = neox ? pair + n_pairs : 2 * pair + 1;
        const float x0 = h[a], x1 = h[b];
        h[a] = x0 * c - x1 * s;
        h[b] = x0 * s + x1 * c;
    }
}
