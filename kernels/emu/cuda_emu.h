// cuda_emu.h - a host (CPU) emulation of the CUDA features sparkd's kernels use, so that
// tests on machines without a GPU run the real kernel sources (src/emu.rs drives it).
//
// Each emulated thread is a fiber (ucontext) on the launching OS thread; the blocks of a
// launch run one after another, the threads of a block switch at synchronisation points.
// __syncthreads is a barrier over the block, warp shuffles exchange values through
// per-warp slots between two barrier phases, and threads that return early drop out of
// both barriers, as exited threads do on sm_70+. `__shared__` becomes `static`: one copy
// per kernel, which is right while one block runs at a time. ldmatrix and mma.sync
// gather their operands from the 32 lanes and follow the fragment layouts of the PTX ISA.
//
// Always checked, in every build: a cp.async lands only when the cp.async.wait_group
// that covers it runs, so a tile read before its wait holds stale data and fails the
// test, as it can on a GPU; every live lane of a warp must join each warp exchange at
// the same call site with the same mask that names it (divergent *_sync calls are
// undefined on a GPU); a shuffle must read a lane that takes part; ldmatrix and mma
// need the whole warp; cp.async and ldmatrix addresses must be 16-byte aligned. A
// breach ends the launch with the thread, the call sites and the masks.
//
// Built with -fsanitize=thread (src/emu.rs does, for SPARKD_EMU_CHECK=races), it is also
// a shared-memory race checker: every emulated thread is a ThreadSanitizer fiber, fiber
// switches carry no ordering, and only what orders memory on the GPU does: a
// __syncthreads (per phase), and the end of a block before the next one starts. Two
// threads of a block touching the same bytes, one of them writing, with no barrier
// between, is reported, with both stacks; warp shuffles and mma exchange values, never
// order memory, so warp-synchronous shared-memory code without a barrier is a race too,
// as it is on sm_70+. Blocks run one after another, last to first under the checker and
// first to last otherwise, so a result that depends on the order of blocks fails one of
// the two runs; races between blocks are otherwise out of its reach.
//
// Otherwise this checks indexing, synchronisation structure and arithmetic, and cannot
// measure performance.
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
#include <source_location>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

#include <csetjmp>
#include <sys/mman.h>
#include <ucontext.h>

#if defined(__SANITIZE_THREAD__)
#define SPARKD_EMU_RACECHECK 1
#include <sanitizer/tsan_interface.h>
// The emulator's own bookkeeping (barrier counters, exchange slots, the scheduler's
// globals) is shared by every fiber without ordering by design; its functions are not
// instrumented, and not inlined into the kernels, which are.
#define EMU_UNCHECKED __attribute__((no_sanitize_thread, noinline))
// In the runtime, not in every compiler's copy of tsan_interface.h.
extern "C" void __tsan_read_range(void* addr, unsigned long size);
extern "C" void __tsan_write_range(void* addr, unsigned long size);
extern "C" void __tsan_ignore_thread_begin();
#else
#define SPARKD_EMU_RACECHECK 0
#define EMU_UNCHECKED
#endif
// Built with -fsanitize=address,alignment (SPARKD_EMU_CHECK=memory) it is a memory
// checker: a kernel reading or writing past a buffer it was given (the job runner
// allocates each one to its exact size) or past a `__shared__` array, or loading a type
// from an address not aligned for it, is reported with its stack.
#if defined(__SANITIZE_ADDRESS__)
#define SPARKD_EMU_MEMCHECK 1
#else
#define SPARKD_EMU_MEMCHECK 0
#endif
// Both sanitizers follow swapcontext between stacks, not _setjmp/_longjmp.
#define SPARKD_EMU_SWAPCONTEXT (SPARKD_EMU_RACECHECK || SPARKD_EMU_MEMCHECK)

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

