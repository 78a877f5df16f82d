// common.cuh - helpers shared by every sparkd kernel source.
//
// The sources include no CUDA header at all: f16/bf16 conversions are inline PTX and
// everything else is an NVRTC built-in, so NVRTC compiles them with no include path
// (a bare driver + libnvrtc is enough on the target machine).
//
// Conventions for every kernel in this folder:
// - Entry points are `extern "C" __global__`; their signature, grid and block shape are
//   documented at the top of the file that defines them.
// - Pointers are device pointers; "f32" buffers are row-major float arrays, "u16" buffers
//   hold IEEE half (f16) or bfloat16 bits, weight buffers hold raw GGUF/ggml blocks.
// - Sizes are `int` (elements, not bytes) unless named `*_bytes`; offsets computed from
//   them are widened to 64 bits before multiplying.
// - The constants below are mirrored by the Rust crate (`sparkd_kernels::consts`), and a
//   test checks the two agree.
// - With SPARKD_HOST_EMULATION defined (kernels/emu/cuda_emu.h), the inline-PTX helpers
//   are replaced by host twins so the same sources run on the CPU in tests.
#pragma once

typedef unsigned char u8;
typedef signed char i8;
typedef unsigned short u16;
typedef short i16;
typedef unsigned int u32;
typedef int i32;
typedef unsigned long long u64;
typedef long long i64;

// Positions per paged KV block (daemon/src/model/kv.rs BLOCK_TOKENS).
#define SPARKD_KV_BLOCK_TOKENS 16
// Largest batch the decode matrix-vector kernels keep in registers.
#define SPARKD_MMV_MAX_BATCH 16
// Warps per block (splitting K) and weight rows per block of the mat-vec kernels.
#define SPARKD_MMV_WARPS 8
#define SPARKD_MMV_ROWS 4
// Warps per block (splitting K) and weight rows per block of the tensor-core mat-mul.
#define SPARKD_MMQ_WARPS 8
#define SPARKD_MMQ_ROWS 16
// Positions one block of the split-K decode attention covers.
#define SPARKD_ATTN_PARTITION 256
// Query heads per kv head, and head size, the attention kernels support.
#define SPARKD_MAX_GQA_GROUP 16
#define SPARKD_MAX_HEAD_DIM 256

#define SPARKD_FULL_MASK 0xffffffffu

// ---------------------------------------------------------------------------------------
// Number formats

#ifdef SPARKD_HOST_EMULATION
// Host twins for kernels/emu (tests without a GPU): same rounding (to nearest even).
static inline float f16_to_f32(u16 h) {
    _Float16 x;
    __builtin_memcpy(&x, &h, 2);
    return (float)x;
}
static inline u16 f32_to_f16(float f) {
    const _Float16 x = (_Float16)f;
    u16 h;
    __builtin_memcpy(&h, &x, 2);
    return h;
}
static inline float bf16_to_f32(u16 h) { return __uint_as_float(((u32)h) << 16); }
static inline u16 f32_to_bf16(float f) {
    const u32 u = __float_as_uint(f);
    if ((u & 0x7fffffffu) > 0x7f800000u) return (u16)((u >> 16) | 0x40);  // quiet NaN
    return (u16)((u + 0x7fffu + ((u >> 16) & 1)) >> 16);
}
#else
static __device__ __forceinline__ float f16_to_f32(u16 h) {
    float f;
    asm("cvt.f32.f16 %0, %1;" : "=f"(f) : "h"(h));
    return f;
}

static __device__ __forceinline__ u16 f32_to_f16(float f) {
    u16 h;
    asm("cvt.rn.f16.f32 %0, %1;" : "=h"(h) : "f"(f));
    return h;
}

static __device__ __forceinline__ float bf16_to_f32(u16 h) {
    return __uint_as_float(((u32)h) << 16);
}

static __device__ __forceinline__ u16 f32_to_bf16(float f) {
    u16 h;
    asm("cvt.rn.bf16.f32 %0, %1;" : "=h"(h) : "f"(f));
    return h;
}
#endif

// An activation rounded to f16 for a tensor-core operand or the KV cache, saturating:
// a value past f16's range (65504) becomes the largest finite f16 of its sign rather
// than inf, which a later product or softmax would turn into NaN for the whole row.
// NaN stays NaN (the comparison is false), so a real fault still shows.
static __device__ __forceinline__ u16 f32_to_f16_sat(float f) {
    const float max_f16 = 65504.0f;
    return f32_to_f16(fabsf(f) > max_f16 ? copysignf(max_f16, f) : f);
}

// Two floats rounded to f16 and packed as a tensor-core operand register (the lower
// k index, or column, in the low half).
static __device__ __forceinline__ u32 pack_f16x2(float lo, float hi) {
    return (u32)f32_to_f16(lo) | ((u32)f32_to_f16(hi) << 16);
}

