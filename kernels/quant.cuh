// quant.cuh - ggml weight block layouts and the one dequantization primitive every
// weight-reading kernel (embedding, mat-vec, dequantize) is built on.
//
// A weight row of `cols` elements is `cols / BLOCK_ELEMS` consecutive blocks, exactly as
// in the GGUF file (daemon/src/quant/types.rs). Kernels walk a row in *groups* of eight
// weights: `dq8<T>(row, g, w, e0, e1)` decodes group `g` into `w[0..4]` (row elements
// e0..e0+3) and `w[4..8]` (elements e1..e1+3). Each format picks the eight weights that
// share bytes, so a group costs a handful of small loads and no wasted bits; the two runs
// of four keep activation reads vectorised. A row has `cols / 8` groups, and for block
// formats the 4 (legacy, IQ4_NL) or 32 (K-quants, IQ4_XS) groups of a block cover exactly
// that block.
//
// Arithmetic follows daemon/src/quant/dequant.rs (itself ggml's) operation for operation,
// so dequantized values are bit-identical to the CPU reference: a product followed by a
// sum goes through the _rn intrinsics, which the compiler may not fuse into one FMA.
#pragma once
#include "common.cuh"

// ggml type ids (GGUF tensor infos); the host passes them through unchanged.
#define W_F32 0
#define W_F16 1
#define W_Q4_0 2
#define W_Q4_1 3
#define W_Q5_0 6
#define W_Q5_1 7
#define W_Q8_0 8
#define W_Q2_K 10
#define W_Q3_K 11
#define W_Q4_K 12
#define W_Q5_K 13
#define W_Q6_K 14
#define W_IQ4_NL 20
#define W_IQ4_XS 23
#define W_BF16 30

struct block_q4_0 { u16 d; u8 qs[16]; };
struct block_q4_1 { u16 d; u16 m; u8 qs[16]; };
struct block_q5_0 { u16 d; u8 qh[4]; u8 qs[16]; };
struct block_q5_1 { u16 d; u16 m; u8 qh[4]; u8 qs[16]; };
struct block_q8_0 { u16 d; i8 qs[32]; };
struct block_q2_k { u8 scales[16]; u8 qs[64]; u16 d; u16 dmin; };
struct block_q3_k { u8 hmask[32]; u8 qs[64]; u8 scales[12]; u16 d; };
struct block_q4_k { u16 d; u16 dmin; u8 scales[12]; u8 qs[128]; };
struct block_q5_k { u16 d; u16 dmin; u8 scales[12]; u8 qh[32]; u8 qs[128]; };
struct block_q6_k { u8 ql[128]; u8 qh[64]; i8 scales[16]; u16 d; };
struct block_iq4_nl { u16 d; u8 qs[16]; };
struct block_iq4_xs { u16 d; u16 scales_h; u8 scales_l[4]; u8 qs[128]; };

static_assert(sizeof(block_q4_0) == 18, "Q4_0 block is 18 bytes");
static_assert(sizeof(block_q4_1) == 20, "Q4_1 block is 20 bytes");
static_assert(sizeof(block_q5_0) == 22, "Q5_0 block is 22 bytes");
static_assert(sizeof(block_q5_1) == 24, "Q5_1 block is 24 bytes");
static_assert(sizeof(block_q8_0) == 34, "Q8_0 block is 34 bytes");
static_assert(sizeof(block_q2_k) == 84, "Q2_K block is 84 bytes");
static_assert(sizeof(block_q3_k) == 110, "Q3_K block is 110 bytes");
static_assert(sizeof(block_q4_k) == 144, "Q4_K block is 144 bytes");
static_assert(sizeof(block_q5_k) == 176, "Q5_K block is 176 bytes");
static_assert(sizeof(block_q6_k) == 210, "Q6_K block is 210 bytes");
static_assert(sizeof(block_iq4_nl) == 18, "IQ4_NL block is 18 bytes");
static_assert(sizeof(block_iq4_xs) == 136, "IQ4_XS block is 136 bytes");

