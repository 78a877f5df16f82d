// runner.cpp - runs one kernel launch under cuda_emu.h, as described by a job file.
// Built and driven by src/emu.rs; not part of the GPU build.
//
// Job file, one directive per line:
//   kernel <name>
//   grid <x> <y> <z>
//   block <x> <y> <z>
//   buf <path> [<offset>]  a device buffer loaded from <path>, written back there after
//                   the launch; the kernel gets a pointer <offset> bytes into it
//   view <arg> <offset>    a pointer <offset> bytes into the buffer of argument <arg>
//                   (an earlier `buf`): two arguments aliasing one allocation, as on the
//                   device (in-place kernels, sub-buffers)
//   null            a null pointer
//   i32 <v> | i64 <v> | f32 <bits as u32>   scalars
// Arguments follow the kernel's parameter order. Exit status 0 on success.
#include "kernels.h"
#include "selftest.cu"

#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <functional>
#include <map>
#include <sstream>
#include <string>
#include <tuple>
#include <type_traits>

namespace {

struct Free {
    void operator()(unsigned char* p) const { std::free(p); }
};
using DeviceBuffer = std::unique_ptr<unsigned char[], Free>;

// A device buffer: 256-byte aligned like cuMemAlloc's, and exactly `size` bytes, so
// that under the memory checker the first byte past it is already out of bounds.
DeviceBuffer device_buffer(size_t size) {
    void* mem = nullptr;
    if (posix_memalign(&mem, 256, size ? size : 1) != 0) throw std::runtime_error("no memory for a buffer");
    return DeviceBuffer(static_cast<unsigned char*>(mem));
}

struct Arg {
    enum Kind { Buf, View, Null, I32, I64, F32 } kind;
    std::string path;
    size_t offset = 0;  // Buf and View: bytes into the buffer
    size_t of = 0;      // View: the argument that owns the buffer
    DeviceBuffer data;
    size_t size = 0;
    long long i = 0;
    float f = 0;
    unsigned char* ptr() { return data.get(); }
};

struct Args {
    std::vector<Arg>& v;
    size_t next = 0;
    template <typename P>
    P get() {
        if (next >= v.size()) throw std::runtime_error("too few arguments");
        Arg& a = v[next++];
        if constexpr (std::is_pointer_v<P>) {
            if (a.kind == Arg::Null) return nullptr;
            if (a.kind == Arg::View) return reinterpret_cast<P>(v[a.of].ptr() + a.offset);
            if (a.kind != Arg::Buf) throw std::runtime_error("expected a buffer");
            return reinterpret_cast<P>(a.ptr() + a.offset);
        } else if constexpr (std::is_same_v<P, float>) {
            if (a.kind != Arg::F32) throw std::runtime_error("expected f32");
            return a.f;
        } else if constexpr (std::is_same_v<P, long long>) {
            if (a.kind != Arg::I64) throw std::runtime_error("expected i64");
            return a.i;
        } else {
            static_assert(std::is_same_v<P, int>, "unsupported parameter type");
            if (a.kind != Arg::I32) throw std::runtime_error("expected i32");
            return (int)a.i;
        }
    }
};

using Runner = std::function<void(dim3, dim3, std::vector<Arg>&)>;

template <typename... P>
Runner wrap(void (*k)(P...)) {
    return [k](dim3 grid, dim3 block, std::vector<Arg>& v) {
        Args args{v};
        // Braced initialisation evaluates left to right: arguments in order.
        std::tuple<P...> t{args.template get<P>()...};
        if (args.next != v.size()) throw std::runtime_error("too many arguments");
        emu::launch(grid, block, [&] { std::apply(k, t); });
    };
}

std::map<std::string, Runner> kernels() {
    std::map<std::string, Runner> m;
#define REG(name) m[#name] = wrap(name);
    SPARKD_EMU_KERNELS(REG)
    SPARKD_EMU_SELFTEST_KERNELS(REG)
#undef REG
    return m;
}

}  // namespace

int main(int argc, char** argv) {
    if (argc != 2) {
        std::fprintf(stderr, "usage: runner <job file>\n");
        return 2;
    }
    std::string kernel;
    try {
        std::ifstream job(argv[1]);
        std::string line;
        dim3 grid, block;
        std::vector<Arg> args;
        while (std::getline(job, line)) {
            std::istringstream in(line);
            std::string d;
            if (!(in >> d)) continue;
            if (d == "kernel") {
                in >> kernel;
            } else if (d == "grid") {
                in >> grid.x >> grid.y >> grid.z;
            } else if (d == "block") {
                in >> block.x >> block.y >> block.z;
            } else if (d == "buf") {
                Arg a{Arg::Buf};
                in >> a.path;
                std::ifstream f(a.path, std::ios::binary);
                std::vector<unsigned char> bytes((std::istreambuf_iterator<char>(f)), {});
                a.size = bytes.size();
                if (!(in >> a.offset)) a.offset = 0;
                if (a.offset > a.size) throw std::runtime_error("buffer offset past its end");
                a.data = device_buffer(bytes.size());
                std::memcpy(a.ptr(), bytes.data(), bytes.size());
                args.push_back(std::move(a));
            } else if (d == "view") {
                Arg a{Arg::View};
                in >> a.of >> a.offset;
                if (a.of >= args.size() || args[a.of].kind != Arg::Buf)
                    throw std::runtime_error("view of an argument that is not a buffer");
                if (a.offset > args[a.of].size) throw std::runtime_error("view past the buffer's end");
                args.push_back(std::move(a));
            } else if (d == "null") {
                args.push_back(Arg{Arg::Null});
            } else if (d == "i32" || d == "i64") {
                Arg a{d == "i32" ? Arg::I32 : Arg::I64};
                in >> a.i;
                args.push_back(std::move(a));
            } else if (d == "f32") {
                Arg a{Arg::F32};
                unsigned bits;
                in >> bits;
                a.f = __uint_as_float(bits);
                args.push_back(std::move(a));
            } else {
                throw std::runtime_error("unknown directive " + d);
            }
        }
        const auto all = kernels();
        const auto it = all.find(kernel);
        if (it == all.end()) throw std::runtime_error("unknown kernel " + kernel);
        it->second(grid, block, args);
        for (auto& a : args)
            if (a.kind == Arg::Buf) {
                std::ofstream f(a.path, std::ios::binary | std::ios::trunc);
                f.write(reinterpret_cast<const char*>(a.ptr()), (std::streamsize)a.size);
            }
    } catch (const std::exception& e) {
        std::fprintf(stderr, "runner: %s: %s\n", kernel.empty() ? "(no kernel)" : kernel.c_str(), e.what());
        return 1;
    }
    return 0;
}
