// fake_libcuda.cpp - a stand-in for the CUDA driver library (libcuda.so) that runs
// sparkd's kernels on the CPU emulator (cuda_emu.h). Tests put it first on the
// LD_LIBRARY_PATH of a real `sparkd`, so the driver-facing code (backend/cuda/real.rs,
// the device probe, graph capture, events, the daemon on `--device cuda`) runs end to
// end on machines without a GPU. Built by src/emu.rs; never part of a release.
//
// It implements the calls sparkd makes (a call it lacks makes cudarc panic with
// "Missing symbol", which fails the test that reached it) and keeps the rules of the
// real driver that host code can get wrong:
//  - a context must be current on the calling thread, else CUDA_ERROR_INVALID_CONTEXT;
//  - stream work is asynchronous: it is queued and runs only at a synchronising call
//    (stream, event or context synchronize, a copy to host memory, a free), so a
//    missing synchronisation reads stale data and an event not yet reached is
//    CUDA_ERROR_NOT_READY;
//  - a module is a cubin of SASS the device runs (its major version, minor version up
//    to the device's); a function is found only among its own module's kernels, and
//    only if the emulator has it, with as many parameters; a launch must fit the
//    device's grid and block limits, the kernel's __launch_bounds__, 48 KiB of shared
//    memory (static plus dynamic) and 64 Ki registers a block;
//  - pointer arguments must point into live allocations, and copies stay inside them
//    (stricter than a GPU, which would fault later or corrupt memory quietly);
//  - during a stream capture (thread-local mode) a synchronising call, an allocation or
//    a copy from host memory on the capturing thread fails with
//    CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED and invalidates the capture; captured
//    launches keep the argument values they were given, as a replayed graph does;
//  - cuLaunchKernelEx takes the programmatic-stream-serialization attribute alone, and
//    only on compute capability 9.0 or newer. Launches still run one after another
//    (a valid schedule of programmatic dependent launch; the kernels' side of the
//    contract is checked on their PTX by kernels/tests/nvrtc_compile.rs).
//
// Knobs (environment, read at cuInit): SPARKD_FAKE_CUDA_DEVICES (0 or 1, default 1),
// SPARKD_FAKE_CUDA_CC (default "9.0"), SPARKD_FAKE_CUDA_MEMORY_MIB (default 4096),
// SPARKD_FAKE_CUDA_NO_PDL=1 (a driver that refuses programmatic dependent launch).
// Problems are explained on stderr, prefixed "fake libcuda:".
#include "kernels.h"

#include <elf.h>

#include <chrono>
#include <cstdarg>
#include <cstdio>
#include <cstdlib>
#include <deque>
#include <functional>
#include <map>
#include <mutex>
#include <set>
#include <string>
#include <tuple>
#include <type_traits>
#include <thread>
#include <utility>

#define FAKE_API extern "C" __attribute__((visibility("default")))

typedef int CUresult;
typedef int CUdevice;
typedef unsigned long long CUdeviceptr;

enum : CUresult {
    CUDA_SUCCESS = 0,
    CUDA_ERROR_INVALID_VALUE = 1,
    CUDA_ERROR_OUT_OF_MEMORY = 2,
    CUDA_ERROR_NOT_INITIALIZED = 3,
    CUDA_ERROR_NO_DEVICE = 100,
    CUDA_ERROR_INVALID_DEVICE = 101,
    CUDA_ERROR_INVALID_IMAGE = 200,
    CUDA_ERROR_INVALID_CONTEXT = 201,
    CUDA_ERROR_NO_BINARY_FOR_GPU = 209,
    CUDA_ERROR_INVALID_HANDLE = 400,
    CUDA_ERROR_ILLEGAL_STATE = 401,
    CUDA_ERROR_NOT_FOUND = 500,
    CUDA_ERROR_NOT_READY = 600,
    CUDA_ERROR_ILLEGAL_ADDRESS = 700,
    CUDA_ERROR_LAUNCH_OUT_OF_RESOURCES = 701,
    CUDA_ERROR_LAUNCH_FAILED = 719,
    CUDA_ERROR_NOT_PERMITTED = 800,
    CUDA_ERROR_NOT_SUPPORTED = 801,
    CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED = 900,
    CUDA_ERROR_STREAM_CAPTURE_INVALIDATED = 901,
    CUDA_ERROR_STREAM_CAPTURE_WRONG_THREAD = 908,
};