// Elements and bytes per block; float formats are "blocks" of one element.
template <int T> struct WTraits;
template <> struct WTraits<W_F32> { static constexpr int ELEMS = 1, BYTES = 4; };
template <> struct WTraits<W_F16> { static constexpr int ELEMS = 1, BYTES = 2; };
template <> struct WTraits<W_BF16> { static constexpr int ELEMS = 1, BYTES = 2; };
template <> struct WTraits<W_Q4_0> { static constexpr int ELEMS = 32, BYTES = 18; };
template <> struct WTraits<W_Q4_1> { static constexpr int ELEMS = 32, BYTES = 20; };
template <> struct WTraits<W_Q5_0> { static constexpr int ELEMS = 32, BYTES = 22; };
template <> struct WTraits<W_Q5_1> { static constexpr int ELEMS = 32, BYTES = 24; };
template <> struct WTraits<W_Q8_0> { static constexpr int ELEMS = 32, BYTES = 34; };
template <> struct WTraits<W_Q2_K> { static constexpr int ELEMS = 256, BYTES = 84; };
template <> struct WTraits<W_Q3_K> { static constexpr int ELEMS = 256, BYTES = 110; };
template <> struct WTraits<W_Q4_K> { static constexpr int ELEMS = 256, BYTES = 144; };
template <> struct WTraits<W_Q5_K> { static constexpr int ELEMS = 256, BYTES = 176; };
template <> struct WTraits<W_Q6_K> { static constexpr int ELEMS = 256, BYTES = 210; };
template <> struct WTraits<W_IQ4_NL> { static constexpr int ELEMS = 32, BYTES = 18; };
template <> struct WTraits<W_IQ4_XS> { static constexpr int ELEMS = 256, BYTES = 136; };

// a * b + c and a * b - c with two roundings, as the CPU computes them.
static __device__ __forceinline__ float mul_add_rn(float a, float b, float c) {
    return __fadd_rn(__fmul_rn(a, b), c);
}
static __device__ __forceinline__ float mul_sub_rn(float a, float b, float c) {
    return __fsub_rn(__fmul_rn(a, b), c);
}

template <int T>
static __device__ __forceinline__ u64 row_bytes(int cols) {
    return (u64)(cols / WTraits<T>::ELEMS) * WTraits<T>::BYTES;
}

// Before pdl_enter (common.cuh), in the decode products: rows row0 .. row0 + count of
// `w` (and the same rows of `w2` when it is not null), clipped to `rows`, into L2 while
// the kernel before finishes.
template <int T>
static __device__ __forceinline__ void prefetch_rows_l2(const u8* w, const u8* w2, int row0,
                                                        int count, int rows, int cols) {
    const int n = rows - row0 < count ? rows - row0 : count;
    if (n <= 0) return;
    const u64 rb = row_bytes<T>(cols);
    prefetch_weights_l2(w + (u64)row0 * rb, (u64)n * rb);
    if (w2 != nullptr) prefetch_weights_l2(w2 + (u64)row0 * rb, (u64)n * rb);
}

// Four bytes at a 2-byte aligned address (blocks of 18, 22, 34, 110 or 210 bytes are only
// 2-byte aligned, so a 32-bit load is not allowed; IQ4_NL's are 18).
static __device__ __forceinline__ u32 ld4_a2(const u8* p) {
    const u16* h = (const u16*)p;
    return (u32)h[0] | ((u32)h[1] << 16);
}

// ggml's get_scale_min_k4: 6-bit scale and min of sub-block j of a Q4_K/Q5_K block.
static __device__ __forceinline__ void scale_min_k4(int j, const u8* q, int& sc, int& m) {
    if (j < 4) {
        sc = q[j] & 63;
        m = q[j + 4] & 63;
    } else {
        sc = (q[j + 4] & 0xF) | ((q[j - 4] >> 6) << 4);
        m = (q[j + 4] >> 4) | ((q[j] >> 6) << 4);
    }
}

// The signed 6-bit scale of sub-block j (of 16) of a Q3_K block: low four bits in a
// nibble of scales[0..8], high two bits in scales[8..12].
static __device__ __forceinline__ int q3_k_scale(const u8* scales, int j) {
    const int low = j < 8 ? scales[j] & 0xF : scales[j - 8] >> 4;
    const int high = (scales[8 + (j & 3)] >> (2 * (j >> 2))) & 3;
    return (low | (high << 4)) - 32;
}

