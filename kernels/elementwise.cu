// elementwise.cu - SwiGLU gating, residual adds and bias adds on f32 buffers.
//
// extern "C" __global__ void swiglu_f32(const float* gate, const float* up, float* out,
//                                       i64 n)
//   out[i] = silu(gate[i]) * up[i], silu(g) = g / (1 + exp(-g)); out may equal gate.
// extern "C" __global__ void add_f32(float* acc, const float* x, i64 n)
//   acc[i] += x[i] (the residual stream update when it is not fused elsewhere).
// extern "C" __global__ void add_bias_f32(float* x, const float* bias, int rows, int n)
//   x[r][i] += bias[i] for rows x n (Qwen2's q/k/v biases when not fused in the mat-vec).
// All: grid any (ceil(count / 256) recommended, grid-stride loops), block 256.
#include "common.cuh"

extern "C" __global__ void swiglu_f32(const float* gate, const float* up, float* out, i64 n) {
    for (i64 i = (i64)blockIdx.x * blockDim.x + threadIdx.x; i < n;
         i += (i64)gridDim.x * blockDim.x) {
        out[i] = silu_mul(gate[i], up[i]);
    }
}

extern "C" __global__ void add_f32(float* acc, const float* x, i64 n) {
    for (i64 i = (i64)blockIdx.x * blockDim.x + threadIdx.x; i < n;
         i += (i64)gridDim.x * blockDim.x)
        acc[i] += x[i];
}

extern "C" __global__ void add_bias_f32(float* x, const float* bias, int rows, int n) {
    const i64 total = (i64)rows * n;
    for (i64 i = (i64)blockIdx.x * blockDim.x + threadIdx.x; i < total;
         i += (i64)gridDim.x * blockDim.x)
        x[i] += bias[i % n];
}
