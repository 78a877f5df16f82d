// rmsnorm.cu - RMSNorm over rows, plain and with the residual add fused in front.
//
// extern "C" __global__ void rmsnorm_f32(const float* x, const float* w, float* out,
//                                        int n, float eps)
//   out[r] = x[r] / sqrt(mean(x[r]^2) + eps) * w, for each row r of n floats.
//   grid: (rows); block: a multiple of 32 threads, at most 1024 (256 for n >= 256).
//   out may equal x (in place): Qwen3's per-head q/k norm is this kernel over
//   rows = tokens * heads with n = head_dim and w = the head_dim-long gain.
//
// extern "C" __global__ void rmsnorm_residual_f32(float* x, const float* add,
//                                                 const float* w, float* out, int n,
//                                                 float eps)
//   x[r] += add[r]; out[r] = rmsnorm(x[r]) * w. Same grid and block as rmsnorm_f32.
//   The residual stream x is updated in place; out may equal add but not x.
//
// The arithmetic is the CPU's (daemon/src/model/ops.rs rms_norm): f32 sum of squares,
// scale = 1 / sqrt(sum / n + eps), out = v * scale * w.
#include "common.cuh"

static __device__ __forceinline__ void normalize_row(const float* __restrict__ xr,
                                                     const float* __restrict__ w,
                                                     float* __restrict__ o, int n, float eps,
                                                     float sum_sq, float* scratch) {
    const float total = block_sum(sum_sq, scratch);
    const float scale = 1.0f / sqrtf(total / (float)n + eps);
    for (int i = threadIdx.x; i < n; i += blockDim.x) o[i] = xr[i] * scale * w[i];
}

extern "C" __global__ void rmsnorm_f32(const float* x, const float* w, float* out, int n,
                                       float eps) {
    __shared__ float scratch[32];
    const float* xr = x + (u64)blockIdx.x * n;
    float* o = out + (u64)blockIdx.x * n;
    float s = 0.0f;
    for (int i = threadIdx.x; i < n; i += blockDim.x) s += xr[i] * xr[i];
    // In place is safe: every read of a row's x above happens before the barriers in
    // block_sum, and below each thread reads x[i] before writing o[i].
    normalize_row(xr, w, o, n, eps, s, scratch);
}

extern "C" __global__ void rmsnorm_residual_f32(float* x, const float* add, const float* w,
                                                float* out, int n, float eps) {
    __shared__ float scratch[32];
    float* xr = x + (u64)blockIdx.x * n;
    const float* ar = add + (u64)blockIdx.x * n;
    float* o = out + (u64)blockIdx.x * n;
    float s = 0.0f;
    for (int i = threadIdx.x; i < n; i += blockDim.x) {
        const float v = xr[i] + ar[i];
        xr[i] = v;
        s += v * v;
    }
    // Each thread re-reads only the x[i] it wrote itself, so no barrier is needed
    // before the second pass beyond those in block_sum.
    normalize_row(xr, w, o, n, eps, s, scratch);
}