// IQ4_NL's 16 non-linear levels (ggml's kvalues_iq4nl: -127 -104 -83 -65 -49 -35 -22 -10
// 1 13 25 38 53 69 89 113) as signed bytes, four to a word, level 0 in the low byte of
// IQ4NL_W0: immediates, so a lookup reads no memory.
#define IQ4NL_W0 0xBFAD9881u
#define IQ4NL_W1 0xF6EADDCFu
#define IQ4NL_W2 0x26190D01u
#define IQ4NL_W3 0x71594535u

// The levels of the eight nibbles of the four quant bytes in v, as signed bytes: byte i
// of `lo` is the level of byte i's low nibble, byte i of `hi` that of its high nibble.
// __byte_perm picks bytes of an 8-byte half-table by a nibble's low three bits (bit 3 is
// masked off: PTX's prmt would take it for sign replication), then each nibble's bit 3
// picks the half; eight lookups in six byte permutes.
static __device__ __forceinline__ void iq4nl_levels(u32 v, u32& lo, u32& hi) {
    const u32 idx = v & 0x77777777u;
    const u32 half = 0x32103210u | ((v & 0x88888888u) >> 1);
    // Nibbles 0..3 (bytes 0 and 1: lo0 hi0 lo1 hi1), then 4..7 (bytes 2 and 3).
    const u32 n0 = __byte_perm(__byte_perm(IQ4NL_W0, IQ4NL_W1, idx),
                               __byte_perm(IQ4NL_W2, IQ4NL_W3, idx), half);
    const u32 n1 = __byte_perm(__byte_perm(IQ4NL_W0, IQ4NL_W1, idx >> 16),
                               __byte_perm(IQ4NL_W2, IQ4NL_W3, idx >> 16), half >> 16);
    lo = __byte_perm(n0, n1, 0x6420);
    hi = __byte_perm(n0, n1, 0x7531);
}

// The 6-bit scale of sub-block ib (of 8) of an IQ4_XS block, offset removed: low four
// bits in nibble ib % 2 of scales_l[ib / 2], high two bits at 2 ib of scales_h.
static __device__ __forceinline__ int iq4_xs_scale(u16 scales_h, const u8* scales_l, int ib) {
    const int low = (scales_l[ib >> 1] >> (4 * (ib & 1))) & 0xF;
    const int high = (scales_h >> (2 * ib)) & 3;
    return (low | (high << 4)) - 32;
}

template <int T>
static __device__ __forceinline__ void dq8(const u8* row, int g, float (&w)[8], int& e0, int& e1);

template <>
__device__ __forceinline__ void dq8<W_F32>(const u8* row, int g, float (&w)[8], int& e0, int& e1) {
    const float4* p = (const float4*)row + 2 * g;
    const float4 a = p[0], b = p[1];
    w[0] = a.x; w[1] = a.y; w[2] = a.z; w[3] = a.w;
    w[4] = b.x; w[5] = b.y; w[6] = b.z; w[7] = b.w;
    e0 = 8 * g;
    e1 = e0 + 4;
}

template <>
__device__ __forceinline__ void dq8<W_F16>(const u8* row, int g, float (&w)[8], int& e0, int& e1) {
    const u32* p = (const u32*)row + 4 * g;
#pragma unroll
    for (int i = 0; i < 4; ++i) {
        const u32 v = p[i];
        w[2 * i] = f16_to_f32((u16)(v & 0xFFFF));
        w[2 * i + 1] = f16_to_f32((u16)(v >> 16));
    }
    e0 = 8 * g;
    e1 = e0 + 4;
}

template <>
__device__ __forceinline__ void dq8<W_BF16>(const u8* row, int g, float (&w)[8], int& e0, int& e1) {
    const u32* p = (const u32*)row + 4 * g;
#pragma unroll
    for (int i = 0; i < 4; ++i) {
        const u32 v = p[i];
        w[2 * i] = bf16_to_f32((u16)(v & 0xFFFF));
        w[2 * i + 1] = bf16_to_f32((u16)(v >> 16));
    }
    e0 = 8 * g;
    e1 = e0 + 4;
}

