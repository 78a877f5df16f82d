// cuda_emu.h - a host (CPU) emulation of the CUDA features sparkd's kernels use, so that
// tests on machines without a GPU run the real kernel sources (src/emu.rs drives it).
//
// Each emulated thread is an OS thread; the blocks of a launch run one after another,
// the threads of a block concurrently. __syncthreads is a std::barrier over the block,
// warp shuffles exchange values through per-warp slots between two barrier phases, and
// threads that return early drop out of both barriers, as exited threads do on sm_70+.
// `__shared__` becomes `static`: one copy per kernel, which is right while one block
// runs at a time. cp.async is a synchronous copy, ldmatrix and mma.sync gather their
// operands from the 32 lanes and follow the fragment layouts of the PTX ISA.
//
// This checks indexing, synchronisation structure and arithmetic; it cannot find races
// that depend on real warp scheduling or asynchronous copies, nor measure performance.
#pragma once
#define SPARKD_HOST_EMULATION 1

#include <barrier>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <memory>
#include <thread>
#include <vector>

#define __global__
#define __device__
#define __forceinline__ inline
#define __restrict__ __restrict
#define __launch_bounds__(...)
#define __shared__ static
#define __align__(n) __attribute__((aligned(n)))

struct dim3 {
    unsigned x = 1, y = 1, z = 1;
};
struct alignas(16) float4 {
    float x, y, z, w;
};
struct alignas(8) uint2 {
    unsigned x, y;
};
static inline float4 make_float4(float x, float y, float z, float w) { return {x, y, z, w}; }
static inline uint2 make_uint2(unsigned x, unsigned y) { return {x, y}; }

static inline float __uint_as_float(unsigned u) {
    float f;
    std::memcpy(&f, &u, 4);
    return f;
}
static inline float __int_as_float(int i) {
    float f;
    std::memcpy(&f, &i, 4);
    return f;
}
static inline unsigned __float_as_uint(float f) {
    unsigned u;
    std::memcpy(&u, &f, 4);
    return u;
}

// Separately rounded operations: plain ones on the host (x86-64 without -mfma never
// contracts a * b + c).
static inline float __fmul_rn(float a, float b) { return a * b; }
static inline float __fadd_rn(float a, float b) { return a + b; }
static inline float __fsub_rn(float a, float b) { return a - b; }

static thread_local dim3 threadIdx, blockIdx;
static dim3 blockDim, gridDim;

namespace emu {

struct Warp {
    std::barrier<> bar{32};
    alignas(16) unsigned char slot[32][64];
};

struct Block {
    explicit Block(int threads) : bar(threads), warps((threads + 31) / 32) {
        for (auto& w : warps) w = std::make_unique<Warp>();
    }
    std::barrier<> bar;
    std::vector<std::unique_ptr<Warp>> warps;
};

static thread_local Block* tl_block = nullptr;
static thread_local Warp* tl_warp = nullptr;
static thread_local int tl_lane = 0;

// Every lane publishes `mine`; returns after all lanes can read every lane's value.
template <typename T>
static void publish(const T& mine) {
    static_assert(sizeof(T) <= 64, "slot size");
    std::memcpy(tl_warp->slot[tl_lane], &mine, sizeof(T));
    tl_warp->bar.arrive_and_wait();
}
template <typename T>
static T read_slot(int lane) {
    T v;
    std::memcpy(&v, tl_warp->slot[lane], sizeof(T));
    return v;
}
// Ends an exchange: no lane overwrites its slot before all have read.
static void done() { tl_warp->bar.arrive_and_wait(); }

template <typename T>
static T shfl(T v, int src) {
    publish(v);
    const T r = read_slot<T>(src & 31);
    done();
    return r;
}

// Runs `body` as a grid of blocks of threads. The threads are created once per launch
// and reused for every block (blocks still run one after another): creating them per
// block made thread start-up the emulator's main cost. Each block gets fresh barriers,
// since a thread that returns early leaves its block's barriers for good.
template <typename F>
static void launch(dim3 grid, dim3 block, F body) {
    gridDim = grid;
    blockDim = block;
    const int threads = (int)(block.x * block.y * block.z);
    const unsigned long long n_blocks = (unsigned long long)grid.x * grid.y * grid.z;
    std::unique_ptr<Block> cur;
    // Between blocks: the next block's barriers exist before any thread starts it, and
    // every thread is done with a block before its barriers are replaced.
    std::barrier<> gate(threads);
    std::vector<std::thread> ts;
    ts.reserve(threads);
    for (int t = 0; t < threads; ++t) {
        ts.emplace_back([&, t] {
            threadIdx = {t % block.x, (t / block.x) % block.y, t / (block.x * block.y)};
            tl_lane = t % 32;
            for (unsigned long long b = 0; b < n_blocks; ++b) {
                if (t == 0) cur = std::make_unique<Block>(threads);
                gate.arrive_and_wait();
                blockIdx = {(unsigned)(b % grid.x), (unsigned)((b / grid.x) % grid.y),
                            (unsigned)(b / ((unsigned long long)grid.x * grid.y))};
                tl_block = cur.get();
                tl_warp = cur->warps[t / 32].get();
                body();
                tl_warp->bar.arrive_and_drop();
                tl_block->bar.arrive_and_drop();
                gate.arrive_and_wait();
            }
        });
    }
    for (auto& th : ts) th.join();
}

}  // namespace emu

