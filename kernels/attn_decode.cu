// attn_decode.cu - paged attention for decode (one query token per sequence), GQA,
// split-K over long contexts with a reduction kernel.
//
// extern "C" __global__ void attn_decode_f32(const float* q, const float* k_cache,
//         const float* v_cache, const i32* block_tables, int max_blocks,
//         const i32* seq_lens, const i32* q_rows, float* out, float* part_o,
//         float* part_ml, int n_heads, int n_kv_heads, int head_dim, float scale)
// extern "C" __global__ void attn_decode_f16(... u16* caches, otherwise the same ...)
//   q            : rows x n_heads x head_dim f32 queries (after RoPE)
//   k_cache, v_cache : this layer's paged cache [n_blocks][SPARKD_KV_BLOCK_TOKENS][kv_dim],
//                  kv_dim = n_kv_heads * head_dim, f32 or f16 (rope_kv.cu writes it)
//   block_tables : n_seqs x max_blocks block ids, position p of sequence s lives in block
//                  block_tables[s * max_blocks + p / 16] at slot p % 16
//   seq_lens     : positions each sequence attends to (0..len-1, the new token included:
//                  its K/V must already be written); at least 1
//   q_rows       : row of q / out holding sequence s's query, or null for row s
//   out          : rows x n_heads x head_dim f32 (written when gridDim.z == 1)
//   part_o, part_ml : split-K scratch, n_seqs x n_heads x n_splits x head_dim and
//                  n_seqs x n_heads x n_splits x 2 f32 (unused when gridDim.z == 1)
//   scale        : 1 / sqrt(head_dim)
//   head_dim <= SPARKD_MAX_HEAD_DIM (256), n_heads / n_kv_heads <= SPARKD_MAX_GQA_GROUP
//   grid  : (n_kv_heads, n_seqs, n_splits), n_splits = ceil(max len / SPARKD_ATTN_PARTITION)
//   block : 128 threads; static shared memory 32 KiB
//
// extern "C" __global__ void attn_decode_reduce(const float* part_o, const float* part_ml,
//         const i32* seq_lens, const i32* q_rows, float* out, int n_heads, int head_dim,
//         int n_splits)
//   Merges the splits of attn_decode_* into out. Needed only when n_splits > 1.
//   grid: (n_heads, n_seqs); block: 128 threads
//
// Design: a block owns one (sequence, kv head, split of SPARKD_ATTN_PARTITION positions)
// and all the query heads of that kv head's group, so each cached key and value is read
// once per group (GQA). Scores: a warp per position, lanes across head_dim, one shuffle
// reduction per query head. Softmax: exact within the split (scores kept in shared
// memory), then the splits are merged with their max and sum (flash-decoding). Values:
// threads across head_dim (coalesced), all group heads accumulated per value read.
// Arithmetic matches daemon/src/model/forward.rs attention up to summation order.
#include "common.cuh"

#define DEC_THREADS 128
#define DEC_WARPS (DEC_THREADS / 32)