// Legacy formats: group g is quarter q = g % 4 of block g / 4, i.e. quant bytes 4q..4q+3,
// whose low nibbles are elements 4q.. and high nibbles elements 16 + 4q.. of the block.
template <>
__device__ __forceinline__ void dq8<W_Q4_0>(const u8* row, int g, float (&w)[8], int& e0, int& e1) {
    const block_q4_0* b = (const block_q4_0*)row + (g >> 2);
    const int q = g & 3;
    const float d = f16_to_f32(b->d);
    const u32 v = ld4_a2(b->qs + 4 * q);
#pragma unroll
    for (int i = 0; i < 4; ++i) {
        const int x = (v >> (8 * i)) & 0xFF;
        w[i] = (float)((x & 0xF) - 8) * d;
        w[4 + i] = (float)((x >> 4) - 8) * d;
    }
    e0 = (g >> 2) * 32 + 4 * q;
    e1 = e0 + 16;
}

template <>
__device__ __forceinline__ void dq8<W_Q4_1>(const u8* row, int g, float (&w)[8], int& e0, int& e1) {
    const block_q4_1* b = (const block_q4_1*)row + (g >> 2);
    const int q = g & 3;
    const float d = f16_to_f32(b->d), m = f16_to_f32(b->m);
    const u32 v = ld4_a2(b->qs + 4 * q);
#pragma unroll
    for (int i = 0; i < 4; ++i) {
        const int x = (v >> (8 * i)) & 0xFF;
        w[i] = mul_add_rn((float)(x & 0xF), d, m);
        w[4 + i] = mul_add_rn((float)(x >> 4), d, m);
    }
    e0 = (g >> 2) * 32 + 4 * q;
    e1 = e0 + 16;
}

// Q5: bit 4 of block element j is bit j of qh.
template <>
__device__ __forceinline__ void dq8<W_Q5_0>(const u8* row, int g, float (&w)[8], int& e0, int& e1) {
    const block_q5_0* b = (const block_q5_0*)row + (g >> 2);
    const int q = g & 3;
    const float d = f16_to_f32(b->d);
    const u32 qh = ld4_a2(b->qh);
    const u32 v = ld4_a2(b->qs + 4 * q);
#pragma unroll
    for (int i = 0; i < 4; ++i) {
        const int j = 4 * q + i;
        const int x = (v >> (8 * i)) & 0xFF;
        const int h0 = ((qh >> j) & 1) << 4;
        const int h1 = ((qh >> (j + 16)) & 1) << 4;
        w[i] = (float)(((x & 0xF) | h0) - 16) * d;
        w[4 + i] = (float)(((x >> 4) | h1) - 16) * d;
    }
    e0 = (g >> 2) * 32 + 4 * q;
    e1 = e0 + 16;
}

template <>
__device__ __forceinline__ void dq8<W_Q5_1>(const u8* row, int g, float (&w)[8], int& e0, int& e1) {
    const block_q5_1* b = (const block_q5_1*)row + (g >> 2);
    const int q = g & 3;
    const float d = f16_to_f32(b->d), m = f16_to_f32(b->m);
    const u32 qh = ld4_a2(b->qh);
    const u32 v = ld4_a2(b->qs + 4 * q);
#pragma unroll
    for (int i = 0; i < 4; ++i) {
        const int j = 4 * q + i;
        const int x = (v >> (8 * i)) & 0xFF;
        const int h0 = ((qh >> j) & 1) << 4;
        const int h1 = ((qh >> (j + 16)) & 1) << 4;
        w[i] = mul_add_rn((float)((x & 0xF) | h0), d, m);
        w[4 + i] = mul_add_rn((float)((x >> 4) | h1), d, m);
    }
    e0 = (g >> 2) * 32 + 4 * q;
    e1 = e0 + 16;
}