static inline void __syncthreads() { emu::tl_block->bar.arrive_and_wait(); }
static inline float __shfl_xor_sync(unsigned, float v, int o) { return emu::shfl(v, emu::tl_lane ^ o); }
static inline int __shfl_xor_sync(unsigned, int v, int o) { return emu::shfl(v, emu::tl_lane ^ o); }
static inline float __shfl_sync(unsigned, float v, int src) { return emu::shfl(v, src); }

// The kernels' typedefs come from common.cuh, included after this header.
static inline void cp_async16(void* dst, const void* src, unsigned src_bytes) {
    std::memset(dst, 0, 16);
    if (src_bytes) std::memcpy(dst, src, src_bytes < 16 ? src_bytes : 16);
}
static inline void cp_async_commit() {}
template <int N>
static inline void cp_async_wait() {}

// ldmatrix .x4: lanes 8i..8i+7 give the row addresses of matrix i; lane l receives, from
// each matrix i, the 32-bit word l % 4 of row l / 4.
static inline void ldmatrix_x4(unsigned (&r)[4], const void* p) {
    emu::publish(p);
    for (int i = 0; i < 4; ++i) {
        const unsigned char* row = (const unsigned char*)emu::read_slot<const void*>(8 * i + emu::tl_lane / 4);
        std::memcpy(&r[i], row + 4 * (emu::tl_lane % 4), 4);
    }
    emu::done();
}

// ldmatrix .x4.trans: the same rows, but lane l receives the 16-bit elements at columns
// l / 4 of rows 2 (l % 4) and 2 (l % 4) + 1 of each matrix (the lower row in the low half).
static inline void ldmatrix_x4_trans(unsigned (&r)[4], const void* p) {
    emu::publish(p);
    const int col = emu::tl_lane / 4, row = 2 * (emu::tl_lane % 4);
    for (int i = 0; i < 4; ++i) {
        unsigned short lo, hi;
        std::memcpy(&lo, (const unsigned char*)emu::read_slot<const void*>(8 * i + row) + 2 * col, 2);
        std::memcpy(&hi, (const unsigned char*)emu::read_slot<const void*>(8 * i + row + 1) + 2 * col, 2);
        r[i] = (unsigned)lo | ((unsigned)hi << 16);
    }
    emu::done();
}

namespace emu {
static inline float half_bits_to_f32(unsigned short h, bool bf16) {
    if (bf16) return __uint_as_float((unsigned)h << 16);
    _Float16 x;
    std::memcpy(&x, &h, 2);
    return (float)x;
}
struct MmaIn {
    unsigned a[4], b[2];
};
}  // namespace emu

// mma.sync m16n8k16 row.col, f32 accumulate. With g = lane / 4, t = lane % 4 (PTX ISA):
// A regs: (g, 2t..2t+1), (g+8, 2t..), (g, 2t+8..), (g+8, 2t+8..); B regs: (k 2t..2t+1, n g),
// (k 2t+8.., n g); C/D: (g, 2t..2t+1) then (g+8, 2t..2t+1). Low half = lower k / column.
template <bool BF16>
static inline void mma_16816(float (&d)[4], const unsigned (&a)[4], unsigned b0, unsigned b1) {
    emu::MmaIn mine{{a[0], a[1], a[2], a[3]}, {b0, b1}};
    emu::publish(mine);
    auto a_at = [](int r, int k) {
        const int lane = (r % 8) * 4 + (k % 8) / 2, reg = (r >= 8) + 2 * (k >= 8);
        const unsigned w = emu::read_slot<emu::MmaIn>(lane).a[reg];
        return emu::half_bits_to_f32((unsigned short)(k % 2 ? w >> 16 : w & 0xFFFF), BF16);
    };
    auto b_at = [](int k, int n) {
        const int lane = n * 4 + (k % 8) / 2, reg = k >= 8;
        const unsigned w = emu::read_slot<emu::MmaIn>(lane).b[reg];
        return emu::half_bits_to_f32((unsigned short)(k % 2 ? w >> 16 : w & 0xFFFF), BF16);
    };
    const int g = emu::tl_lane / 4, t = emu::tl_lane % 4;
    float out[4];
    for (int e = 0; e < 4; ++e) {
        const int row = g + 8 * (e >> 1), col = 2 * t + (e & 1);
        float s = d[e];
        for (int k = 0; k < 16; ++k) s += a_at(row, k) * b_at(k, col);
        out[e] = s;
    }
    emu::done();
    for (int e = 0; e < 4; ++e) d[e] = out[e];
}