namespace {

void complain(const char* fmt, ...) {
    std::va_list ap;
    va_start(ap, fmt);
    std::fputs("fake libcuda: ", stderr);
    std::vfprintf(stderr, fmt, ap);
    std::fputc('\n', stderr);
    va_end(ap);
}

double now_ms() {
    using namespace std::chrono;
    return duration<double, std::milli>(steady_clock::now().time_since_epoch()).count();
}

// ---- kernels ------------------------------------------------------------------------

bool inside_allocation(uintptr_t p, size_t len);

template <typename P>
P read_param(void* p) {
    P v;
    std::memcpy(&v, p, sizeof(P));
    return v;
}

template <typename... P, size_t... I>
std::tuple<P...> read_params([[maybe_unused]] void** params, std::index_sequence<I...>) {
    return {read_param<P>(params[I])...};
}

template <typename T>
bool check_pointer(const T& v, int index, std::string& err) {
    if constexpr (std::is_pointer_v<T>) {
        if (v != nullptr && !inside_allocation(reinterpret_cast<uintptr_t>(v), 0)) {
            err = "argument " + std::to_string(index) + " points outside every allocation";
            return false;
        }
    }
    return true;
}

struct Kernel {
    int arity;
    // Copies the launch's parameters (the driver does so at launch, so the caller may
    // reuse its storage) and returns the launch as a closure.
    std::function<bool(dim3, dim3, void**, std::function<void()>&, std::string&)> bind;
};

template <typename... P>
Kernel make_kernel(void (*k)(P...)) {
    return Kernel{(int)sizeof...(P), [k](dim3 grid, dim3 block, void** params,
                                        std::function<void()>& out, std::string& err) {
                      std::tuple<P...> t = read_params<P...>(params, std::index_sequence_for<P...>{});
                      bool ok = true;
                      int index = 0;
                      std::apply([&](const auto&... a) { ((ok = ok && check_pointer(a, index++, err)), ...); }, t);
                      if (!ok) return false;
                      out = [k, grid, block, t] { emu::launch(grid, block, [&] { std::apply(k, t); }); };
                      return true;
                  }};
}

const std::map<std::string, Kernel>& registry() {
    static const std::map<std::string, Kernel> m = [] {
        std::map<std::string, Kernel> m;
#define REG(name) m.emplace(#name, make_kernel(name));
        SPARKD_EMU_KERNELS(REG)
#undef REG
        return m;
    }();
    return m;
}

// ---- driver objects -----------------------------------------------------------------

struct Op {
    std::function<void()> run;
};

struct Stream {
    std::deque<Op> queue;
    bool capturing = false;
    bool invalidated = false;
    std::thread::id capture_thread;
    std::vector<Op> captured;
};

struct Event {
    unsigned flags = 0;
    bool recorded = false;  // cuEventRecord was called
    bool done = false;      // ... and the stream reached it
    double at_ms = 0;
    Stream* stream = nullptr;
};

struct Entry {
    int params = 0;
    unsigned maxntid = 0;  // threads allowed by __launch_bounds__, 0 when absent
    unsigned registers = 0;     // per thread
    size_t static_shared = 0;   // bytes, as the kernel declares them
};

struct Module {
    std::map<std::string, Entry> entries;
};

struct Function {
    std::string name;
    const Kernel* kernel;
    Entry entry;
};

struct Graph {
    std::vector<Op> nodes;
};

struct Context {
    int refs = 0;
};

struct Driver {
    std::recursive_mutex mu;
    bool inited = false;
    int devices = 1;
    int cc_major = 9, cc_minor = 0;
    bool no_pdl = false;
    // SPARKD_FAKE_CUDA_NO_PINNED: cuMemHostAlloc refuses, as in a sandbox or under a
    // locked-memory limit.
    bool no_pinned = false;
    size_t total = 4096ull << 20;
    size_t used = 0;
    std::map<uintptr_t, size_t> allocs;
    // Page-locked host memory (cuMemHostAlloc): copies into it are asynchronous.
    std::map<uintptr_t, size_t> host_allocs;
    std::set<Stream*> streams;
    std::set<Event*> events;
    std::set<Module*> modules;
    std::set<Function*> functions;
    std::set<Graph*> graphs;
    std::set<Graph*> execs;
    Context primary;
    Stream legacy;  // the NULL stream
};

Driver& drv() {
    static Driver d;
    return d;
}

thread_local Context* tl_ctx = nullptr;

bool inside(const std::map<uintptr_t, size_t>& allocs, uintptr_t p, size_t len) {
    auto it = allocs.upper_bound(p);
    if (it == allocs.begin()) return false;
    --it;
    return p >= it->first && p - it->first <= it->second && len <= it->second - (p - it->first);
}

bool inside_allocation(uintptr_t p, size_t len) { return inside(drv().allocs, p, len); }

// Every call but the device queries needs an initialised driver and a current context.
#define NEED_CTX()                                                                  \
    std::lock_guard<std::recursive_mutex> lock_(drv().mu);                          \
    if (!drv().inited) return CUDA_ERROR_NOT_INITIALIZED;                           \
    if (tl_ctx == nullptr) {                                                        \
        complain("%s without a current context on this thread", __func__);         \
        return CUDA_ERROR_INVALID_CONTEXT;                                          \
    }

Stream* stream_of(void* s) {
    if (s == nullptr) return &drv().legacy;
    auto* st = static_cast<Stream*>(s);
    return drv().streams.count(st) ? st : nullptr;
}

void run_queue(Stream* s) {
    while (!s->queue.empty()) {
        Op op = std::move(s->queue.front());
        s->queue.pop_front();
        // A kernel the emulator stops (a deadlock, a misused warp intrinsic) has no
        // driver error to become here: say so and stop the process, failing its test.
        try {
            op.run();
        } catch (const std::exception& e) {
            complain("a launch failed in the emulator: %s", e.what());
            std::abort();
        }
    }
}

void run_all() {
    run_queue(&drv().legacy);
    for (auto* s : drv().streams) run_queue(s);
}

// The stream this thread is capturing into, if any (thread-local capture mode).
Stream* capturing_here() {
    for (auto* s : drv().streams)
        if (s->capturing && s->capture_thread == std::this_thread::get_id()) return s;
    return nullptr;
}

// A call the capture rules forbid on the capturing thread, or (`on`) on a capturing
// stream from any thread: refused, and that capture ruined.
bool refused_in_capture(const char* call, Stream* on = nullptr) {
    Stream* s = on != nullptr && on->capturing ? on : capturing_here();
    if (s == nullptr) return false;
    complain("%s during a stream capture on this thread (the capture is now invalid)", call);
    s->invalidated = true;
    return true;
}

// Queues `op` on `s`, or records it into the graph being captured there.
void enqueue(Stream* s, std::function<void()> op) {
    if (s->capturing)
        s->captured.push_back(Op{std::move(op)});
    else
        s->queue.push_back(Op{std::move(op)});
}

// ---- cubins -------------------------------------------------------------------------
// What the real driver reads from a cubin's ELF: the SASS architecture (e_flags), the
// kernels (one .nv.info.<name> section each, of attributes: EIATTR_KPARAM_INFO per
// parameter, EIATTR_MAX_THREADS from __launch_bounds__), each kernel's registers
// (EIATTR_REGCOUNT in .nv.info, by symbol) and static shared memory (.nv.shared.<name>,
// which on sm_80+ includes the 1 KiB the system reserves per block).

constexpr uint8_t EIATTR_MAX_THREADS = 0x05, EIATTR_KPARAM_INFO = 0x17, EIATTR_REGCOUNT = 0x2f;
constexpr uint8_t EIFMT_SVAL = 4;  // a u16 size and that many bytes follow; else 4 bytes in all
constexpr size_t RESERVED_SHARED = 1024;

bool parse_cubin(const unsigned char* image, Module& m, std::string& err) {
    Elf64_Ehdr eh;
    std::memcpy(&eh, image, sizeof eh);
    if (eh.e_ident[EI_CLASS] != ELFCLASS64 || eh.e_machine != EM_CUDA) {
        err = "not a 64-bit CUDA ELF image";
        return false;
    }
    // The driver takes a bare pointer; the image's extent comes from its own headers.
    if (eh.e_shentsize != sizeof(Elf64_Shdr) || eh.e_shnum == 0 || eh.e_shstrndx >= eh.e_shnum) {
        err = "malformed section headers";
        return false;
    }
    // CUDA 13's ELF ABI (version 8) keeps the SASS architecture in bits 8..16 of e_flags.
    const unsigned sm = eh.e_ident[EI_ABIVERSION] >= 8 ? (eh.e_flags >> 8) & 0xff : eh.e_flags & 0xff;
    // SASS runs on its own major version only, from its minor version up.
    if (sm / 10 != (unsigned)drv().cc_major || sm % 10 > (unsigned)drv().cc_minor) {
        err = "SASS for sm_" + std::to_string(sm) + " on a device of compute capability " +
              std::to_string(drv().cc_major) + "." + std::to_string(drv().cc_minor);
        return false;
    }
    std::vector<Elf64_Shdr> sh(eh.e_shnum);
    std::memcpy(sh.data(), image + eh.e_shoff, sh.size() * sizeof(Elf64_Shdr));
    const char* names = reinterpret_cast<const char*>(image + sh[eh.e_shstrndx].sh_offset);
    auto name_of = [&](const Elf64_Shdr& h) { return std::string(names + h.sh_name); };
    // Attribute records of one .nv.info section: (attribute, payload, payload size).
    auto records = [&](const Elf64_Shdr& h, auto&& visit) {
        const unsigned char* p = image + h.sh_offset;
        const unsigned char* end = p + h.sh_size;
        while (p + 4 <= end) {
            const uint8_t fmt = p[0], attr = p[1];
            uint16_t size;
            std::memcpy(&size, p + 2, 2);
            const bool sval = fmt == EIFMT_SVAL;
            visit(attr, p + 4, sval ? size : 0);
            p += 4 + (sval ? size : 0);
        }
    };
    std::map<std::string, size_t> shared;
    for (const auto& h : sh) {
        const std::string n = name_of(h);
        if (n.rfind(".nv.shared.", 0) == 0) shared[n.substr(11)] = h.sh_size;
        if (n.rfind(".nv.info.", 0) != 0) continue;
        Entry e;
        records(h, [&](uint8_t attr, const unsigned char* v, size_t size) {
            if (attr == EIATTR_KPARAM_INFO) ++e.params;
            if (attr == EIATTR_MAX_THREADS && size >= 12) {
                uint32_t t[3];
                std::memcpy(t, v, 12);
                e.maxntid = t[0] * t[1] * t[2];
            }
        });
        m.entries[n.substr(9)] = e;
    }
    for (auto& [name, e] : m.entries) {
        const auto it = shared.find(name);
        if (it != shared.end()) e.static_shared = it->second > RESERVED_SHARED ? it->second - RESERVED_SHARED : 0;
    }
    // Registers are per symbol, in the module-wide .nv.info.
    for (const auto& h : sh) {
        if (name_of(h) != ".nv.info" || h.sh_link >= sh.size()) continue;
        const Elf64_Shdr& symtab = sh[h.sh_link];
        const Elf64_Shdr& strtab = sh[symtab.sh_link < sh.size() ? symtab.sh_link : 0];
        const size_t nsyms = symtab.sh_size / sizeof(Elf64_Sym);
        records(h, [&](uint8_t attr, const unsigned char* v, size_t size) {
            if (attr != EIATTR_REGCOUNT || size < 8) return;
            uint32_t sym_regs[2];
            std::memcpy(sym_regs, v, 8);
            if (sym_regs[0] >= nsyms) return;
            Elf64_Sym sym;
            std::memcpy(&sym, image + symtab.sh_offset + sym_regs[0] * sizeof(Elf64_Sym), sizeof sym);
            const auto it = m.entries.find(reinterpret_cast<const char*>(image + strtab.sh_offset + sym.st_name));
            if (it != m.entries.end()) it->second.registers = sym_regs[1];
        });
    }
    if (m.entries.empty()) {
        err = "no kernels in the image";
        return false;
    }
    for (const auto& [name, e] : m.entries) {
        if (e.registers == 0) {
            err = "no register count for " + name;
            return false;
        }
    }
    return true;
}

}  // namespace