template <typename KV>
static __device__ void attn_decode(const float* __restrict__ q, const KV* __restrict__ k_cache,
                                   const KV* __restrict__ v_cache,
                                   const i32* __restrict__ block_tables, int max_blocks,
                                   const i32* __restrict__ seq_lens, const i32* __restrict__ q_rows,
                                   float* __restrict__ out, float* __restrict__ part_o,
                                   float* __restrict__ part_ml, int n_heads, int n_kv_heads,
                                   int head_dim, float scale) {
    constexpr int P = SPARKD_ATTN_PARTITION;
    constexpr int BT = SPARKD_KV_BLOCK_TOKENS;
    __shared__ float sq[SPARKD_MAX_GQA_GROUP * SPARKD_MAX_HEAD_DIM];
    __shared__ float sp[SPARKD_MAX_GQA_GROUP * P];
    __shared__ float sm[SPARKD_MAX_GQA_GROUP], sl[SPARKD_MAX_GQA_GROUP];

    const int g = blockIdx.x, s = blockIdx.y, split = blockIdx.z, n_splits = gridDim.z;
    const int hd = head_dim, group = n_heads / n_kv_heads;
    // Unsupported shapes are rejected by the host; never index shared memory past them.
    if (hd > SPARKD_MAX_HEAD_DIM || group > SPARKD_MAX_GQA_GROUP) return;
    const int len = seq_lens[s];
    const int start = split * P;
    if (start >= len) return;  // this sequence is shorter than the split: nothing to do
    const int n = len - start < P ? len - start : P;
    const int kv_dim = n_kv_heads * hd;
    const int row = q_rows ? q_rows[s] : s;
    const i32* table = block_tables + (u64)s * max_blocks;
    const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31;

    const float* qg = q + ((u64)row * n_heads + (u64)g * group) * hd;
    for (int i = tid; i < group * hd; i += DEC_THREADS) sq[i] = qg[i];
    __syncthreads();

    // Scores of every position of the split for every head of the group.
    for (int p = warp; p < n; p += DEC_WARPS) {
        const int pos = start + p;
        const KV* kr = k_cache + ((u64)table[pos / BT] * BT + pos % BT) * kv_dim + (u64)g * hd;
        float kreg[SPARKD_MAX_HEAD_DIM / 32];
#pragma unroll
        for (int i = 0; i < SPARKD_MAX_HEAD_DIM / 32; ++i) {
            const int d = lane + 32 * i;
            kreg[i] = d < hd ? kv_load(kr + d) : 0.0f;
        }
        for (int h = 0; h < group; ++h) {
            float dot = 0.0f;
#pragma unroll
            for (int i = 0; i < SPARKD_MAX_HEAD_DIM / 32; ++i) {
                const int d = lane + 32 * i;
                if (d < hd) dot = fmaf(sq[h * hd + d], kreg[i], dot);
            }
            dot = warp_sum(dot);
            if (lane == 0) sp[h * P + p] = dot * scale;
        }
    }
    __syncthreads();

    // Softmax within the split: a warp per head; probabilities replace the scores.
    for (int h = warp; h < group; h += DEC_WARPS) {
        float m = -__int_as_float(0x7f800000);
        for (int i = lane; i < n; i += 32) m = fmaxf(m, sp[h * P + i]);
        m = warp_max(m);
        float l = 0.0f;
        for (int i = lane; i < n; i += 32) {
            const float e = expf(sp[h * P + i] - m);
            sp[h * P + i] = e;
            l += e;
        }
        l = warp_sum(l);
        if (lane == 0) {
            sm[h] = m;
            sl[h] = l;
        }
    }
    __syncthreads();

    // Weighted values. Threads span head_dim (two dims each past 128); when head_dim is
    // at most 64, several thread sets split the positions and are summed afterwards.
    const int span = hd < DEC_THREADS ? hd : DEC_THREADS;
    const int n_par = DEC_THREADS / span;
    const int d0 = tid % span, par = tid / span;
    float acc[2][SPARKD_MAX_GQA_GROUP];
#pragma unroll
    for (int j = 0; j < 2; ++j)
#pragma unroll
        for (int h = 0; h < SPARKD_MAX_GQA_GROUP; ++h) acc[j][h] = 0.0f;
    if (par < n_par) {
        for (int p = par; p < n; p += n_par) {
            const int pos = start + p;
            const KV* vr =
                v_cache + ((u64)table[pos / BT] * BT + pos % BT) * kv_dim + (u64)g * hd;
#pragma unroll
            for (int j = 0; j < 2; ++j) {
                const int d = d0 + DEC_THREADS * j;
                if (d < hd) {
                    const float v = kv_load(vr + d);
#pragma unroll
                    for (int h = 0; h < SPARKD_MAX_GQA_GROUP; ++h)
                        if (h < group) acc[j][h] = fmaf(sp[h * P + p], v, acc[j][h]);
                }
            }
        }
    }
    if (n_par > 1) {
        // sq (the queries) is free again: fold the partial sums through it.
        if (par < n_par)
#pragma unroll
            for (int h = 0; h < SPARKD_MAX_GQA_GROUP; ++h)
                if (h < group) sq[(par * group + h) * hd + d0] = acc[0][h];
        __syncthreads();
        if (par == 0)
#pragma unroll
            for (int h = 0; h < SPARKD_MAX_GQA_GROUP; ++h)
                if (h < group) {
                    float t = 0.0f;
                    for (int r = 0; r < n_par; ++r) t += sq[(r * group + h) * hd + d0];
                    acc[0][h] = t;
                }
    }
    if (par != 0) return;

#pragma unroll
    for (int h = 0; h < SPARKD_MAX_GQA_GROUP; ++h) {
        if (h >= group) break;
        const int head = g * group + h;
#pragma unroll
        for (int j = 0; j < 2; ++j) {
            const int d = d0 + DEC_THREADS * j;
            if (d >= hd) continue;
            if (n_splits == 1) {
                out[((u64)row * n_heads + head) * hd + d] = acc[j][h] * (1.0f / sl[h]);
            } else {
                part_o[(((u64)s * n_heads + head) * n_splits + split) * hd + d] = acc[j][h];
            }
        }
        if (n_splits > 1 && tid == 0) {
            float* ml = part_ml + (((u64)s * n_heads + head) * n_splits + split) * 2;
            ml[0] = sm[h];
            ml[1] = sl[h];
        }
    }
}