// A quiet NaN, written where a host-side bug (an out-of-range token) would otherwise
// make a kernel read out of bounds: it shows up in any parity check instead of hiding.
static __device__ __forceinline__ float quiet_nan() {
    return __int_as_float(0x7fc00000);
}

// KV cache elements are f32 or f16; attention and the KV writer are templates over both.
static __device__ __forceinline__ float kv_load(const float* p) { return *p; }
static __device__ __forceinline__ float kv_load(const u16* p) { return f16_to_f32(*p); }
// An f32 result stored as f32, or rounded to f16, saturating (a KV cache entry, or an
// activation for the tensor-core kernels).
static __device__ __forceinline__ void store_as(float* p, float v) { *p = v; }
static __device__ __forceinline__ void store_as(u16* p, float v) { *p = f32_to_f16_sat(v); }

// SwiGLU's product silu(gate) * up, silu(g) = g / (1 + exp(-g)): the CPU's expression
// (daemon/src/model/ops.rs silu_mul), so the rounding matches.
static __device__ __forceinline__ float silu_mul(float gate, float up) {
    return gate / (1.0f + expf(-gate)) * up;
}

// The epilogue of every weight product (mat-vec, tensor-core mat-mul, GEMM): `sum` plus
// the output feature's bias when there is one, stored at `dst` or, for the fused
// residual add, added to what is there.
static __device__ __forceinline__ void store_output(float* dst, float sum, const float* bias,
                                                    int feature, int accumulate) {
    const float out = sum + (bias ? bias[feature] : 0.0f);
    *dst = accumulate ? *dst + out : out;
}

// ---------------------------------------------------------------------------------------
// Reductions

static __device__ __forceinline__ float warp_sum(float v) {
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(SPARKD_FULL_MASK, v, o);
    return v;
}

// Sums each of the V values of `v` (V a power of two) over the warp's 32 lanes with
// about V shuffles in all, where V warp_sums take 5V: at each halving step a lane keeps
// one half of its values, sends the other half to its partner and adds what it gets.
// Afterwards lane l holds max(V / 32, 1) totals: v[j] is the total of value index
// warp_split_index<V>(l, j). With V < 32, the 32 / V lanes l, l + 1, ... (l a multiple
// of 32 / V) hold the same total.
template <int V, int S = 0>
static __device__ __forceinline__ void warp_sum_split(float (&v)[V]) {
    static_assert(V > 0 && (V & (V - 1)) == 0, "a power of two");
    // Step S pairs lanes 16 >> S apart; c: the values each lane still holds. The steps
    // are a template recursion so that every register index is a constant.
    constexpr int o = 16 >> S, c = V >> S;
    const int lane = threadIdx.x & 31;
    if constexpr (c >= 2) {
        const bool upper = (lane & o) != 0;
#pragma unroll
        for (int i = 0; i < c / 2; ++i) {
            const float send = upper ? v[i] : v[i + c / 2];
            const float keep = upper ? v[i + c / 2] : v[i];
            v[i] = keep + __shfl_xor_sync(SPARKD_FULL_MASK, send, o);
        }
    } else {
        v[0] += __shfl_xor_sync(SPARKD_FULL_MASK, v[0], o);
    }
    if constexpr (S < 4) warp_sum_split<V, S + 1>(v);
}

// The value index whose total warp_sum_split<V> left in v[j] of lane `lane`.
template <int V>
static __device__ __forceinline__ int warp_split_index(int lane, int j) {
    int index = j;
#pragma unroll
    for (int s = 0; s < 5; ++s) {
        const int c = V >> s;
        if (c >= 2 && (lane & (16 >> s)) != 0) index += c / 2;
    }
    return index;
}

// warp_sum_split<V> of `v`, each total stored once at dst[its value index] (a row of V
// floats, in shared memory for a cross-warp reduction after a barrier).
template <int V>
static __device__ __forceinline__ void warp_sums_to_shared(float (&v)[V], float* dst) {
    warp_sum_split(v);
    const int lane = threadIdx.x & 31;
    constexpr int HELD = V >= 32 ? V / 32 : 1;
    if (V >= 32 || lane % (32 / V) == 0) {
#pragma unroll
        for (int j = 0; j < HELD; ++j) dst[warp_split_index<V>(lane, j)] = v[j];
    }
}

static __device__ __forceinline__ float warp_max(float v) {
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(SPARKD_FULL_MASK, v, o));
    return v;
}

// Sum over the whole block; every thread gets the result. blockDim.x must be a multiple
// of 32 (at most 1024) and every thread must call it. `scratch` is 32 floats of shared
// memory; the leading barrier lets callers reuse it across calls.
static __device__ float block_sum(float v, float* scratch) {
    const int lane = threadIdx.x & 31;
    const int warp = threadIdx.x >> 5;
    const int n_warps = blockDim.x >> 5;
    v = warp_sum(v);
    __syncthreads();
    if (lane == 0) scratch[warp] = v;
    __syncthreads();
    v = lane < n_warps ? scratch[lane] : 0.0f;
    return warp_sum(v);
}

