// attn_prefill.cu - causal paged attention for prefill chunks, per block of queries.
//
// extern "C" __global__ void attn_prefill_f32(const float* q, const float* k_cache,
//         const float* v_cache, const i32* block_tables, int max_blocks,
//         const i32* q_start, const i32* q_len, const i32* start_pos, float* out,
//         int n_heads, int n_kv_heads, int head_dim, float scale)
// extern "C" __global__ void attn_prefill_f16(... u16* caches, otherwise the same ...)
//   q            : n_tokens x n_heads x head_dim f32 queries (after RoPE), 16-byte aligned;
//                  sequence s owns rows q_start[s] .. q_start[s] + q_len[s]
//   k_cache, v_cache : this layer's paged cache [n_blocks][SPARKD_KV_BLOCK_TOKENS][kv_dim]
//                  in f32 or f16, already holding the chunk's own keys and values
//   block_tables : n_seqs x max_blocks block ids (see attn_decode.cu)
//   start_pos    : position of sequence s's first new token; query i of the sequence is
//                  at start_pos + i and attends to positions 0 ..= start_pos + i (the
//                  cached prefix and the chunk, causally)
//   out          : n_tokens x n_heads x head_dim f32, rows as in q
//   scale        : 1 / sqrt(head_dim)
//   head_dim     : a multiple of 16, at most SPARKD_MAX_HEAD_DIM (256)
//   grid  : (ceil(max q_len / 16), n_heads, n_seqs); block: 256 threads;
//           static shared memory 32.8 KiB
//
// Design (flash-attention style, f32 SIMT): a block owns 16 consecutive queries of one
// head and walks the sequence's KV blocks (16 positions each) up to its last query's
// position, staging each block's keys and values in shared memory once for all 16
// queries. A half-warp serves one query: lane j scores key j of the block (keys padded
// to head_dim + 1 floats per row, so the 16 lanes hit distinct banks), the online
// softmax max and sum use four shuffles, and the output row, split over the 16 lanes
// (head_dim / 16 floats each), accumulates the 16 values with broadcast probabilities.
#include "common.cuh"

#define PRE_THREADS 256
#define PRE_QUERIES 16  // two per warp, one per half-warp