extern "C" __global__ void __launch_bounds__(DEC_THREADS)
    attn_decode_f32(const float* q, const float* k_cache, const float* v_cache,
                    const i32* block_tables, int max_blocks, const i32* seq_lens,
                    const i32* q_rows, float* out, float* part_o, float* part_ml, int n_heads,
                    int n_kv_heads, int head_dim, float scale) {
    pdl_enter();
    attn_decode<float>(q, k_cache, v_cache, block_tables, max_blocks, seq_lens, q_rows, out,
                       part_o, part_ml, n_heads, n_kv_heads, head_dim, scale);
}

extern "C" __global__ void __launch_bounds__(DEC_THREADS)
    attn_decode_f16(const float* q, const u16* k_cache, const u16* v_cache,
                    const i32* block_tables, int max_blocks, const i32* seq_lens,
                    const i32* q_rows, float* out, float* part_o, float* part_ml, int n_heads,
                    int n_kv_heads, int head_dim, float scale) {
    pdl_enter();
    attn_decode<u16>(q, k_cache, v_cache, block_tables, max_blocks, seq_lens, q_rows, out,
                     part_o, part_ml, n_heads, n_kv_heads, head_dim, scale);
}

extern "C" __global__ void attn_decode_reduce(const float* part_o, const float* part_ml,
                                              const i32* seq_lens, const i32* q_rows,
                                              float* out, int n_heads, int head_dim,
                                              int n_splits) {
    pdl_enter();
    const int head = blockIdx.x, s = blockIdx.y;
    const int len = seq_lens[s];
    int valid = (len + SPARKD_ATTN_PARTITION - 1) / SPARKD_ATTN_PARTITION;
    valid = valid < n_splits ? valid : n_splits;
    const int row = q_rows ? q_rows[s] : s;
    const u64 base = ((u64)s * n_heads + head) * n_splits;
    const float* ml = part_ml + base * 2;
    float m = -__int_as_float(0x7f800000);
    for (int i = 0; i < valid; ++i) m = fmaxf(m, ml[2 * i]);
    float l = 0.0f;
    for (int i = 0; i < valid; ++i) l += ml[2 * i + 1] * expf(ml[2 * i] - m);
    float* o = out + ((u64)row * n_heads + head) * head_dim;
    for (int d = threadIdx.x; d < head_dim; d += blockDim.x) {
        float acc = 0.0f;
        for (int i = 0; i < valid; ++i)
            acc += part_o[(base + i) * head_dim + d] * expf(ml[2 * i] - m);
        o[d] = valid > 0 ? acc / l : 0.0f;
    }
}