// Q8_0: group g is elements 8q..8q+7 of block g / 4.
template <>
__device__ __forceinline__ void dq8<W_Q8_0>(const u8* row, int g, float (&w)[8], int& e0, int& e1) {
    const block_q8_0* b = (const block_q8_0*)row + (g >> 2);
    const int q = g & 3;
    const float d = f16_to_f32(b->d);
    const u8* qs = (const u8*)b->qs + 8 * q;
    const u32 lo = ld4_a2(qs), hi = ld4_a2(qs + 4);
#pragma unroll
    for (int i = 0; i < 4; ++i) {
        w[i] = (float)(i8)((lo >> (8 * i)) & 0xFF) * d;
        w[4 + i] = (float)(i8)((hi >> (8 * i)) & 0xFF) * d;
    }
    e0 = (g >> 2) * 32 + 8 * q;
    e1 = e0 + 4;
}

// K-quants: group g is lane l = g % 32 of super-block g / 32. For Q4_K/Q5_K, lane l takes
// chunk c = l / 8 (64 elements, quant bytes 32c..32c+31) at byte offset l0 = 4 (l % 8):
// low nibbles are elements 64c + l0.. (sub-block 2c), high nibbles 64c + 32 + l0..
// (sub-block 2c + 1).
template <>
__device__ __forceinline__ void dq8<W_Q4_K>(const u8* row, int g, float (&w)[8], int& e0, int& e1) {
    const block_q4_k* b = (const block_q4_k*)row + (g >> 5);
    const int l = g & 31, c = l >> 3, l0 = (l & 7) * 4;
    const float d = f16_to_f32(b->d), dmin = f16_to_f32(b->dmin);
    int sc1, m1, sc2, m2;
    scale_min_k4(2 * c, b->scales, sc1, m1);
    scale_min_k4(2 * c + 1, b->scales, sc2, m2);
    const float d1 = d * (float)sc1, mm1 = dmin * (float)m1;
    const float d2 = d * (float)sc2, mm2 = dmin * (float)m2;
    const u32 v = ld4_a2(b->qs + 32 * c + l0);
#pragma unroll
    for (int i = 0; i < 4; ++i) {
        const int x = (v >> (8 * i)) & 0xFF;
        w[i] = mul_sub_rn(d1, (float)(x & 0xF), mm1);
        w[4 + i] = mul_sub_rn(d2, (float)(x >> 4), mm2);
    }
    e0 = (g >> 5) * 256 + 64 * c + l0;
    e1 = e0 + 32;
}

// Q5_K: as Q4_K; the fifth bit of chunk c's low (high) nibble of byte l is bit 2c
// (2c + 1) of qh[l].
template <>
__device__ __forceinline__ void dq8<W_Q5_K>(const u8* row, int g, float (&w)[8], int& e0, int& e1) {
    const block_q5_k* b = (const block_q5_k*)row + (g >> 5);
    const int l = g & 31, c = l >> 3, l0 = (l & 7) * 4;
    const float d = f16_to_f32(b->d), dmin = f16_to_f32(b->dmin);
    int sc1, m1, sc2, m2;
    scale_min_k4(2 * c, b->scales, sc1, m1);
    scale_min_k4(2 * c + 1, b->scales, sc2, m2);
    const float d1 = d * (float)sc1, mm1 = dmin * (float)m1;
    const float d2 = d * (float)sc2, mm2 = dmin * (float)m2;
    const u32 v = ld4_a2(b->qs + 32 * c + l0);
    const u32 h = ld4_a2(b->qh + l0);
#pragma unroll
    for (int i = 0; i < 4; ++i) {
        const int x = (v >> (8 * i)) & 0xFF;
        const int hb = (h >> (8 * i)) & 0xFF;
        const int h1 = (hb >> (2 * c)) & 1 ? 16 : 0;
        const int h2 = (hb >> (2 * c + 1)) & 1 ? 16 : 0;
        w[i] = mul_sub_rn(d1, (float)((x & 0xF) + h1), mm1);
        w[4 + i] = mul_sub_rn(d2, (float)((x >> 4) + h2), mm2);
    }
    e0 = (g >> 5) * 256 + 64 * c + l0;
    e1 = e0 + 32;
}

