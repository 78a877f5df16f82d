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
//
// extern "C" __global__ void attn_prefill_f16_tc_hd{32,64,96,128}(const float* q,
//         const u16* k_cache, const u16* v_cache, const i32* block_tables, int max_blocks,
//         const i32* q_start, const i32* q_len, const i32* start_pos, float* out,
//         int n_heads, int n_kv_heads, float scale)
//   The same attention on tensor cores, for an f16 cache and the head size in the name.
//   grid  : (ceil(max q_len / 64), n_heads, n_seqs); block: 128 threads;
//           static shared memory 4 (head_dim + 8) * 64 bytes (34 KiB at 128)
//
// Design (flash-attention 2 on mma.sync m16n8k16): a block owns 64 consecutive queries
// of one head, 16 per warp, and walks the sequence's positions in tiles of 64 (four KV
// blocks) up to its last query's. The queries are scaled by scale * log2(e), rounded to
// f16 and kept in registers as mma A fragments for the whole walk. Per tile: S = Q K^T
// (keys staged as rows, read with ldmatrix as the B operand), the causal mask, the
// online softmax on exp2 over the accumulator layout (a row's 64 scores sit in one quad
// of lanes: two shuffles per reduction), then O += P V, where the f32 scores of two
// adjacent 8-key accumulator tiles are exactly the registers of one 16-key A fragment
// (rounded to f16) and V comes through ldmatrix.trans. Keys and values are staged with
// cp.async in two groups so that the next tile's keys load during P V and its values
// during the next Q K^T. Positions past the block's last query are zero-filled, never
// read: a reused cache block's stale tail cannot reach the output, even as NaN * 0.
// Tiles run latest first (blockIdx.x reversed): the longest causal walks start first.
// Precision: q and p rounded to f16 (2^-11 relative), sums in f32.
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
            // Past the last query's position a reused block may hold another sequence's
            // stale entries; zeros keep even a NaN among them out of p * v.
            const bool seen = b * BT + r <= last_pos;
            sk[r * ks + d] = seen ? kv_load(k_cache + off) : 0.0f;
            sv[r * hd + d] = seen ? kv_load(v_cache + off) : 0.0f;
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
    pdl_enter();
    attn_prefill<float>(q, k_cache, v_cache, block_tables, max_blocks, q_start, q_len,
                        start_pos, out, n_heads, n_kv_heads, head_dim, scale);
}

extern "C" __global__ void __launch_bounds__(PRE_THREADS, 2)
    attn_prefill_f16(const float* q, const u16* k_cache, const u16* v_cache,
                     const i32* block_tables, int max_blocks, const i32* q_start,
                     const i32* q_len, const i32* start_pos, float* out, int n_heads,
                     int n_kv_heads, int head_dim, float scale) {
    pdl_enter();
    attn_prefill<u16>(q, k_cache, v_cache, block_tables, max_blocks, q_start, q_len,
                      start_pos, out, n_heads, n_kv_heads, head_dim, scale);
}

// ---------------------------------------------------------------------------------------
// Tensor-core variant (f16 cache)

#define PRE_TC_THREADS 128
#define PRE_TC_QUERIES 64  // 16 per warp: the mma M side
#define PRE_TC_KEYS 64     // positions per staged tile: four KV blocks

// Stages positions tile * 64 .. + 63 of kv head `kvh` (rows of HD halves, padded to
// HD + 8 so that the eight rows an ldmatrix phase reads fall in distinct bank groups);
// positions past `last_pos` are zero-filled without a read.
template <int HD>
static __device__ __forceinline__ void stage_kv_tile(u16* dst, const u16* __restrict__ cache,
                                                     const i32* __restrict__ table, int tile,
                                                     int last_pos, int kv_dim, int kvh) {
    constexpr int BT = SPARKD_KV_BLOCK_TOKENS, CHUNKS = HD / 8, SK = HD + 8;
    constexpr int PER_THREAD = PRE_TC_KEYS * CHUNKS / PRE_TC_THREADS;
    static_assert(PER_THREAD * PRE_TC_THREADS == PRE_TC_KEYS * CHUNKS, "whole chunks");
#pragma unroll
    for (int j = 0; j < PER_THREAD; ++j) {
        const int i = threadIdx.x + j * PRE_TC_THREADS;
        const int r = i / CHUNKS, c = i % CHUNKS;
        const int pos = tile * PRE_TC_KEYS + r;
        const bool seen = pos <= last_pos;
        const u16* src =
            seen ? cache + ((u64)table[pos / BT] * BT + pos % BT) * kv_dim + kvh * HD + c * 8
                 : cache;
        cp_async16(dst + r * SK + c * 8, src, seen ? 16u : 0u);
    }
}

