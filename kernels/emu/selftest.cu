// selftest.cu - kernels that exist only to test the emulator itself (the job runner
// registers them; the device build and the stand-in driver never see them): each is a
// small, deliberate instance of a synchronisation bug, or its fixed twin, that the
// emulator must catch or pass. tests/emu_checks.rs runs them.
//
// Every kernel takes `out` (one float per thread of the grid) and runs on blocks of 64.

// Each thread writes its slot, then reads its neighbour's with no barrier: a race.
extern "C" __global__ void selftest_shared_unsynced(float* out) {
    __shared__ float s[64];
    const int t = threadIdx.x;
    s[t] = (float)(blockIdx.x * 64 + t);
    out[blockIdx.x * 64 + t] = s[(t + 1) % 64];
}

// The same with the barrier: no race, in every block (blocks reuse the array).
extern "C" __global__ void selftest_shared_synced(float* out) {
    __shared__ float s[64];
    const int t = threadIdx.x;
    s[t] = (float)(blockIdx.x * 64 + t);
    __syncthreads();
    out[blockIdx.x * 64 + t] = s[(t + 1) % 64];
}

// Warp-synchronous exchange through shared memory, ordered only by a shuffle (which
// exchanges values, not memory): a race on sm_70+, and one here.
extern "C" __global__ void selftest_shared_after_shuffle(float* out) {
    __shared__ float s[64];
    const int t = threadIdx.x;
    s[t] = (float)t;
    const float v = __shfl_xor_sync(0xffffffffu, (float)t, 1);
    out[blockIdx.x * 64 + t] = s[t ^ 1] + 0.0f * v;
}

// A write after the last barrier to what another thread read before it: a race
// (write-after-read), caught in whichever order the threads run.
extern "C" __global__ void selftest_shared_write_after_read(float* out) {
    __shared__ float s[64];
    const int t = threadIdx.x;
    s[t] = (float)t;
    __syncthreads();
    const float v = s[63 - t];
    s[t] = v * 2.0f;
    out[blockIdx.x * 64 + t] = v;
}

// cp.async into shared memory, committed, then a barrier but no wait: the copy has not
// landed, so the reads see what was there before (zeros here).
extern "C" __global__ void selftest_cp_async_unwaited(const float* in, float* out) {
    __shared__ __align__(16) float s[64 * 4];
    const int t = threadIdx.x;
    s[4 * t] = 0.0f;
    __syncthreads();
    cp_async16(&s[4 * t], &in[4 * (blockIdx.x * 64 + t)], 16);
    cp_async_commit();
    __syncthreads();
    out[blockIdx.x * 64 + t] = s[4 * ((t + 1) % 64)];
}

// The same with the wait before the barrier: each thread reads its neighbour's copy.
extern "C" __global__ void selftest_cp_async_waited(const float* in, float* out) {
    __shared__ __align__(16) float s[64 * 4];
    const int t = threadIdx.x;
    cp_async16(&s[4 * t], &in[4 * (blockIdx.x * 64 + t)], 16);
    cp_async_commit();
    cp_async_wait<0>();
    __syncthreads();
    out[blockIdx.x * 64 + t] = s[4 * ((t + 1) % 64)];
}

// Each block reads what the block before it wrote, in global memory: right only if the
// blocks run in order, which a GPU does not promise.
extern "C" __global__ void selftest_blocks_chained(float* out) {
    const int t = threadIdx.x, b = blockIdx.x;
    out[b * 64 + t] = b == 0 ? (float)t : out[(b - 1) * 64 + t] + 1.0f;
}

// One element past the input (`in` holds one float per thread of the grid).
extern "C" __global__ void selftest_global_past_end(const float* in, float* out) {
    const int g = blockIdx.x * 64 + threadIdx.x;
    out[g] = in[g + 1];
}