// ---------------------------------------------------------------------------------------
// Programmatic dependent launch (sm_90+)
//
// The host launches each kernel of a step with the programmatic-stream-serialization
// attribute, so the GPU may start it while the kernel before it in the stream is still
// running (a decode step is ~200 small launches; without this each pays the gap
// between one grid draining and the next being scheduled). That is safe only because
// every entry point calls pdl_enter() before it touches any memory the kernels before
// it write or read: griddepcontrol.wait returns once the grids it depends on have
// completed and their writes are visible (at once when nothing launched it early), and
// a grid that has passed it lets the next one be launched. Before the wait a kernel may
// read only the weights, which nothing writes while a model is loaded: the decode
// products prefetch their rows into L2 there (prefetch_weights_l2), overlapping the
// next matrix's first DRAM reads with the end of the kernel before it.
// kernels/tests/nvrtc_compile.rs checks, in every compiled kernel's PTX, that the wait
// comes before the first load or store. Below sm_90 both are no-ops and the host
// launches without the attribute.
static __device__ __forceinline__ void pdl_enter() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    asm volatile("griddepcontrol.wait;\n" ::: "memory");
    asm volatile("griddepcontrol.launch_dependents;\n" ::: "memory");
#endif
}

// Asks L2 for the `bytes` of weights at `p`, one 128-byte line per thread in turn: a
// hint that loads nothing into registers and faults on nothing. Only for memory that no
// kernel writes (see pdl_enter). Lines are counted from `p` rounded down to 128 bytes,
// which stays inside `p`'s allocation (device buffers start 256-byte aligned).
static __device__ __forceinline__ void prefetch_weights_l2(const void* p, u64 bytes) {
    const u64 start = (u64)p & ~(u64)127;
    const u64 end = (u64)p + bytes;
    for (u64 a = start + (u64)threadIdx.x * 128; a < end; a += (u64)blockDim.x * 128) {
#ifdef SPARKD_HOST_EMULATION
        emu_prefetch((const void*)a);
#else
        asm volatile("prefetch.global.L2 [%0];\n" ::"l"(a));
#endif
    }
}

// ---------------------------------------------------------------------------------------
// Inline PTX for the tensor-core kernels (sm_80+: cp.async, ldmatrix, mma.sync)

#ifdef SPARKD_HOST_EMULATION
// kernels/emu/cuda_emu.h provides cp_async16, cp_async_commit, cp_async_wait,
// ldmatrix_x4, ldmatrix_x4_trans and mma_16816 with the PTX semantics.
#else
// The shared-memory address of a generic pointer to shared memory.
static __device__ __forceinline__ u32 smem_addr(const void* p) {
    u32 a;
    asm("{ .reg .u64 t; cvta.to.shared.u64 t, %1; cvt.u32.u64 %0, t; }" : "=r"(a) : "l"(p));
    return a;
}

// Copies 16 bytes global -> shared asynchronously; `src_bytes` < 16 zero-fills the rest
// (0 writes zeros without reading `src`, which must still be a valid address).
static __device__ __forceinline__ void cp_async16(void* dst, const void* src, u32 src_bytes) {
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n"
                 :
                 : "r"(smem_addr(dst)), "l"(src), "r"(src_bytes)
                 : "memory");
}

static __device__ __forceinline__ void cp_async_commit() {
    asm volatile("cp.async.commit_group;\n" ::: "memory");
}

// Waits until at most `N` committed groups are still in flight.
template <int N>
static __device__ __forceinline__ void cp_async_wait() {
    asm volatile("cp.async.wait_group %0;\n" ::"n"(N) : "memory");
}

// Four 8x8 b16 matrices from shared memory; lane i gives the row address for matrix i/8.
static __device__ __forceinline__ void ldmatrix_x4(u32 (&r)[4], const void* p) {
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"(smem_addr(p)));
}

// The same, each matrix transposed: lane l receives elements (2 (l % 4), l / 4) and
// (2 (l % 4) + 1, l / 4) of matrix i (row, column), i.e. rows given by the lanes become
// the k index of an mma B operand.
static __device__ __forceinline__ void ldmatrix_x4_trans(u32 (&r)[4], const void* p) {
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0, %1, %2, %3}, [%4];\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"(smem_addr(p)));
}

// d += a * b on a 16x8x16 tile, f32 accumulate; inputs f16 (BF16 = false) or bf16.
template <bool BF16>
static __device__ __forceinline__ void mma_16816(float (&d)[4], const u32 (&a)[4], u32 b0, u32 b1) {
    if constexpr (BF16) {
        asm volatile(
            "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 "
            "{%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, {%0, %1, %2, %3};\n"
            : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
            : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
    } else {
        asm volatile(
            "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 "
            "{%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, {%0, %1, %2, %3};\n"
            : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
            : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
    }
}
#endif  // SPARKD_HOST_EMULATION
