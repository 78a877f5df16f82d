// rmsnorm.cu - RMSNorm over rows, to f32 or to the f16 operand of the tensor cores.
//
// extern "C" __global__ void rmsnorm_f32(const float* x, const float* w, float* out,
//                                        int n, float eps)
//   out[r] = x[r] / sqrt(mean(x[r]^2) + eps) * w, for each row r of n floats.
//   grid: (rows); block: a multiple of 32 threads, at most 1024 (256 for n >= 256).
//   out may equal x (in place): Qwen3's per-head q/k norm is this kernel over
//   rows = tokens * heads with n = head_dim and w = the head_dim-long gain.
//
// extern "C" __global__ void rmsnorm_f16(const float* x, const float* w, u16* out, int n,
//                                        float eps)
//   The same, rounded to f16: the activation operand of the tensor-core products, made
//   in the norm's own launch rather than by a conversion after it. out must not alias x.
//
// The arithmetic is the CPU's (daemon/src/model/ops.rs rms_norm): f32 sum of squares,
// scale = 1 / sqrt(sum / n + eps), out = v * scale * w.
#include "common.cuh"

template <typename Out>
static __device__ void rmsnorm(const float* x, const float* __restrict__ w, Out* out, int n,
                               float eps) {
    __shared__ float scratch[32];
    const float* xr = x + (u64)blockIdx.x * n;
    Out* o = out + (u64)blockIdx.x * n;
    float s = 0.0f;
    for (int i = threadIdx.x; i < n; i += blockDim.x) s += xr[i] * xr[i];
    // In place (f32) is safe: every read of a row's x above happens before the barriers
    // in block_sum, and below each thread reads x[i] before writing o[i].
    const float total = block_sum(s, scratch);
    const float scale = 1.0f / sqrtf(total / (float)n + eps);
    for (int i = threadIdx.x; i < n; i += blockDim.x) store_as(o + i, xr[i] * scale * w[i]);
}

extern "C" __global__ void rmsnorm_f32(const float* x, const float* w, float* out, int n,
                                       float eps) {
    pdl_enter();
    rmsnorm(x, w, out, n, eps);
}

extern "C" __global__ void rmsnorm_f16(const float* x, const float* w, u16* out, int n,
                                       float eps) {
    pdl_enter();
    rmsnorm(x, w, out, n, eps);
}