// Byte n of the result is byte s<4n+2:4n> of the eight bytes {y, x} (x's low byte is
// byte 0): CUDA's documented __byte_perm, which reads three bits of each selector nibble.
// (PTX's prmt would take the fourth for sign replication; kernels keep it clear.)
static inline unsigned __byte_perm(unsigned x, unsigned y, unsigned s) {
    const unsigned long long in = (unsigned long long)y << 32 | x;
    unsigned r = 0;
    for (int n = 0; n < 4; ++n) r |= (unsigned)((in >> (8 * ((s >> (4 * n)) & 7))) & 0xFF) << (8 * n);
    return r;
}

// The executing thread's coordinates. Plain globals: the scheduler below runs every
// emulated thread on the one OS thread that called `emu::launch` and sets them before
// it resumes each one (launches never overlap; the stand-in driver holds a lock).
static dim3 threadIdx, blockIdx;
static dim3 blockDim, gridDim;

namespace emu {

// A barrier among cooperating fibers. `expected` shrinks as threads exit (exited
// threads drop out of barriers, as on sm_70+). `orders_memory`: __syncthreads does, a
// warp's value exchange does not; under the race checker each phase of an ordering
// barrier has a sync object that arrivals release to and departures acquire from
// (two alternate: nobody releases to phase p + 2 before everyone has left phase p).
struct Barrier {
    int expected = 0;
    int arrived = 0;
    unsigned long long phase = 0;
    bool orders_memory = false;
    char sync[2] = {};
};

// Where a lane joined a warp exchange: all the warp's live lanes must join the same
// one (the same call site and mask), as the *_sync intrinsics and the .aligned
// ldmatrix and mma require.
struct Site {
    const char* file = "";
    unsigned line = 0;
    unsigned mask = 0;
    bool whole_warp = false;  // ldmatrix and mma: every lane of the warp, none exited
    bool operator==(const Site& o) const {
        return line == o.line && mask == o.mask && (file == o.file || std::strcmp(file, o.file) == 0);
    }
};

struct Warp {
    Barrier bar;
    alignas(16) unsigned char slot[32][64];
    Site site[32];
    bool live[32] = {};  // lanes that exist and have not exited
};

struct Block {
    Barrier bar;
    std::vector<Warp> warps;
};

// A cp.async in flight: done when a cp.async.wait_group covers its group.
struct AsyncCopy {
    void* dst;
    const void* src;
    unsigned src_bytes;
};

// One emulated thread: its own stack and saved context, and who it is.
struct Fiber {
    ucontext_t start;  // where it begins (makecontext: its own stack)
#if SPARKD_EMU_SWAPCONTEXT
    ucontext_t at;         // where it waits, once started (swapcontext: sanitizers follow it)
    void* tsan = nullptr;  // its ThreadSanitizer fiber, one per stack, kept
#else
    std::jmp_buf at;  // where it waits, once started
#endif
    bool started = false;
    dim3 idx;
    int lane = 0;
    Warp* warp = nullptr;
    bool done = false;
    std::vector<AsyncCopy> copies;   // issued, not yet complete, oldest first
    std::vector<size_t> group_ends;  // committed groups: their ends in `copies`
};

static Block* cur_block = nullptr;
static Warp* cur_warp = nullptr;
static int cur_lane = 0;
static Fiber* cur_fiber = nullptr;
// Bumped by every arrival, release and exit: a scheduler round without it is a
// deadlock (a __syncthreads or warp exchange that some live thread never reaches).
static unsigned long long progress = 0;
// A misuse found on a fiber, which leaves its stack at once; the scheduler throws it.
// (A pointer that only uninstrumented code touches; the text is ordered by a release.)
static std::string* fault = nullptr;

#if SPARKD_EMU_SWAPCONTEXT
// Under a sanitizer switches are swapcontext, which both follow (ThreadSanitizer tracks
// _setjmp/_longjmp per thread and would reject a jump between fibers; AddressSanitizer
// resets a stack's shadow when a context starts on it). Under the race checker each
// is preceded by a switch of TSan's fiber that implies no ordering.
static ucontext_t scheduler;
static void* scheduler_tsan = nullptr;
EMU_UNCHECKED static void tsan_switch([[maybe_unused]] void* to) {
#if SPARKD_EMU_RACECHECK
    __tsan_switch_to_fiber(to, __tsan_switch_to_fiber_no_sync);
#endif
}
EMU_UNCHECKED static void resume(Fiber& f) {
    const bool first = !f.started;
    f.started = true;
    tsan_switch(f.tsan);
    swapcontext(&scheduler, first ? &f.start : &f.at);
}
EMU_UNCHECKED static void yield() {
    tsan_switch(scheduler_tsan);
    swapcontext(&cur_fiber->at, &scheduler);
}
[[noreturn]] EMU_UNCHECKED static void leave() {
    tsan_switch(scheduler_tsan);
    setcontext(&scheduler);
    __builtin_unreachable();
}
#else
// Switches are _setjmp/_longjmp (no signal-mask system call, unlike swapcontext);
// ucontext only gives each fiber its stack at the start.
static std::jmp_buf scheduler;
static void resume(Fiber& f) {
    if (_setjmp(scheduler) != 0) return;
    if (f.started) _longjmp(f.at, 1);
    f.started = true;
    setcontext(&f.start);
}
static void yield() {
    if (_setjmp(cur_fiber->at) == 0) _longjmp(scheduler, 1);
}
[[noreturn]] static void leave() { _longjmp(scheduler, 1); }
#endif

#if SPARKD_EMU_RACECHECK
static void release(void* sync) { __tsan_release(sync); }
static void acquire(void* sync) { __tsan_acquire(sync); }
// Accesses made by uninstrumented code on a kernel's behalf.
static void reads(const void* p, size_t n) { __tsan_read_range((void*)p, n); }
static void writes(void* p, size_t n) { __tsan_write_range(p, n); }
// A launch abandoned on an error leaves its other threads mid-kernel, unordered with
// the host's clean-up; the error is the report, so the host's accesses go unchecked.
static void abandon_launch() { __tsan_ignore_thread_begin(); }
#else
static void release(void*) {}
static void acquire(void*) {}
static void reads(const void*, size_t) {}
static void writes(void*, size_t) {}
static void abandon_launch() {}
#endif

EMU_UNCHECKED static void arrive_and_wait(Barrier& b) {
    ++progress;
    const unsigned long long phase = b.phase;
    if (b.orders_memory) release(&b.sync[phase & 1]);
    if (++b.arrived == b.expected) {
        b.arrived = 0;
        ++b.phase;
    } else {
        while (b.phase == phase) yield();
    }
    if (b.orders_memory) acquire(&b.sync[phase & 1]);
}

// An exiting thread leaves the barrier; what it wrote is ordered before the phase it
// leaves, as if it had arrived.
EMU_UNCHECKED static void arrive_and_drop(Barrier& b) {
    ++progress;
    if (b.orders_memory) release(&b.sync[b.phase & 1]);
    if (--b.expected > 0 && b.arrived == b.expected) {
        b.arrived = 0;
        ++b.phase;
    }
}

// Ends the launch with `what` (from a fiber).
[[noreturn]] EMU_UNCHECKED static void fail(const std::string& what) {
    fault = new std::string("emulator: block (" + std::to_string(blockIdx.x) + "," + std::to_string(blockIdx.y) + "," +
            std::to_string(blockIdx.z) + ") thread (" + std::to_string(threadIdx.x) + "," +
            std::to_string(threadIdx.y) + "," + std::to_string(threadIdx.z) + "): " + what);
    release(&fault);  // for the scheduler, which reads it next
    leave();
}

static std::string describe(const Site& s) {
    char mask[16];
    std::snprintf(mask, sizeof mask, "%#x", s.mask);
    return std::string(s.file) + ":" + std::to_string(s.line) + " (mask " + mask + ")";
}

// Every lane publishes `mine`; returns after all lanes can read every lane's value,
// having checked that the warp's live lanes all joined this exchange, at one call
// site with one mask that names them. (__builtin_memcpy of a constant size compiles
// to moves: the race checker's interception of the library memcpy would see the slots.)
template <typename T>
EMU_UNCHECKED static void publish(const T& mine, const Site& at) {
    static_assert(sizeof(T) <= 64, "slot size");
    Warp& w = *cur_warp;
    __builtin_memcpy(w.slot[cur_lane], &mine, sizeof(T));
    w.site[cur_lane] = at;
    arrive_and_wait(w.bar);
    // Each live lane against the first: all at one site. (`expected` counts live lanes.)
    int first = 0;
    while (!w.live[first]) ++first;
    if (!(w.site[first] == at))
        fail("lanes of one warp met at different warp exchanges: lane " + std::to_string(cur_lane) + " at " +
             describe(at) + ", lane " + std::to_string(first) + " at " + describe(w.site[first]));
    if (!((at.mask >> cur_lane) & 1))
        fail("lane " + std::to_string(cur_lane) + " joined the exchange at " + describe(at) + " outside its mask");
    if (at.whole_warp && w.bar.expected != 32) {
        int gone = 0;
        while (w.live[gone]) ++gone;
        fail("a warp-wide matrix instruction at " + describe(at) + " without lane " + std::to_string(gone) +
             " (exited or absent)");
    }
}
template <typename T>
EMU_UNCHECKED static T read_slot(int lane) {
    T v;
    __builtin_memcpy(&v, cur_warp->slot[lane], sizeof(T));
    return v;
}

// Ends an exchange: no lane overwrites its slot before all have read.
EMU_UNCHECKED static void done() { arrive_and_wait(cur_warp->bar); }

// cp.async: the copy lands when a wait covers it, not when it is issued; the issuing
// thread makes both accesses then.
EMU_UNCHECKED static void complete(const AsyncCopy& c) {
    const unsigned n = c.src_bytes < 16 ? c.src_bytes : 16;
    unsigned char bytes[16] = {};
    reads(c.src, n);
    for (unsigned i = 0; i < n; ++i) bytes[i] = static_cast<const unsigned char*>(c.src)[i];
    writes(c.dst, 16);
    __builtin_memcpy(c.dst, bytes, 16);
}
EMU_UNCHECKED static void issue_copy(void* dst, const void* src, unsigned src_bytes) {
    if ((uintptr_t)dst % 16 != 0 || (uintptr_t)src % 16 != 0)
        fail("cp.async of 16 bytes with a source or destination not 16-byte aligned");
    cur_fiber->copies.push_back({dst, src, src_bytes});
}
EMU_UNCHECKED static void commit_copies() { cur_fiber->group_ends.push_back(cur_fiber->copies.size()); }
// Completes every committed group but the newest `pending` ones, in order.
EMU_UNCHECKED static void wait_copies(size_t pending) {
    Fiber& f = *cur_fiber;
    if (f.group_ends.size() <= pending) return;
    const size_t groups = f.group_ends.size() - pending, end = f.group_ends[groups - 1];
    for (size_t i = 0; i < end; ++i) complete(f.copies[i]);
    f.copies.erase(f.copies.begin(), f.copies.begin() + (std::ptrdiff_t)end);
    f.group_ends.erase(f.group_ends.begin(), f.group_ends.begin() + (std::ptrdiff_t)groups);
    for (size_t& e : f.group_ends) e -= end;
}

// A shuffle may read only a lane that takes part: one that has exited or is outside
// the mask gives an undefined value on a GPU.
template <typename T>
static T shfl(T v, int src, const Site& at) {
    publish(v, at);
    src &= 31;
    if (!cur_warp->live[src] || !((at.mask >> src) & 1))
        fail("a shuffle at " + describe(at) + " reads lane " + std::to_string(src) +
             ", which does not take part (exited, absent or outside the mask)");
    const T r = read_slot<T>(src);
    done();
    return r;
}

static Site site(const std::source_location& at, unsigned mask, bool whole_warp = false) {
    return {at.file_name(), at.line(), mask, whole_warp};
}

// Stacks for the fibers, kept for the life of the process (launches reuse them), each
// with an inaccessible lowest page so an overflow faults instead of corrupting the
// stack below it.
static constexpr size_t kStackBytes = 256 * 1024;
// Under the race checker each stack also has its ThreadSanitizer fiber, so one stack's
// frames are always one TSan thread's.
struct Stack {
    unsigned char* base;
    void* tsan;
};
static Stack stack_of(int i) {
    static std::vector<Stack> stacks;
    while ((int)stacks.size() <= i) {
        void* p = mmap(nullptr, kStackBytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
        if (p == MAP_FAILED) throw std::runtime_error("emulator: no memory for a thread stack");
        mprotect(p, 4096, PROT_NONE);
#if SPARKD_EMU_RACECHECK
        void* tsan = __tsan_create_fiber(0);
#else
        void* tsan = nullptr;
#endif
        stacks.push_back({static_cast<unsigned char*>(p), tsan});
    }
    return stacks[i];
}

static void (*fiber_body)(void*) = nullptr;
static void* fiber_arg = nullptr;

// Orders each block after the ones before it (the static `__shared__` arrays and the
// stacks are reused; on a GPU each block has its own) and after the host's set-up:
// the n-th block run acquires from block_order[(n + 1) % 2], where the host released
// before running it and the block before released, and releases to block_order[n % 2],
// which its own threads never acquire from, so they stay unordered among themselves.
static char block_order[2];
static unsigned long long cur_block_number = 0;

EMU_UNCHECKED static void fiber_main() {
    const unsigned long long n = cur_block_number;
    acquire(&block_order[(n + 1) & 1]);
    fiber_body(fiber_arg);
    // Copies never waited for are dropped: nothing may read them.
    cur_fiber->copies.clear();
    cur_fiber->group_ends.clear();
    cur_warp->live[cur_lane] = false;
    release(&block_order[n & 1]);
    arrive_and_drop(cur_warp->bar);
    arrive_and_drop(cur_block->bar);
    cur_fiber->done = true;
    leave();  // never returns: the fiber's stack is simply left
}

// Runs `body` as a grid of blocks of threads. Blocks run one after another; the
// threads of a block are fibers on this OS thread, switched only where a thread waits
// at a barrier or a warp exchange, so each runs straight through from one
// synchronisation point to the next. (One OS thread per emulated thread made the
// futex traffic of every barrier the emulator's main cost.) Deterministic; races show
// only under the race checker (see the top of this file).
template <typename F>
EMU_UNCHECKED static void launch(dim3 grid, dim3 block, F body) {
#if SPARKD_EMU_RACECHECK
    scheduler_tsan = __tsan_get_current_fiber();
#endif
    gridDim = grid;
    blockDim = block;
    const int threads = (int)(block.x * block.y * block.z);
    const unsigned long long n_blocks = (unsigned long long)grid.x * grid.y * grid.z;
    fiber_body = [](void* f) { (*static_cast<F*>(f))(); };
    fiber_arg = &body;
    std::vector<Fiber> fibers(threads);
    for (unsigned long long n = 0; n < n_blocks; ++n) {
        // The race checker runs the blocks last to first: a result that depends on the
        // order of blocks (one reading what another writes, two writing one place)
        // then fails one of the two runs' comparisons.
        const unsigned long long b = SPARKD_EMU_RACECHECK ? n_blocks - 1 - n : n;
        Block blk;
        blk.bar.expected = threads;
        blk.bar.orders_memory = true;
        blk.warps = std::vector<Warp>((threads + 31) / 32);
        for (size_t w = 0; w < blk.warps.size(); ++w) {
            blk.warps[w].bar.expected = std::min(32, threads - 32 * (int)w);
            for (int l = 0; l < blk.warps[w].bar.expected; ++l) blk.warps[w].live[l] = true;
        }
        const dim3 bidx{(unsigned)(b % grid.x), (unsigned)((b / grid.x) % grid.y),
                        (unsigned)(b / ((unsigned long long)grid.x * grid.y))};
        for (int t = 0; t < threads; ++t) {
            Fiber& f = fibers[t];
            f.idx = {t % block.x, (t / block.x) % block.y, t / (block.x * block.y)};
            f.lane = t % 32;
            f.warp = &blk.warps[t / 32];
            f.done = false;
            f.started = false;
            const Stack stack = stack_of(t);
#if SPARKD_EMU_RACECHECK
            f.tsan = stack.tsan;
#endif
            getcontext(&f.start);
            f.start.uc_stack.ss_sp = stack.base;
            f.start.uc_stack.ss_size = kStackBytes;
            f.start.uc_link = nullptr;
            makecontext(&f.start, fiber_main, 0);
        }
        cur_block = &blk;
        cur_block_number = n;
        release(&block_order[(n + 1) & 1]);  // the host's set-up of this block, and before
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
                resume(f);
                if (fault) {
                    acquire(&fault);
                    abandon_launch();
                    cur_fiber = nullptr;
                    const std::unique_ptr<std::string> what(std::exchange(fault, nullptr));
                    throw std::runtime_error(*what);
                }
                if (f.done) --live;
            }
            if (live > 0 && progress == before) {
                abandon_launch();
                throw std::runtime_error("emulator: deadlock (a barrier or warp exchange that some thread never reaches)");
            }
        }
    }
    cur_fiber = nullptr;
    acquire(&block_order[0]);
    acquire(&block_order[1]);
}

}  // namespace emu

