// cuda_emu.h - a host (CPU) emulation of the CUDA features sparkd's kernels use, so that
// tests on machines without a GPU run the real kernel sources (src/emu.rs drives it).
//
// Each emulated thread is a fiber (ucontext) on the launching OS thread; the blocks of a
// launch run one after another, the threads of a block switch at synchronisation points.
// __syncthreads is a barrier over the block, warp shuffles exchange values through
// per-warp slots between two barrier phases, and threads that return early drop out of
// both barriers, as exited threads do on sm_70+. `__shared__` becomes `static`: one copy
// per kernel, which is right while one block runs at a time. cp.async is a synchronous
// copy, ldmatrix and mma.sync gather their operands from the 32 lanes and follow the
// fragment layouts of the PTX ISA.
//
// This checks indexing, synchronisation structure and arithmetic; it cannot find races
// that depend on real warp scheduling or asynchronous copies, nor measure performance.
#pragma once
// Fibers switch with _setjmp/_longjmp between stacks, which glibc's fortified longjmp
// would take for stack corruption. This header comes first in every translation unit
// that uses it, before any system header reads the macro.
#undef _FORTIFY_SOURCE
#define SPARKD_HOST_EMULATION 1

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <memory>
#include <stdexcept>
#include <vector>

#include <csetjmp>
#include <sys/mman.h>
#include <ucontext.h>

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

// The executing thread's coordinates. Plain globals: the scheduler below runs every
// emulated thread on the one OS thread that called `emu::launch` and sets them before
// it resumes each one (launches never overlap; the stand-in driver holds a lock).
static dim3 threadIdx, blockIdx;
static dim3 blockDim, gridDim;

