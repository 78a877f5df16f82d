// elementwise.cu - SwiGLU gating of the FFN (where it is not fused into the mat-vec).
//
// extern "C" __global__ void swiglu_f32(const float* gate, const float* up, float* out,
//                                       i64 n)
//   out[i] = silu(gate[i]) * up[i], silu(g) = g / (1 + exp(-g)); out may equal gate.
// extern "C" __global__ void swiglu_f16(const float* gate, const float* up, u16* out,
//                                       i64 n)
//   The same rounded to f16: the down projection's operand on the tensor-core paths.
// Both: grid any (ceil(count / 256) recommended, grid-stride loops), block 256.
#include "common.cuh"

template <typename Out>
static __device__ void swiglu(const float* gate, const float* up, Out* out, i64 n) {
    for (i64 i = (i64)blockIdx.x * blockDim.x + threadIdx.x; i < n;
         i += (i64)gridDim.x * blockDim.x) {
        store_as(out + i, silu_mul(gate[i], up[i]));
    }
}

extern "C" __global__ void swiglu_f32(const float* gate, const float* up, float* out, i64 n) {
    pdl_enter();
    swiglu(gate, up, out, n);
}

extern "C" __global__ void swiglu_f16(const float* gate, const float* up, u16* out, i64 n) {
    pdl_enter();
    swiglu(gate, up, out, n);
}