// ---- the driver API -----------------------------------------------------------------

FAKE_API CUresult cuGetErrorName(CUresult e, const char** out) {
    static const std::map<CUresult, const char*> names = {
        {CUDA_SUCCESS, "CUDA_SUCCESS"},
        {CUDA_ERROR_INVALID_VALUE, "CUDA_ERROR_INVALID_VALUE"},
        {CUDA_ERROR_OUT_OF_MEMORY, "CUDA_ERROR_OUT_OF_MEMORY"},
        {CUDA_ERROR_NOT_INITIALIZED, "CUDA_ERROR_NOT_INITIALIZED"},
        {CUDA_ERROR_NO_DEVICE, "CUDA_ERROR_NO_DEVICE"},
        {CUDA_ERROR_INVALID_DEVICE, "CUDA_ERROR_INVALID_DEVICE"},
        {CUDA_ERROR_INVALID_IMAGE, "CUDA_ERROR_INVALID_IMAGE"},
        {CUDA_ERROR_INVALID_CONTEXT, "CUDA_ERROR_INVALID_CONTEXT"},
        {CUDA_ERROR_NO_BINARY_FOR_GPU, "CUDA_ERROR_NO_BINARY_FOR_GPU"},
        {CUDA_ERROR_INVALID_HANDLE, "CUDA_ERROR_INVALID_HANDLE"},
        {CUDA_ERROR_ILLEGAL_STATE, "CUDA_ERROR_ILLEGAL_STATE"},
        {CUDA_ERROR_NOT_FOUND, "CUDA_ERROR_NOT_FOUND"},
        {CUDA_ERROR_NOT_READY, "CUDA_ERROR_NOT_READY"},
        {CUDA_ERROR_ILLEGAL_ADDRESS, "CUDA_ERROR_ILLEGAL_ADDRESS"},
        {CUDA_ERROR_LAUNCH_OUT_OF_RESOURCES, "CUDA_ERROR_LAUNCH_OUT_OF_RESOURCES"},
        {CUDA_ERROR_LAUNCH_FAILED, "CUDA_ERROR_LAUNCH_FAILED"},
        {CUDA_ERROR_NOT_PERMITTED, "CUDA_ERROR_NOT_PERMITTED"},
        {CUDA_ERROR_NOT_SUPPORTED, "CUDA_ERROR_NOT_SUPPORTED"},
        {CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED, "CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED"},
        {CUDA_ERROR_STREAM_CAPTURE_INVALIDATED, "CUDA_ERROR_STREAM_CAPTURE_INVALIDATED"},
        {CUDA_ERROR_STREAM_CAPTURE_WRONG_THREAD, "CUDA_ERROR_STREAM_CAPTURE_WRONG_THREAD"},
    };
    auto it = names.find(e);
    if (it == names.end()) {
        *out = nullptr;
        return CUDA_ERROR_INVALID_VALUE;
    }
    *out = it->second;
    return CUDA_SUCCESS;
}