static inline void __syncthreads() { emu::arrive_and_wait(emu::cur_block->bar); }
// Each intrinsic records its call site (a default argument, evaluated where it is called).
using emu_here = std::source_location;
static inline float __shfl_xor_sync(unsigned mask, float v, int o, emu_here at = emu_here::current()) {
    return emu::shfl(v, emu::cur_lane ^ o, emu::site(at, mask));
}
static inline int __shfl_xor_sync(unsigned mask, int v, int o, emu_here at = emu_here::current()) {
    return emu::shfl(v, emu::cur_lane ^ o, emu::site(at, mask));
}
static inline float __shfl_sync(unsigned mask, float v, int src, emu_here at = emu_here::current()) {
    return emu::shfl(v, src, emu::site(at, mask));
}

// The kernels' typedefs come from common.cuh, included after this header.
// prefetch.global.L2 is a hint with nothing to emulate; reading the line's first byte
// lets the memory checker (SPARKD_EMU_CHECK=memory) catch a prefetch outside every
// buffer, which the GPU would silently ignore.
static inline void emu_prefetch(const void* p) { (void)*(const volatile unsigned char*)p; }
static inline void cp_async16(void* dst, const void* src, unsigned src_bytes) { emu::issue_copy(dst, src, src_bytes); }
static inline void cp_async_commit() { emu::commit_copies(); }
template <int N>
static inline void cp_async_wait() {
    emu::wait_copies(N);
}