// Q2_K/Q3_K: a super-block is two halves of 128; in half h, 2-bit field s (bits 2s..2s+1)
// of qs byte 32h + l is element 128h + 32s + l, and sub-block j (16 elements, one scale)
// is element / 16. A 4-byte load of qs holds four runs of four; lane l = g % 32 takes half
// h = l / 16, nibble p = (l / 8) % 2 (fields 2p, 2p + 1: the low bits of the nibble make
// the first run, its high bits the second) and l0 = 4 (l % 8): elements
// 128h + 64p + l0.. (sub-block 8h + 4p + l0 / 16) and 32 further on (that sub-block + 2).
// Pairs of lanes load the same qs word, as Q6_K's sides share qh: the other split, all
// four fields of two bytes, would leave runs of two.
template <>
__device__ __forceinline__ void dq8<W_Q2_K>(const u8* row, int g, float (&w)[8], int& e0, int& e1) {
    const block_q2_k* b = (const block_q2_k*)row + (g >> 5);
    const int l = g & 31, h = l >> 4, p = (l >> 3) & 1, l0 = (l & 7) * 4;
    const int j = 8 * h + 4 * p + (l0 >> 4);
    const float d = f16_to_f32(b->d), dmin = f16_to_f32(b->dmin);
    const int sc1 = b->scales[j], sc2 = b->scales[j + 2];
    const float d1 = d * (float)(sc1 & 0xF), mm1 = dmin * (float)(sc1 >> 4);
    const float d2 = d * (float)(sc2 & 0xF), mm2 = dmin * (float)(sc2 >> 4);
    const u32 v = ld4_a2(b->qs + 32 * h + l0);
#pragma unroll
    for (int i = 0; i < 4; ++i) {
        const int x = (v >> (8 * i + 4 * p)) & 0xF;
        w[i] = mul_sub_rn(d1, (float)(x & 3), mm1);
        w[4 + i] = mul_sub_rn(d2, (float)(x >> 2), mm2);
    }
    e0 = (g >> 5) * 256 + 128 * h + 64 * p + l0;
    e1 = e0 + 32;
}

// Q3_K: the 2-bit levels as Q2_K; the third bit of element 128h + 32s + l is bit 4h + s of
// hmask[l], and where it is clear the level is 4 lower (ggml's encoding of -4..3).
template <>
__device__ __forceinline__ void dq8<W_Q3_K>(const u8* row, int g, float (&w)[8], int& e0, int& e1) {
    const block_q3_k* b = (const block_q3_k*)row + (g >> 5);
    const int l = g & 31, h = l >> 4, p = (l >> 3) & 1, l0 = (l & 7) * 4;
    const int j = 8 * h + 4 * p + (l0 >> 4);
    const float d = f16_to_f32(b->d);
    const float d1 = d * (float)q3_k_scale(b->scales, j);
    const float d2 = d * (float)q3_k_scale(b->scales, j + 2);
    const u32 v = ld4_a2(b->qs + 32 * h + l0);
    const u32 m = ld4_a2(b->hmask + l0);
    const int s = 4 * h + 2 * p;  // hmask bit of the first run; the second's is s + 1
#pragma unroll
    for (int i = 0; i < 4; ++i) {
        const int x = (v >> (8 * i + 4 * p)) & 0xF;
        const int hb = (m >> (8 * i)) & 0xFF;
        const int q1 = (x & 3) - ((hb >> s) & 1 ? 0 : 4);
        const int q2 = (x >> 2) - ((hb >> (s + 1)) & 1 ? 0 : 4);
        w[i] = d1 * (float)q1;
        w[4 + i] = d2 * (float)q2;
    }
    e0 = (g >> 5) * 256 + 128 * h + 64 * p + l0;
    e1 = e0 + 32;
}