template <typename KV>
static __device__ void attn_prefill(const float* __restrict__ q, const KV* __restrict__ k_cache,
                                    const KV* __restrict__ v_cache,
                                    const i32* __restrict__ block_tables, int max_blocks,
                                    const i32* __restrict__ q_start, const i32* __restrict__ q_len,
                                    const i32* __restrict__ start_pos, float* __restrict__ out,
                                    int n_heads, int n_kv_heads, int head_dim, float scale) {
    constexpr int BT = SPARKD_KV_BLOCK_TOKENS;
    constexpr int MAXD = SPARKD_MAX_HEAD_DIM;
    __shared__ float sk[BT * (MAXD + 1)];
    __shared__ float sv[BT * MAXD];

    const int qb = blockIdx.x, h = blockIdx.y, s = blockIdx.z;
    const int hd = head_dim;
    if (hd > MAXD || hd % 16 != 0) return;  // rejected by the host; stay in bounds
    const int ql = q_len[s], i0 = qb * PRE_QUERIES;
    if (i0 >= ql) return;  // this sequence has fewer queries than the grid covers
    const int group = n_heads / n_kv_heads, g = h / group, kv_dim = n_kv_heads * hd;
    const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31;
    const int half = lane >> 4, j = lane & 15;

    const int qi = i0 + warp * 2 + half;
    const bool active = qi < ql;
    // An idle half-warp shadows query 0, whose first key is always visible, so its
    // softmax stays finite; its result is not written.
    const int qrow = q_start[s] + (active ? qi : 0);
    const int qpos = start_pos[s] + (active ? qi : 0);
    const int last_pos = start_pos[s] + (ql < i0 + PRE_QUERIES ? ql : i0 + PRE_QUERIES) - 1;
    const int n_kv_blocks = last_pos / BT + 1;
    const float* qr = q + ((u64)qrow * n_heads + h) * hd;
    const i32* table = block_tables + (u64)s * max_blocks;
    const int ks = hd + 1;

    float m = -__int_as_float(0x7f800000), l = 0.0f;
    float acc[MAXD / 16];
#pragma unroll
    for (int c = 0; c < MAXD / 16; ++c) acc[c] = 0.0f;

    for (int b = 0; b < n_kv_blocks; ++b) {
        __syncthreads();  // the previous block's keys and values are no longer read
        const u64 base = (u64)table[b] * BT * kv_dim + (u64)g * hd;
        for (int i = tid; i < BT * hd; i += PRE_THREADS) {
            const int r = i / hd, d = i % hd;
            const u64 off = base + (u64)r * kv_dim + d;
            sk[r * ks + d] = kv_load(k_cache + off);
            sv[r * hd + d] = kv_load(v_cache + off);
        }
        __syncthreads();

        float sc = 0.0f;
        const float* kr = sk + j * ks;
        for (int d = 0; d < hd; d += 4) {
            const float4 qq = *(const float4*)(qr + d);
            sc = fmaf(qq.x, kr[d], sc);
            sc = fmaf(qq.y, kr[d + 1], sc);
            sc = fmaf(qq.z, kr[d + 2], sc);
            sc = fmaf(qq.w, kr[d + 3], sc);
        }
        sc *= scale;
        if (b * BT + j > qpos) sc = -__int_as_float(0x7f800000);  // causal mask

        // Offsets below 16 keep the shuffles inside the half-warp.
        float bm = sc;
#pragma unroll
        for (int o = 8; o > 0; o >>= 1) bm = fmaxf(bm, __shfl_xor_sync(SPARKD_FULL_MASK, bm, o));
        const float m_new = fmaxf(m, bm);  // finite: key 0 is visible in block 0
        const float corr = expf(m - m_new);
        const float p = expf(sc - m_new);
        float ps = p;
#pragma unroll
        for (int o = 8; o > 0; o >>= 1) ps += __shfl_xor_sync(SPARKD_FULL_MASK, ps, o);
        l = l * corr + ps;
        m = m_new;

#pragma unroll
        for (int c = 0; c < MAXD / 16; ++c) acc[c] *= corr;
#pragma unroll 4
        for (int jj = 0; jj < BT; ++jj) {
            const float pj = __shfl_sync(SPARKD_FULL_MASK, p, (half << 4) + jj);
            const float* vr = sv + jj * hd;
#pragma unroll
            for (int c = 0; c < MAXD / 16; ++c) {
                const int d = j + 16 * c;
                if (d < hd) acc[c] = fmaf(pj, vr[d], acc[c]);
            }
        }
    }

    if (!active) return;
    float* o = out + ((u64)qrow * n_heads + h) * hd;
    const float inv = 1.0f / l;
#pragma unroll
    for (int c = 0; c < MAXD / 16; ++c) {
        const int d = j + 16 * c;
        if (d < hd) o[d] = acc[c] * inv;
    }
}

extern "C" __global__ void __launch_bounds__(PRE_THREADS, 2)
    attn_prefill_f32(const float* q, const float* k_cache, const float* v_cache,
                     const i32* block_tables, int max_blocks, const i32* q_start,
                     const i32* q_len, const i32* start_pos, float* out, int n_heads,
                     int n_kv_heads, int head_dim, float scale) {
    attn_prefill<float>(q, k_cache, v_cache, block_tables, max_blocks, q_start, q_len,
                        start_pos, out, n_heads, n_kv_heads, head_dim, scale);
}

extern "C" __global__ void __launch_bounds__(PRE_THREADS, 2)
    attn_prefill_f16(const float* q, const u16* k_cache, const u16* v_cache,
                     const i32* block_tables, int max_blocks, const i32* q_start,
                     const i32* q_len, const i32* start_pos, float* out, int n_heads,
                     int n_kv_heads, int head_dim, float scale) {
    attn_prefill<u16>(q, k_cache, v_cache, block_tables, max_blocks, q_start, q_len,
                      start_pos, out, n_heads, n_kv_heads, head_dim, scale);
}