FAKE_API CUresult cuGetErrorString(CUresult e, const char** out) { return cuGetErrorName(e, out); }

FAKE_API CUresult cuInit(unsigned flags) {
    std::lock_guard<std::recursive_mutex> lock(drv().mu);
    auto& d = drv();
    if (flags != 0) return CUDA_ERROR_INVALID_VALUE;
    if (const char* v = std::getenv("SPARKD_FAKE_CUDA_DEVICES")) d.devices = std::atoi(v) > 0 ? 1 : 0;
    if (const char* v = std::getenv("SPARKD_FAKE_CUDA_CC")) std::sscanf(v, "%d.%d", &d.cc_major, &d.cc_minor);
    if (const char* v = std::getenv("SPARKD_FAKE_CUDA_MEMORY_MIB")) d.total = std::strtoull(v, nullptr, 10) << 20;
    if (const char* v = std::getenv("SPARKD_FAKE_CUDA_NO_PDL")) d.no_pdl = std::atoi(v) != 0;
    if (const char* v = std::getenv("SPARKD_FAKE_CUDA_NO_PINNED")) d.no_pinned = std::atoi(v) != 0;
    if (d.devices == 0) return CUDA_ERROR_NO_DEVICE;
    d.inited = true;
    return CUDA_SUCCESS;
}

FAKE_API CUresult cuDriverGetVersion(int* v) {
    *v = 13000;
    return CUDA_SUCCESS;
}

FAKE_API CUresult cuDeviceGetCount(int* n) {
    std::lock_guard<std::recursive_mutex> lock(drv().mu);
    if (!drv().inited) return CUDA_ERROR_NOT_INITIALIZED;
    *n = drv().devices;
    return CUDA_SUCCESS;
}

FAKE_API CUresult cuDeviceGet(CUdevice* dev, int ordinal) {
    std::lock_guard<std::recursive_mutex> lock(drv().mu);
    if (!drv().inited) return CUDA_ERROR_NOT_INITIALIZED;
    if (ordinal < 0 || ordinal >= drv().devices) return CUDA_ERROR_INVALID_DEVICE;
    *dev = ordinal;
    return CUDA_SUCCESS;
}

#define NEED_DEVICE(dev)                                                   \
    std::lock_guard<std::recursive_mutex> lock_(drv().mu);                 \
    if (!drv().inited) return CUDA_ERROR_NOT_INITIALIZED;                  \
    if ((dev) < 0 || (dev) >= drv().devices) return CUDA_ERROR_INVALID_DEVICE;

FAKE_API CUresult cuDeviceGetName(char* name, int len, CUdevice dev) {
    NEED_DEVICE(dev);
    if (name == nullptr || len <= 0) return CUDA_ERROR_INVALID_VALUE;
    std::snprintf(name, (size_t)len, "sparkd fake GPU (CPU emulator)");
    return CUDA_SUCCESS;
}

FAKE_API CUresult cuDeviceTotalMem_v2(size_t* bytes, CUdevice dev) {
    NEED_DEVICE(dev);
    *bytes = drv().total;
    return CUDA_SUCCESS;
}