// Q6_K: a super-block is two halves of 128; in half h, byte l (0..31) of ql (and ql
// l + 32) with byte l of qh makes elements l, l + 32, l + 64, l + 96. Lane l = g % 32
// takes half h = l / 16, side s = (l / 8) % 2 (ql byte l' or l' + 32) and l' = 4 (l % 8)..:
// elements 128h + 32s + l'.. (low nibbles) and 128h + 64 + 32s + l'.. (high nibbles).
template <>
__device__ __forceinline__ void dq8<W_Q6_K>(const u8* row, int g, float (&w)[8], int& e0, int& e1) {
    const block_q6_k* b = (const block_q6_k*)row + (g >> 5);
    const int l = g & 31, h = l >> 4, s = (l >> 3) & 1, l0 = (l & 7) * 4;
    const int is = l0 / 16;
    const float d = f16_to_f32(b->d);
    // ggml evaluates d * sc * q left to right in float.
    const float ds_lo = d * (float)b->scales[8 * h + is + 2 * s];
    const float ds_hi = d * (float)b->scales[8 * h + is + 4 + 2 * s];
    const u32 ql = ld4_a2(b->ql + 64 * h + 32 * s + l0);
    const u32 qh = ld4_a2(b->qh + 32 * h + l0);
#pragma unroll
    for (int i = 0; i < 4; ++i) {
        const int x = (ql >> (8 * i)) & 0xFF;
        const int hb = (qh >> (8 * i)) & 0xFF;
        const int q_lo = ((x & 0xF) | (((hb >> (2 * s)) & 3) << 4)) - 32;
        const int q_hi = ((x >> 4) | (((hb >> (4 + 2 * s)) & 3) << 4)) - 32;
        w[i] = ds_lo * (float)q_lo;
        w[4 + i] = ds_hi * (float)q_hi;
    }
    e0 = (g >> 5) * 256 + 128 * h + 32 * s + l0;
    e1 = e0 + 64;
}

// IQ4_NL: the nibbles laid out as Q4_0's (group g is quarter q = g % 4 of block g / 4),
// each a level of the non-linear table times d.
template <>
__device__ __forceinline__ void dq8<W_IQ4_NL>(const u8* row, int g, float (&w)[8], int& e0, int& e1) {
    const block_iq4_nl* b = (const block_iq4_nl*)row + (g >> 2);
    const int q = g & 3;
    const float d = f16_to_f32(b->d);
    u32 lo, hi;
    iq4nl_levels(ld4_a2(b->qs + 4 * q), lo, hi);
#pragma unroll
    for (int i = 0; i < 4; ++i) {
        w[i] = d * (float)(i8)((lo >> (8 * i)) & 0xFF);
        w[4 + i] = d * (float)(i8)((hi >> (8 * i)) & 0xFF);
    }
    e0 = (g >> 2) * 32 + 4 * q;
    e1 = e0 + 16;
}

// IQ4_XS: eight sub-blocks of 32, each an IQ4_NL block with a 6-bit scale in place of d
// (dl = d (ls - 32)). Lane l = g % 32 takes sub-block ib = l / 4 and its quarter
// q = l % 4: qs bytes 16 ib + 4q.., elements 32 ib + 4q.. and 16 further on.
template <>
__device__ __forceinline__ void dq8<W_IQ4_XS>(const u8* row, int g, float (&w)[8], int& e0, int& e1) {
    const block_iq4_xs* b = (const block_iq4_xs*)row + (g >> 5);
    const int l = g & 31, ib = l >> 2, q = l & 3;
    const float dl = f16_to_f32(b->d) * (float)iq4_xs_scale(b->scales_h, b->scales_l, ib);
    u32 lo, hi;
    iq4nl_levels(ld4_a2(b->qs + 16 * ib + 4 * q), lo, hi);
#pragma unroll
    for (int i = 0; i < 4; ++i) {
        w[i] = dl * (float)(i8)((lo >> (8 * i)) & 0xFF);
        w[4 + i] = dl * (float)(i8)((hi >> (8 * i)) & 0xFF);
    }
    e0 = (g >> 5) * 256 + 32 * ib + 4 * q;
    e1 = e0 + 16;
}