// ldmatrix .x4: lanes 8i..8i+7 give the row addresses of matrix i; lane l receives, from
// each matrix i, the 32-bit word l % 4 of row l / 4.
static inline void ldmatrix_x4(unsigned (&r)[4], const void* p, emu_here here = emu_here::current()) {
    const emu::Site at = emu::site(here, 0xffffffffu, true);
    if ((uintptr_t)p % 16 != 0) emu::fail("ldmatrix row address not 16-byte aligned at " + emu::describe(at));
    emu::publish(p, at);
    for (int i = 0; i < 4; ++i) {
        const unsigned char* row = (const unsigned char*)emu::read_slot<const void*>(8 * i + emu::cur_lane / 4);
        std::memcpy(&r[i], row + 4 * (emu::cur_lane % 4), 4);
    }
    emu::done();
}

// ldmatrix .x4.trans: the same rows, but lane l receives the 16-bit elements at columns
// l / 4 of rows 2 (l % 4) and 2 (l % 4) + 1 of each matrix (the lower row in the low half).
static inline void ldmatrix_x4_trans(unsigned (&r)[4], const void* p, emu_here here = emu_here::current()) {
    const emu::Site at = emu::site(here, 0xffffffffu, true);
    if ((uintptr_t)p % 16 != 0) emu::fail("ldmatrix row address not 16-byte aligned at " + emu::describe(at));
    emu::publish(p, at);
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
static inline void mma_16816(float (&d)[4], const unsigned (&a)[4], unsigned b0, unsigned b1,
                             emu_here here = emu_here::current()) {
    const emu::Site at = emu::site(here, 0xffffffffu, true);
    emu::MmaIn mine{{a[0], a[1], a[2], a[3]}, {b0, b1}};
    emu::publish(mine, at);
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