namespace emu {

// A barrier among cooperating fibers. `expected` shrinks as threads exit (exited
// threads drop out of barriers, as on sm_70+).
struct Barrier {
    int expected = 0;
    int arrived = 0;
    unsigned long long phase = 0;
};

struct Warp {
    Barrier bar;
    alignas(16) unsigned char slot[32][64];
};

struct Block {
    Barrier bar;
    std::vector<Warp> warps;
};

// One emulated thread: its own stack and saved context, and who it is.
struct Fiber {
    ucontext_t start;  // where it begins (makecontext: its own stack)
    std::jmp_buf at;   // where it waits, once started
    bool started = false;
    dim3 idx;
    int lane = 0;
    Warp* warp = nullptr;
    bool done = false;
};

static Block* cur_block = nullptr;
static Warp* cur_warp = nullptr;
static int cur_lane = 0;
static Fiber* cur_fiber = nullptr;
static std::jmp_buf scheduler;
// Bumped by every arrival, release and exit: a scheduler round without it is a
// deadlock (a __syncthreads or warp exchange that some live thread never reaches).
static unsigned long long progress = 0;

// Switches are _setjmp/_longjmp (no signal-mask system call, unlike swapcontext);
// ucontext only gives each fiber its stack at the start.
static void yield() {
    if (_setjmp(cur_fiber->at) == 0) _longjmp(scheduler, 1);
}

static void arrive_and_wait(Barrier& b) {
    ++progress;
    if (++b.arrived == b.expected) {
        b.arrived = 0;
        ++b.phase;
        return;
    }
    const unsigned long long phase = b.phase;
    while (b.phase == phase) yield();
}

static void arrive_and_drop(Barrier& b) {
    ++progress;
    if (--b.expected > 0 && b.arrived == b.expected) {
        b.arrived = 0;
        ++b.phase;
    }
}

// Every lane publishes `mine`; returns after all lanes can read every lane's value.
template <typename T>
static void publish(const T& mine) {
    static_assert(sizeof(T) <= 64, "slot size");
    std::memcpy(cur_warp->slot[cur_lane], &mine, sizeof(T));
    arrive_and_wait(cur_warp->bar);
}
template <typename T>
static T read_slot(int lane) {
    T v;
    std::memcpy(&v, cur_warp->slot[lane], sizeof(T));
    return v;
}
// Ends an exchange: no lane overwrites its slot before all have read.
static void done() { arrive_and_wait(cur_warp->bar); }

template <typename T>
static T shfl(T v, int src) {
    publish(v);
    const T r = read_slot<T>(src & 31);
    done();
    return r;
}

// Stacks for the fibers, kept for the life of the process (launches reuse them), each
// with an inaccessible lowest page so an overflow faults instead of corrupting the
// stack below it.
static constexpr size_t kStackBytes = 256 * 1024;
static unsigned char* stack_of(int i) {
    static std::vector<unsigned char*> stacks;
    while ((int)stacks.size() <= i) {
        void* p = mmap(nullptr, kStackBytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
        if (p == MAP_FAILED) throw std::runtime_error("emulator: no memory for a thread stack");
        mprotect(p, 4096, PROT_NONE);
        stacks.push_back(static_cast<unsigned char*>(p));
    }
    return stacks[i];
}

static void (*fiber_body)(void*) = nullptr;
static void* fiber_arg = nullptr;

static void fiber_main() {
    fiber_body(fiber_arg);
    arrive_and_drop(cur_warp->bar);
    arrive_and_drop(cur_block->bar);
    cur_fiber->done = true;
    _longjmp(scheduler, 1);  // never returns: the fiber's stack is simply left
}

// Runs `body` as a grid of blocks of threads. Blocks run one after another; the
// threads of a block are fibers on this OS thread, switched only where a thread waits
// at a barrier or a warp exchange, so each runs straight through from one
// synchronisation point to the next. (One OS thread per emulated thread made the
// futex traffic of every barrier the emulator's main cost.) Deterministic: it checks
// indexing, synchronisation structure and arithmetic, not races.
template <typename F>
static void launch(dim3 grid, dim3 block, F body) {
    gridDim = grid;
    blockDim = block;
    const int threads = (int)(block.x * block.y * block.z);
    const unsigned long long n_blocks = (unsigned long long)grid.x * grid.y * grid.z;
    fiber_body = [](void* f) { (*static_cast<F*>(f))(); };
    fiber_arg = &body;
    std::vector<Fiber> fibers(threads);
    for (unsigned long long b = 0; b < n_blocks; ++b) {
        Block blk;
        blk.bar.expected = threads;
        blk.warps = std::vector<Warp>((threads + 31) / 32);
        for (size_t w = 0; w < blk.warps.size(); ++w)
            blk.warps[w].bar.expected = std::min(32, threads - 32 * (int)w);
        const dim3 bidx{(unsigned)(b % grid.x), (unsigned)((b / grid.x) % grid.y),
                        (unsigned)(b / ((unsigned long long)grid.x * grid.y))};
        for (int t = 0; t < threads; ++t) {
            Fiber& f = fibers[t];
            f.idx = {t % block.x, (t / block.x) % block.y, t / (block.x * block.y)};
            f.lane = t % 32;
            f.warp = &blk.warps[t / 32];
            f.done = false;
            f.started = false;
            getcontext(&f.start);
            f.start.uc_stack.ss_sp = stack_of(t);
            f.start.uc_stack.ss_size = kStackBytes;
            f.start.uc_link = nullptr;
            makecontext(&f.start, fiber_main, 0);
        }
        cur_block = &blk;
        blockIdx = bidx;
        int live = threads;
        while (live > 0) {
            const unsigned long long before = progress;
            for (Fiber& f : fibers) {
                if (f.done) continue;
                threadIdx = f.idx;
                cur_lane = f.lane;
                cur_warp = f.warp;
                cur_fiber = &f;
                if (_setjmp(scheduler) == 0) {
                    if (f.started) _longjmp(f.at, 1);
                    f.started = true;
                    setcontext(&f.start);
                }
                if (f.done) --live;
            }
            if (live > 0 && progress == before)
                throw std::runtime_error("emulator: deadlock (a barrier or warp exchange that some thread never reaches)");
        }
    }
    cur_fiber = nullptr;
}

}  // namespace emu

static inline void __syncthreads() { emu::arrive_and_wait(emu::cur_block->bar); }
static inline float __shfl_xor_sync(unsigned, float v, int o) { return emu::shfl(v, emu::cur_lane ^ o); }
static inline int __shfl_xor_sync(unsigned, int v, int o) { return emu::shfl(v, emu::cur_lane ^ o); }
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
        const unsigned char* row = (const unsigned char*)emu::read_slot<const void*>(8 * i + emu::cur_lane / 4);
        std::memcpy(&r[i], row + 4 * (emu::cur_lane % 4), 4);
    }
    emu::done();
}

// ldmatrix .x4.trans: the same rows, but lane l receives the 16-bit elements at columns
// l / 4 of rows 2 (l % 4) and 2 (l % 4) + 1 of each matrix (the lower row in the low half).
static inline void ldmatrix_x4_trans(unsigned (&r)[4], const void* p) {
    emu::publish(p);
    const int col = emu::cur_lane / 4, row = 2 * (emu::cur_lane % 4);
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
    const int g = emu::cur_lane / 4, t = emu::cur_lane % 4;
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