FAKE_API CUresult cuDeviceGetAttribute(int* v, int attr, CUdevice dev) {
    NEED_DEVICE(dev);
    switch (attr) {
        case 1: case 2: case 3: *v = 1024; break;             // max threads per block, block x, y
        case 4: *v = 64; break;                               // block z
        case 5: *v = 2147483647; break;                       // grid x
        case 6: case 7: *v = 65535; break;                    // grid y, z
        case 8: *v = 49152; break;                            // shared memory per block
        case 10: *v = 32; break;                              // warp size
        case 16: *v = 4; break;                               // multiprocessors
        case 75: *v = drv().cc_major; break;
        case 76: *v = drv().cc_minor; break;
        case 97: *v = 232448; break;                          // opt-in shared memory per block
        case 115: *v = 0; break;                              // memory pools: not emulated
        default:
            complain("cuDeviceGetAttribute(%d) is not emulated", attr);
            return CUDA_ERROR_INVALID_VALUE;
    }
    return CUDA_SUCCESS;
}

FAKE_API CUresult cuDevicePrimaryCtxRetain(void** ctx, CUdevice dev) {
    NEED_DEVICE(dev);
    drv().primary.refs++;
    *ctx = &drv().primary;
    return CUDA_SUCCESS;
}

FAKE_API CUresult cuDevicePrimaryCtxRelease_v2(CUdevice dev) {
    NEED_DEVICE(dev);
    if (drv().primary.refs == 0) return CUDA_ERROR_INVALID_CONTEXT;
    drv().primary.refs--;
    return CUDA_SUCCESS;
}

FAKE_API CUresult cuCtxSetCurrent(void* ctx) {
    std::lock_guard<std::recursive_mutex> lock(drv().mu);
    if (!drv().inited) return CUDA_ERROR_NOT_INITIALIZED;
    if (ctx != nullptr && (ctx != &drv().primary || drv().primary.refs == 0)) return CUDA_ERROR_INVALID_CONTEXT;
    tl_ctx = static_cast<Context*>(ctx);
    return CUDA_SUCCESS;
}

FAKE_API CUresult cuCtxGetCurrent(void** ctx) {
    std::lock_guard<std::recursive_mutex> lock(drv().mu);
    if (!drv().inited) return CUDA_ERROR_NOT_INITIALIZED;
    *ctx = tl_ctx;
    return CUDA_SUCCESS;
}

FAKE_API CUresult cuCtxSynchronize() {
    NEED_CTX();
    if (refused_in_capture("cuCtxSynchronize")) return CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED;
    run_all();
    return CUDA_SUCCESS;
}

FAKE_API CUresult cuMemGetInfo_v2(size_t* free, size_t* total) {
    NEED_CTX();
    *free = drv().total - drv().used;
    *total = drv().total;
    return CUDA_SUCCESS;
}

FAKE_API CUresult cuMemAlloc_v2(CUdeviceptr* out, size_t bytes) {
    NEED_CTX();
    if (refused_in_capture("cuMemAlloc")) return CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED;
    auto& d = drv();
    if (bytes == 0) return CUDA_ERROR_INVALID_VALUE;
    if (bytes > d.total - d.used) return CUDA_ERROR_OUT_OF_MEMORY;
    // 256-byte aligned, as cuMemAlloc guarantees; not zeroed (the driver does not either).
    void* p = std::aligned_alloc(256, (bytes + 255) / 256 * 256);
    if (p == nullptr) return CUDA_ERROR_OUT_OF_MEMORY;
    std::memset(p, 0xA5, bytes);
    d.allocs[reinterpret_cast<uintptr_t>(p)] = bytes;
    d.used += bytes;
    *out = reinterpret_cast<uintptr_t>(p);
    return CUDA_SUCCESS;
}

FAKE_API CUresult cuMemFree_v2(CUdeviceptr p) {
    NEED_CTX();
    if (refused_in_capture("cuMemFree")) return CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED;
    auto& d = drv();
    auto it = d.allocs.find((uintptr_t)p);
    if (it == d.allocs.end()) {
        complain("cuMemFree of %#llx, which is not an allocation", p);
        return CUDA_ERROR_INVALID_VALUE;
    }
    run_all();  // cuMemFree synchronises: queued work may still use the memory
    d.used -= it->second;
    std::free(reinterpret_cast<void*>(it->first));
    d.allocs.erase(it);
    return CUDA_SUCCESS;
}

FAKE_API CUresult cuMemHostAlloc(void** out, size_t bytes, unsigned flags) {
    NEED_CTX();
    if (refused_in_capture("cuMemHostAlloc")) return CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED;
    // PORTABLE, DEVICEMAP and WRITECOMBINED are the flags there are.
    if (out == nullptr || bytes == 0 || (flags & ~0x7u) != 0) return CUDA_ERROR_INVALID_VALUE;
    if (drv().no_pinned) return CUDA_ERROR_NOT_PERMITTED;
    void* p = std::aligned_alloc(4096, (bytes + 4095) / 4096 * 4096);
    if (p == nullptr) return CUDA_ERROR_OUT_OF_MEMORY;
    std::memset(p, 0xA5, bytes);  // not zeroed
    drv().host_allocs[reinterpret_cast<uintptr_t>(p)] = bytes;
    *out = p;
    return CUDA_SUCCESS;
}

FAKE_API CUresult cuMemFreeHost(void* p) {
    NEED_CTX();
    auto& d = drv();
    auto it = d.host_allocs.find(reinterpret_cast<uintptr_t>(p));
    if (it == d.host_allocs.end()) {
        complain("cuMemFreeHost of %p, which cuMemHostAlloc did not return", p);
        return CUDA_ERROR_INVALID_VALUE;
    }
    run_all();  // synchronises, as cuMemFree: a queued copy may still write into it
    std::free(p);
    d.host_allocs.erase(it);
    return CUDA_SUCCESS;
}

