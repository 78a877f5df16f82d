//! The CPU backend: quantized matrix kernels (scalar, AVX2, NEON) and the thread pool.