template <int HD>
static __device__ void attn_prefill_tc(const float* __restrict__ q,
                                       const u16* __restrict__ k_cache,
                                       const u16* __restrict__ v_cache,
                                       const i32* __restrict__ block_tables, int max_blocks,
                                       const i32* __restrict__ q_start,
                                       const i32* __restrict__ q_len,
                                       const i32* __restrict__ start_pos,
                                       float* __restrict__ out, int n_heads, int n_kv_heads,
                                       float scale) {
    static_assert(HD % 16 == 0 && HD <= 128, "head size");
    constexpr int SK = HD + 8, KSTEPS = HD / 16, DTILES = HD / 8, NTILES = PRE_TC_KEYS / 8;
    __shared__ __align__(16) u16 sk[PRE_TC_KEYS * SK];
    __shared__ __align__(16) u16 sv[PRE_TC_KEYS * SK];

    const int qb = gridDim.x - 1 - blockIdx.x, h = blockIdx.y, s = blockIdx.z;
    const int ql = q_len[s], i0 = qb * PRE_TC_QUERIES;
    if (i0 >= ql) return;  // this sequence has fewer queries than the grid covers
    const int kvh = h / (n_heads / n_kv_heads), kv_dim = n_kv_heads * HD;
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    const int g = lane >> 2, t = lane & 3;
    const int p0 = start_pos[s], row0 = q_start[s];
    const int last_pos = p0 + (ql < i0 + PRE_TC_QUERIES ? ql : i0 + PRE_TC_QUERIES) - 1;
    const int n_tiles = last_pos / PRE_TC_KEYS + 1;
    const i32* table = block_tables + (u64)s * max_blocks;

    // This lane's two query rows, g and g + 8 of the warp's 16. Rows past the chunk
    // shadow its last query (their results are not written); a warp with none idles
    // through the loop, staging its share of every tile.
    const int wq0 = i0 + warp * 16;
    const bool warp_active = wq0 < ql;
    int qi[2], qpos[2];
#pragma unroll
    for (int r = 0; r < 2; ++r) {
        const int i = wq0 + g + 8 * r;
        qi[r] = i < ql ? i : ql - 1;
        qpos[r] = p0 + qi[r];
    }

    // A fragments of Q: registers (g, 2t..), (g + 8, 2t..), (g, 2t + 8..), (g + 8, 2t + 8..)
    // of every 16-wide slice of the head.
    const float qscale = scale * 1.4426950408889634f;
    u32 qf[KSTEPS][4];
#pragma unroll
    for (int ks = 0; ks < KSTEPS; ++ks)
#pragma unroll
        for (int reg = 0; reg < 4; ++reg) {
            const float* src = q + ((u64)(row0 + qi[reg & 1]) * n_heads + h) * HD + ks * 16 +
                               2 * t + (reg >> 1) * 8;
            qf[ks][reg] = pack_f16x2(src[0] * qscale, src[1] * qscale);
        }

    float o[DTILES][4];
#pragma unroll
    for (int dt = 0; dt < DTILES; ++dt)
#pragma unroll
        for (int e = 0; e < 4; ++e) o[dt][e] = 0.0f;
    const float neg_inf = -__int_as_float(0x7f800000);
    float m[2] = {neg_inf, neg_inf}, l[2] = {0.0f, 0.0f};  // l: this lane's share

    stage_kv_tile<HD>(sk, k_cache, table, 0, last_pos, kv_dim, kvh);
    cp_async_commit();
    stage_kv_tile<HD>(sv, v_cache, table, 0, last_pos, kv_dim, kvh);
    cp_async_commit();

    for (int tile = 0; tile < n_tiles; ++tile) {
        cp_async_wait<1>();  // this tile's keys have landed; its values may be in flight
        __syncthreads();

        // Scores of 64 keys: accumulator tile nt holds keys nt * 8 + 2t, + 1 of rows g
        // (elements 0, 1) and g + 8 (elements 2, 3).
        float sc[NTILES][4];
        if (warp_active) {
#pragma unroll
            for (int nt = 0; nt < NTILES; ++nt)
#pragma unroll
                for (int e = 0; e < 4; ++e) sc[nt][e] = 0.0f;
#pragma unroll
            for (int ks = 0; ks < KSTEPS; ++ks)
#pragma unroll
                for (int np = 0; np < NTILES / 2; ++np) {
                    // Matrices: (keys 0-7, dims 0-7), (keys 0-7, dims 8-15), (keys 8-15,
                    // dims 0-7), (keys 8-15, dims 8-15) = b0, b1 of key tiles 2np, 2np + 1.
                    const int key = np * 16 + (lane >> 4) * 8 + (lane & 7);
                    u32 b[4];
                    ldmatrix_x4(b, &sk[key * SK + ks * 16 + ((lane >> 3) & 1) * 8]);
                    mma_16816<false>(sc[2 * np], qf[ks], b[0], b[1]);
                    mma_16816<false>(sc[2 * np + 1], qf[ks], b[2], b[3]);
                }

            // The causal mask; it also hides the zero-filled positions, which lie past
            // every query of the block.
#pragma unroll
            for (int nt = 0; nt < NTILES; ++nt)
#pragma unroll
                for (int e = 0; e < 4; ++e) {
                    const int key = tile * PRE_TC_KEYS + nt * 8 + 2 * t + (e & 1);
                    if (key > qpos[e >> 1]) sc[nt][e] = neg_inf;
                }

            // Online softmax per row. The row's maximum is finite from tile 0 on, whose
            // position 0 every query sees.
#pragma unroll
            for (int r = 0; r < 2; ++r) {
                float mx = neg_inf;
#pragma unroll
                for (int nt = 0; nt < NTILES; ++nt)
                    mx = fmaxf(mx, fmaxf(sc[nt][2 * r], sc[nt][2 * r + 1]));
                mx = fmaxf(mx, __shfl_xor_sync(SPARKD_FULL_MASK, mx, 1));
                mx = fmaxf(mx, __shfl_xor_sync(SPARKD_FULL_MASK, mx, 2));
                const float m_new = fmaxf(m[r], mx);
                const float corr = exp2f(m[r] - m_new);  // 0 on the first tile
                m[r] = m_new;
                l[r] *= corr;
#pragma unroll
                for (int dt = 0; dt < DTILES; ++dt) {
                    o[dt][2 * r] *= corr;
                    o[dt][2 * r + 1] *= corr;
                }
#pragma unroll
                for (int nt = 0; nt < NTILES; ++nt)
#pragma unroll
                    for (int e = 2 * r; e < 2 * r + 2; ++e) {
                        sc[nt][e] = exp2f(sc[nt][e] - m_new);
                        l[r] += sc[nt][e];
                    }
            }
        }

        cp_async_wait<0>();  // this tile's values have landed
        __syncthreads();     // and every warp is done with its keys
        if (tile + 1 < n_tiles)
            stage_kv_tile<HD>(sk, k_cache, table, tile + 1, last_pos, kv_dim, kvh);
        cp_async_commit();

        if (warp_active) {
#pragma unroll
            for (int kk = 0; kk < PRE_TC_KEYS / 16; ++kk) {
                // P of keys kk * 16 ..: accumulator tiles 2kk and 2kk + 1 are the A
                // registers (g, 2t..), (g + 8, 2t..), (g, 2t + 8..), (g + 8, 2t + 8..).
                const u32 pa[4] = {pack_f16x2(sc[2 * kk][0], sc[2 * kk][1]),
                                   pack_f16x2(sc[2 * kk][2], sc[2 * kk][3]),
                                   pack_f16x2(sc[2 * kk + 1][0], sc[2 * kk + 1][1]),
                                   pack_f16x2(sc[2 * kk + 1][2], sc[2 * kk + 1][3])};
#pragma unroll
                for (int dp = 0; dp < DTILES / 2; ++dp) {
                    // Transposed matrices: (keys 0-7, dims 0-7), (keys 8-15, dims 0-7),
                    // (keys 0-7, dims 8-15), (keys 8-15, dims 8-15) = b0, b1 of dim
                    // tiles 2dp, 2dp + 1.
                    const int key = kk * 16 + ((lane >> 3) & 1) * 8 + (lane & 7);
                    u32 b[4];
                    ldmatrix_x4_trans(b, &sv[key * SK + dp * 16 + (lane >> 4) * 8]);
                    mma_16816<false>(o[2 * dp], pa, b[0], b[1]);
                    mma_16816<false>(o[2 * dp + 1], pa, b[2], b[3]);
                }
            }
        }

        __syncthreads();  // every warp is done with this tile's values
        if (tile + 1 < n_tiles)
            stage_kv_tile<HD>(sv, v_cache, table, tile + 1, last_pos, kv_dim, kvh);
        cp_async_commit();
    }

    if (!warp_active) return;
#pragma unroll
    for (int r = 0; r < 2; ++r) {
        float sum = l[r];
        sum += __shfl_xor_sync(SPARKD_FULL_MASK, sum, 1);
        sum += __shfl_xor_sync(SPARKD_FULL_MASK, sum, 2);
        if (wq0 + g + 8 * r >= ql) continue;
        const float inv = 1.0f / sum;
        float* dst = out + ((u64)(row0 + qi[r]) * n_heads + h) * HD + 2 * t;
#pragma unroll
        for (int dt = 0; dt < DTILES; ++dt) {
            dst[dt * 8] = o[dt][2 * r] * inv;
            dst[dt * 8 + 1] = o[dt][2 * r + 1] * inv;
        }
    }
}

#define SPARKD_ATTN_PREFILL_TC(HD)                                                            \
    extern "C" __global__ void __launch_bounds__(PRE_TC_THREADS) attn_prefill_f16_tc_hd##HD( \
        const float* q, const u16* k_cache, const u16* v_cache, const i32* block_tables,     \
        int max_blocks, const i32* q_start, const i32* q_len, const i32* start_pos,          \
        float* out, int n_heads, int n_kv_heads, float scale) {                              \
        pdl_enter();                                                                         \
        attn_prefill_tc<HD>(q, k_cache, v_cache, block_tables, max_blocks, q_start, q_len,   \
                            start_pos, out, n_heads, n_kv_heads, scale);                     \
    }
SPARKD_ATTN_PREFILL_TC(32)
SPARKD_ATTN_PREFILL_TC(64)
SPARKD_ATTN_PREFILL_TC(96)
SPARKD_ATTN_PREFILL_TC(128)