#define NEED_STREAM(s, st)                  \
    Stream* st = stream_of(s);              \
    if (st == nullptr) {                    \
        complain("%s on a stream that does not exist", __func__); \
        return CUDA_ERROR_INVALID_HANDLE;   \
    }

#define NEED_RANGE(p, n, what)                                                             \
    if (!inside_allocation((uintptr_t)(p), (n))) {                                          \
        complain("%s: %s of %zu bytes at %#llx is outside every allocation", __func__, what, \
                 (size_t)(n), (unsigned long long)(p));                                    \
        return CUDA_ERROR_INVALID_VALUE;                                                   \
    }

FAKE_API CUresult cuMemsetD8Async(CUdeviceptr dst, unsigned char value, size_t n, void* s) {
    NEED_CTX();
    NEED_STREAM(s, st);
    NEED_RANGE(dst, n, "destination");
    enqueue(st, [dst, value, n] { std::memset(reinterpret_cast<void*>(dst), value, n); });
    return CUDA_SUCCESS;
}

FAKE_API CUresult cuMemcpyHtoDAsync_v2(CUdeviceptr dst, const void* src, size_t n, void* s) {
    NEED_CTX();
    NEED_STREAM(s, st);
    NEED_RANGE(dst, n, "destination");
    if (refused_in_capture("cuMemcpyHtoDAsync from pageable host memory", st))
        return CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED;
    // Pageable memory is staged before the call returns; the copy itself is queued.
    std::vector<unsigned char> staged((const unsigned char*)src, (const unsigned char*)src + n);
    enqueue(st, [dst, staged = std::move(staged)] { std::memcpy(reinterpret_cast<void*>(dst), staged.data(), staged.size()); });
    return CUDA_SUCCESS;
}

FAKE_API CUresult cuMemcpyDtoHAsync_v2(void* dst, CUdeviceptr src, size_t n, void* s) {
    NEED_CTX();
    NEED_STREAM(s, st);
    NEED_RANGE(src, n, "source");
    if (inside(drv().host_allocs, reinterpret_cast<uintptr_t>(dst), n)) {
        // Into page-locked memory the copy is queued like a kernel and the call returns
        // at once: the host must wait for the stream before it reads `dst`.
        enqueue(st, [dst, src, n] { std::memcpy(dst, reinterpret_cast<const void*>(src), n); });
        return CUDA_SUCCESS;
    }
    if (refused_in_capture("cuMemcpyDtoHAsync to pageable host memory", st))
        return CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED;
    // To pageable memory the call returns once the copy is done, after the work queued
    // before it.
    run_queue(st);
    std::memcpy(dst, reinterpret_cast<const void*>(src), n);
    return CUDA_SUCCESS;
}

FAKE_API CUresult cuMemcpyDtoDAsync_v2(CUdeviceptr dst, CUdeviceptr src, size_t n, void* s) {
    NEED_CTX();
    NEED_STREAM(s, st);
    NEED_RANGE(dst, n, "destination");
    NEED_RANGE(src, n, "source");
    enqueue(st, [dst, src, n] { std::memmove(reinterpret_cast<void*>(dst), reinterpret_cast<const void*>(src), n); });
    return CUDA_SUCCESS;
}

FAKE_API CUresult cuStreamCreate(void** out, unsigned flags) {
    NEED_CTX();
    (void)flags;
    auto* s = new Stream();
    drv().streams.insert(s);
    *out = s;
    return CUDA_SUCCESS;
}

FAKE_API CUresult cuStreamDestroy_v2(void* s) {
    NEED_CTX();
    auto* st = static_cast<Stream*>(s);
    if (!drv().streams.count(st)) return CUDA_ERROR_INVALID_HANDLE;
    run_queue(st);  // destroying a stream lets its queued work finish
    for (auto* e : drv().events)
        if (e->stream == st) e->stream = nullptr;
    drv().streams.erase(st);
    delete st;
    return CUDA_SUCCESS;
}

FAKE_API CUresult cuStreamSynchronize(void* s) {
    NEED_CTX();
    NEED_STREAM(s, st);
    if (refused_in_capture("cuStreamSynchronize")) return CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED;
    run_queue(st);
    return CUDA_SUCCESS;
}

FAKE_API CUresult cuStreamBeginCapture_v2(void* s, int mode) {
    NEED_CTX();
    NEED_STREAM(s, st);
    if (st == &drv().legacy) return CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED;
    if (mode != 1) {
        complain("only thread-local capture mode is emulated (asked for mode %d)", mode);
        return CUDA_ERROR_INVALID_VALUE;
    }
    if (st->capturing) return CUDA_ERROR_ILLEGAL_STATE;
    st->capturing = true;
    st->invalidated = false;
    st->capture_thread = std::this_thread::get_id();
    st->captured.clear();
    return CUDA_SUCCESS;
}

FAKE_API CUresult cuStreamEndCapture(void* s, void** graph) {
    NEED_CTX();
    NEED_STREAM(s, st);
    *graph = nullptr;
    if (!st->capturing) return CUDA_ERROR_ILLEGAL_STATE;
    if (st->capture_thread != std::this_thread::get_id()) return CUDA_ERROR_STREAM_CAPTURE_WRONG_THREAD;
    st->capturing = false;
    if (st->invalidated) {
        st->captured.clear();
        return CUDA_ERROR_STREAM_CAPTURE_INVALIDATED;
    }
    auto* g = new Graph{std::move(st->captured)};
    st->captured.clear();
    drv().graphs.insert(g);
    *graph = g;
    return CUDA_SUCCESS;
}

