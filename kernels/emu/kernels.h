// kernels.h - every kernel source under the CPU emulation, and the list of the kernels
// it provides (one place for the job runner and the stand-in driver to register from).
#pragma once
#include "cuda_emu.h"

#include "../argmax.cu"
#include "../attn_decode.cu"
#include "../attn_prefill.cu"
#include "../dequant.cu"
#include "../elementwise.cu"
#include "../embed.cu"
#include "../gemm.cu"
#include "../matvec.cu"
#include "../mmq.cu"
#include "../rmsnorm.cu"
#include "../rope_kv.cu"

// SPARKD_EMU_KERNELS(K) calls K(name) for each kernel. The stand-in driver
// (fake_libcuda.cpp) refuses to load a PTX module with an entry point missing here, so
// its tests keep this list equal to what the device build exports.
#define SPARKD_EMU_KERNELS_W(K, name) \
    K(embed_##name)                   \
    K(mmv_##name##_b1)                \
    K(mmv_##name##_b4)                \
    K(mmv_##name##_b8)                \
    K(mmv_##name##_b16)               \
    K(mmv_glu_##name##_b1)            \
    K(mmv_glu_##name##_b4)            \
    K(mmv3_##name##_b1)               \
    K(mmv3_##name##_b4)               \
    K(mmq_##name##_n8)                \
    K(mmq_##name##_n16)               \
    K(mmq_##name##_n32)               \
    K(mmq_##name##_n64)               \
    K(mmq_glu_##name##_n8)            \
    K(mmq_glu_##name##_n16)           \
    K(mmq_glu_##name##_n32)           \
    K(mmq_glu_##name##_n64)           \
    K(dequant_##name##_f16)           \
    K(dequant_##name##_bf16)
#define SPARKD_EMU_KERNELS(K)                                                   \
    SPARKD_EMU_KERNELS_W(K, f32)                                               \
    SPARKD_EMU_KERNELS_W(K, f16)                                               \
    SPARKD_EMU_KERNELS_W(K, bf16)                                              \
    SPARKD_EMU_KERNELS_W(K, q4_0)                                              \
    SPARKD_EMU_KERNELS_W(K, q4_1)                                              \
    SPARKD_EMU_KERNELS_W(K, q5_0)                                              \
    SPARKD_EMU_KERNELS_W(K, q5_1)                                              \
    SPARKD_EMU_KERNELS_W(K, q8_0)                                              \
    SPARKD_EMU_KERNELS_W(K, q2_k)                                              \
    SPARKD_EMU_KERNELS_W(K, q3_k)                                              \
    SPARKD_EMU_KERNELS_W(K, q4_k)                                              \
    SPARKD_EMU_KERNELS_W(K, q5_k)                                              \
    SPARKD_EMU_KERNELS_W(K, q6_k)                                              \
    SPARKD_EMU_KERNELS_W(K, iq4_nl)                                            \
    SPARKD_EMU_KERNELS_W(K, iq4_xs)                                            \
    K(gemm_f16) K(gemm_bf16) K(convert_f32_f16) K(convert_f32_bf16)            \
    K(rope_kv_write_f32) K(rope_kv_write_f16)                                  \
    K(attn_decode_f32) K(attn_decode_f16) K(attn_decode_reduce)                \
    K(attn_prefill_f32) K(attn_prefill_f16)                                    \
    K(attn_prefill_f16_tc_hd32) K(attn_prefill_f16_tc_hd64)                    \
    K(attn_prefill_f16_tc_hd96) K(attn_prefill_f16_tc_hd128)                   \
    K(rmsnorm_f32) K(rmsnorm_f16)                                              \
    K(swiglu_f32) K(swiglu_f16) K(argmax_f32) K(logit_bias_f32)