// An L2 prefetch of the input and one float more (`in`: one float per thread); the GPU
// would ignore it, the memory checker reports it.
extern "C" __global__ void selftest_prefetch_past_end(const float* in, float* out) {
    const int g = blockIdx.x * 64 + threadIdx.x;
    prefetch_weights_l2(in, (u64)(gridDim.x * 64 + 1) * 4);
    out[g] = in[g];
}

// The same within the input, from an address that is not line-aligned (rounded down
// to the buffer's start).
extern "C" __global__ void selftest_prefetch_in_bounds(const float* in, float* out) {
    const int g = blockIdx.x * 64 + threadIdx.x;
    prefetch_weights_l2(in + 1, (u64)(gridDim.x * 64 - 1) * 4);
    out[g] = in[g];
}

// One element past a shared array, behind a correct barrier.
extern "C" __global__ void selftest_shared_past_end(float* out) {
    __shared__ float s[64];
    const int t = threadIdx.x;
    s[t] = (float)t;
    __syncthreads();
    out[blockIdx.x * 64 + t] = s[t + 1];
}

// Half the lanes shuffle at one call site, half at another: divergent *_sync calls.
extern "C" __global__ void selftest_shuffle_divergent(float* out) {
    const int t = threadIdx.x;
    float v;
    if (t & 1)
        v = __shfl_xor_sync(0xffffffffu, (float)t, 2);
    else
        v = __shfl_xor_sync(0xffffffffu, (float)t, 2);
    out[blockIdx.x * 64 + t] = v;
}

// The upper half of each warp has returned; the lower half reads from it.
extern "C" __global__ void selftest_shuffle_from_exited(float* out) {
    const int t = threadIdx.x;
    if (t % 32 >= 16) return;
    out[blockIdx.x * 64 + t] = __shfl_xor_sync(0xffffffffu, (float)t, 16);
}

// The fixed twin: every lane shuffles at one call site, with its neighbour.
extern "C" __global__ void selftest_shuffle_uniform(float* out) {
    const int t = threadIdx.x;
    out[blockIdx.x * 64 + t] = __shfl_xor_sync(0xffffffffu, (float)t, 1);
}

// A warp-wide mma with one lane gone.
extern "C" __global__ void selftest_mma_partial_warp(float* out) {
    const int t = threadIdx.x;
    if (t % 32 == 31) return;
    float d[4] = {0, 0, 0, 0};
    const unsigned a[4] = {0, 0, 0, 0};
    mma_16816<false>(d, a, 0u, 0u);
    out[blockIdx.x * 64 + t] = d[0];
}

// A float4 load one float past an aligned address (`in`: one float per thread and 3).
extern "C" __global__ void selftest_misaligned_vector_load(const float* in, float* out) {
    const int g = blockIdx.x * 64 + threadIdx.x;
    const float4 v = *(const float4*)(in + 4 * (g / 4) + 1);
    out[g] = v.x;
}

// cp.async from an address 4 bytes past a 16-byte boundary.
extern "C" __global__ void selftest_cp_async_misaligned(const float* in, float* out) {
    __shared__ __align__(16) float s[64 * 4];
    const int t = threadIdx.x;
    cp_async16(&s[4 * t], &in[4 * (blockIdx.x * 64 + t) + 1], 16);
    cp_async_commit();
    cp_async_wait<0>();
    out[blockIdx.x * 64 + t] = s[4 * t];
}

#define SPARKD_EMU_SELFTEST_KERNELS(K)                                                    \
    K(selftest_shared_unsynced) K(selftest_shared_synced) K(selftest_shared_after_shuffle) \
    K(selftest_shared_write_after_read) K(selftest_cp_async_unwaited)                     \
    K(selftest_cp_async_waited) K(selftest_blocks_chained) K(selftest_global_past_end)    \
    K(selftest_shared_past_end) K(selftest_shuffle_divergent) K(selftest_shuffle_from_exited)   \
    K(selftest_shuffle_uniform) K(selftest_mma_partial_warp) K(selftest_misaligned_vector_load)  \
    K(selftest_cp_async_misaligned) K(selftest_prefetch_past_end) K(selftest_prefetch_in_bounds)