FAKE_API CUresult cuGraphInstantiateWithFlags(void** exec, void* graph, unsigned long long flags) {
    NEED_CTX();
    auto* g = static_cast<Graph*>(graph);
    if (!drv().graphs.count(g) || flags != 0) return CUDA_ERROR_INVALID_VALUE;
    auto* x = new Graph{g->nodes};
    drv().execs.insert(x);
    *exec = x;
    return CUDA_SUCCESS;
}

FAKE_API CUresult cuGraphLaunch(void* exec, void* s) {
    NEED_CTX();
    NEED_STREAM(s, st);
    auto* x = static_cast<Graph*>(exec);
    if (!drv().execs.count(x)) return CUDA_ERROR_INVALID_HANDLE;
    if (st->capturing) {
        complain("cuGraphLaunch into a capture is not emulated");
        return CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED;
    }
    for (const auto& node : x->nodes) st->queue.push_back(node);
    return CUDA_SUCCESS;
}

FAKE_API CUresult cuGraphExecDestroy(void* exec) {
    NEED_CTX();
    auto* x = static_cast<Graph*>(exec);
    if (!drv().execs.erase(x)) return CUDA_ERROR_INVALID_HANDLE;
    delete x;
    return CUDA_SUCCESS;
}

FAKE_API CUresult cuGraphDestroy(void* graph) {
    NEED_CTX();
    auto* g = static_cast<Graph*>(graph);
    if (!drv().graphs.erase(g)) return CUDA_ERROR_INVALID_HANDLE;
    delete g;
    return CUDA_SUCCESS;
}

FAKE_API CUresult cuEventCreate(void** out, unsigned flags) {
    NEED_CTX();
    auto* e = new Event();
    e->flags = flags;
    drv().events.insert(e);
    *out = e;
    return CUDA_SUCCESS;
}

FAKE_API CUresult cuEventDestroy_v2(void* ev) {
    NEED_CTX();
    auto* e = static_cast<Event*>(ev);
    if (!drv().events.erase(e)) return CUDA_ERROR_INVALID_HANDLE;
    // A queued record of it still runs; it writes into a dead event no more.
    run_all();
    delete e;
    return CUDA_SUCCESS;
}

FAKE_API CUresult cuEventRecord(void* ev, void* s) {
    NEED_CTX();
    NEED_STREAM(s, st);
    auto* e = static_cast<Event*>(ev);
    if (!drv().events.count(e)) return CUDA_ERROR_INVALID_HANDLE;
    if (st->capturing) {
        complain("cuEventRecord in a stream capture is not emulated");
        st->invalidated = true;
        return CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED;
    }
    e->recorded = true;
    e->done = false;
    e->stream = st;
    st->queue.push_back(Op{[e] {
        e->at_ms = now_ms();
        e->done = true;
    }});
    return CUDA_SUCCESS;
}

FAKE_API CUresult cuEventSynchronize(void* ev) {
    NEED_CTX();
    auto* e = static_cast<Event*>(ev);
    if (!drv().events.count(e)) return CUDA_ERROR_INVALID_HANDLE;
    if (refused_in_capture("cuEventSynchronize")) return CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED;
    // Running the stream up to the event would be exact; running all of it is allowed
    // (the device may be ahead) and simpler.
    if (e->recorded && !e->done && e->stream != nullptr) run_queue(e->stream);
    return CUDA_SUCCESS;
}

static CUresult event_elapsed(float* ms, void* start, void* end) {
    NEED_CTX();
    auto* a = static_cast<Event*>(start);
    auto* b = static_cast<Event*>(end);
    if (!drv().events.count(a) || !drv().events.count(b)) return CUDA_ERROR_INVALID_HANDLE;
    if ((a->flags | b->flags) & 2) return CUDA_ERROR_INVALID_HANDLE;  // CU_EVENT_DISABLE_TIMING
    if (!a->recorded || !b->recorded) return CUDA_ERROR_INVALID_HANDLE;
    if (!a->done || !b->done) return CUDA_ERROR_NOT_READY;
    *ms = (float)(b->at_ms - a->at_ms);
    return CUDA_SUCCESS;
}

FAKE_API CUresult cuEventElapsedTime(float* ms, void* start, void* end) { return event_elapsed(ms, start, end); }
FAKE_API CUresult cuEventElapsedTime_v2(float* ms, void* start, void* end) { return event_elapsed(ms, start, end); }

FAKE_API CUresult cuModuleLoadData(void** out, const void* image) {
    NEED_CTX();
    // sparkd loads SASS only (see kernels/src/compile.rs); PTX here is a mistake.
    if (std::memcmp(image, ELFMAG, SELFMAG) != 0) {
        complain("cuModuleLoadData: not a cubin (sparkd loads SASS, not PTX)");
        return CUDA_ERROR_INVALID_IMAGE;
    }
    auto* m = new Module();
    std::string err;
    if (!parse_cubin(static_cast<const unsigned char*>(image), *m, err)) {
        complain("cuModuleLoadData: %s", err.c_str());
        delete m;
        return err.rfind("SASS for", 0) == 0 ? CUDA_ERROR_NO_BINARY_FOR_GPU : CUDA_ERROR_INVALID_IMAGE;
    }
    drv().modules.insert(m);
    *out = m;
    return CUDA_SUCCESS;
}

FAKE_API CUresult cuModuleUnload(void* module) {
    NEED_CTX();
    auto* m = static_cast<Module*>(module);
    if (!drv().modules.erase(m)) return CUDA_ERROR_INVALID_HANDLE;
    delete m;
    return CUDA_SUCCESS;
}