// Expands `M(name, type_id)` once per supported weight format; entry-point files use it
// to stamp out one kernel per format. With SPARKD_ONLY_WTYPE defined to a type id, only
// that format's: the host compiles the largest modules one format per NVRTC program, in
// parallel (kernels/src/sources.rs, `units`).
#ifdef SPARKD_ONLY_WTYPE
#define SPARKD_WANT_WTYPE(id) (SPARKD_ONLY_WTYPE == (id))
#else
#define SPARKD_WANT_WTYPE(id) 1
#endif
#if SPARKD_WANT_WTYPE(W_F32)
#define SPARKD_W_F32(M) M(f32, W_F32)
#else
#define SPARKD_W_F32(M)
#endif
#if SPARKD_WANT_WTYPE(W_F16)
#define SPARKD_W_F16(M) M(f16, W_F16)
#else
#define SPARKD_W_F16(M)
#endif
#if SPARKD_WANT_WTYPE(W_BF16)
#define SPARKD_W_BF16(M) M(bf16, W_BF16)
#else
#define SPARKD_W_BF16(M)
#endif
#if SPARKD_WANT_WTYPE(W_Q4_0)
#define SPARKD_W_Q4_0(M) M(q4_0, W_Q4_0)
#else
#define SPARKD_W_Q4_0(M)
#endif
#if SPARKD_WANT_WTYPE(W_Q4_1)
#define SPARKD_W_Q4_1(M) M(q4_1, W_Q4_1)
#else
#define SPARKD_W_Q4_1(M)
#endif
#if SPARKD_WANT_WTYPE(W_Q5_0)
#define SPARKD_W_Q5_0(M) M(q5_0, W_Q5_0)
#else
#define SPARKD_W_Q5_0(M)
#endif
#if SPARKD_WANT_WTYPE(W_Q5_1)
#define SPARKD_W_Q5_1(M) M(q5_1, W_Q5_1)
#else
#define SPARKD_W_Q5_1(M)
#endif
#if SPARKD_WANT_WTYPE(W_Q8_0)
#define SPARKD_W_Q8_0(M) M(q8_0, W_Q8_0)
#else
#define SPARKD_W_Q8_0(M)
#endif
#if SPARKD_WANT_WTYPE(W_Q2_K)
#define SPARKD_W_Q2_K(M) M(q2_k, W_Q2_K)
#else
#define SPARKD_W_Q2_K(M)
#endif
#if SPARKD_WANT_WTYPE(W_Q3_K)
#define SPARKD_W_Q3_K(M) M(q3_k, W_Q3_K)
#else
#define SPARKD_W_Q3_K(M)
#endif
#if SPARKD_WANT_WTYPE(W_Q4_K)
#define SPARKD_W_Q4_K(M) M(q4_k, W_Q4_K)
#else
#define SPARKD_W_Q4_K(M)
#endif
#if SPARKD_WANT_WTYPE(W_Q5_K)
#define SPARKD_W_Q5_K(M) M(q5_k, W_Q5_K)
#else
#define SPARKD_W_Q5_K(M)
#endif
#if SPARKD_WANT_WTYPE(W_Q6_K)
#define SPARKD_W_Q6_K(M) M(q6_k, W_Q6_K)
#else
#define SPARKD_W_Q6_K(M)
#endif
#if SPARKD_WANT_WTYPE(W_IQ4_NL)
#define SPARKD_W_IQ4_NL(M) M(iq4_nl, W_IQ4_NL)
#else
#define SPARKD_W_IQ4_NL(M)
#endif
#if SPARKD_WANT_WTYPE(W_IQ4_XS)
#define SPARKD_W_IQ4_XS(M) M(iq4_xs, W_IQ4_XS)
#else
#define SPARKD_W_IQ4_XS(M)
#endif
#define SPARKD_FOR_EACH_WTYPE(M) \
    SPARKD_W_F32(M) \
    SPARKD_W_F16(M) \
    SPARKD_W_BF16(M) \
    SPARKD_W_Q4_0(M) \
    SPARKD_W_Q4_1(M) \
    SPARKD_W_Q5_0(M) \
    SPARKD_W_Q5_1(M) \
    SPARKD_W_Q8_0(M) \
    SPARKD_W_Q2_K(M) \
    SPARKD_W_Q3_K(M) \
    SPARKD_W_Q4_K(M) \
    SPARKD_W_Q5_K(M) \
    SPARKD_W_Q6_K(M) \
    SPARKD_W_IQ4_NL(M) \
    SPARKD_W_IQ4_XS(M)