FAKE_API CUresult cuModuleGetFunction(void** out, void* module, const char* name) {
    NEED_CTX();
    auto* m = static_cast<Module*>(module);
    if (!drv().modules.count(m)) return CUDA_ERROR_INVALID_HANDLE;
    auto entry = m->entries.find(name);
    if (entry == m->entries.end()) {
        complain("cuModuleGetFunction: %s is not an entry of this module", name);
        return CUDA_ERROR_NOT_FOUND;
    }
    auto k = registry().find(name);
    if (k == registry().end()) {
        complain("cuModuleGetFunction: %s has no emulation (add it to emu/kernels.h)", name);
        return CUDA_ERROR_NOT_FOUND;
    }
    if (k->second.arity != entry->second.params) {
        complain("cuModuleGetFunction: %s takes %d parameters in SASS, %d in the emulator", name,
                 entry->second.params, k->second.arity);
        return CUDA_ERROR_INVALID_IMAGE;
    }
    auto* f = new Function{name, &k->second, entry->second};
    drv().functions.insert(f);
    *out = f;
    return CUDA_SUCCESS;
}

FAKE_API CUresult cuLaunchKernel(void* func, unsigned gx, unsigned gy, unsigned gz, unsigned bx, unsigned by,
                                 unsigned bz, unsigned shared, void* s, void** params, void** extra) {
    NEED_CTX();
    NEED_STREAM(s, st);
    auto* f = static_cast<Function*>(func);
    if (!drv().functions.count(f)) return CUDA_ERROR_INVALID_HANDLE;
    const unsigned long long threads = (unsigned long long)bx * by * bz;
    const char* bad = nullptr;
    if (extra != nullptr) bad = "the extra argument is not emulated";
    else if (params == nullptr && f->kernel->arity > 0) bad = "no kernel parameters";
    else if (gx == 0 || gy == 0 || gz == 0 || threads == 0) bad = "an empty grid or block";
    else if (gy > 65535 || gz > 65535 || gx > 2147483647u) bad = "a grid past the device's limits";
    else if (bx > 1024 || by > 1024 || bz > 64 || threads > 1024) bad = "a block past the device's limits";
    else if (f->entry.maxntid != 0 && threads > f->entry.maxntid) bad = "a block larger than the kernel's __launch_bounds__";
    else if (f->entry.static_shared + shared > 49152) bad = "more shared memory than a block gets without opting in";
    if (bad != nullptr) {
        complain("cuLaunchKernel(%s, grid %u,%u,%u, block %u,%u,%u): %s", f->name.c_str(), gx, gy, gz, bx, by,
                 bz, bad);
        return CUDA_ERROR_INVALID_VALUE;
    }
    // Registers are allocated per warp in units of 256, from 64 Ki per block.
    const unsigned long long warps = (threads + 31) / 32;
    const unsigned long long per_warp = (f->entry.registers * 32ull + 255) / 256 * 256;
    if (warps * per_warp > 65536) {
        complain("cuLaunchKernel(%s, block %u,%u,%u): too many resources requested for launch (%u registers a "
                 "thread)", f->name.c_str(), bx, by, bz, f->entry.registers);
        return CUDA_ERROR_LAUNCH_OUT_OF_RESOURCES;
    }
    std::function<void()> run;
    std::string err;
    if (!f->kernel->bind(dim3{gx, gy, gz}, dim3{bx, by, bz}, params, run, err)) {
        complain("cuLaunchKernel(%s): %s", f->name.c_str(), err.c_str());
        return CUDA_ERROR_INVALID_VALUE;
    }
    enqueue(st, std::move(run));
    return CUDA_SUCCESS;
}

// CUlaunchAttribute and CUlaunchConfig as cuda.h lays them out (x86-64 and aarch64).
struct LaunchAttribute {
    int id;
    char pad[4];
    union {
        char raw[64];
        int programmatic_stream_serialization_allowed;
    } value;
};
struct LaunchConfig {
    unsigned grid_x, grid_y, grid_z, block_x, block_y, block_z, shared;
    void* stream;
    LaunchAttribute* attrs;
    unsigned n_attrs;
};
static_assert(sizeof(LaunchAttribute) == 72 && sizeof(LaunchConfig) == 56, "cuda.h layout");
constexpr int LAUNCH_ATTRIBUTE_PROGRAMMATIC_STREAM_SERIALIZATION = 6;

FAKE_API CUresult cuLaunchKernelEx(const LaunchConfig* c, void* func, void** params, void** extra) {
    NEED_CTX();
    if (c == nullptr || (c->n_attrs > 0 && c->attrs == nullptr)) return CUDA_ERROR_INVALID_VALUE;
    for (unsigned i = 0; i < c->n_attrs; ++i) {
        const LaunchAttribute& a = c->attrs[i];
        if (a.id != LAUNCH_ATTRIBUTE_PROGRAMMATIC_STREAM_SERIALIZATION) {
            complain("cuLaunchKernelEx: launch attribute %d is not emulated", a.id);
            return CUDA_ERROR_INVALID_VALUE;
        }
        if (a.value.programmatic_stream_serialization_allowed == 0) continue;
        if (drv().no_pdl) return CUDA_ERROR_NOT_SUPPORTED;  // SPARKD_FAKE_CUDA_NO_PDL
        if (drv().cc_major < 9) {
            complain("cuLaunchKernelEx: programmatic dependent launch needs compute capability 9.0, not %d.%d",
                     drv().cc_major, drv().cc_minor);
            return CUDA_ERROR_NOT_SUPPORTED;
        }
    }
    return cuLaunchKernel(func, c->grid_x, c->grid_y, c->grid_z, c->block_x, c->block_y, c->block_z,
                          c->shared, c->stream, params, extra);
}
