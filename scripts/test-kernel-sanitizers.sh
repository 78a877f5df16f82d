#!/usr/bin/env bash
# CI check of the CUDA kernels for races and out-of-bounds accesses, without a GPU: the
# emulator tests again with the job runner built under a sanitizer
# (SPARKD_EMU_CHECK, see kernels/emu/cuda_emu.h):
#   races   ThreadSanitizer; each emulated GPU thread is a TSan fiber, only
#           __syncthreads orders memory within a block, blocks run last to first;
#   memory  AddressSanitizer; buffers allocated to their exact size, shared arrays
#           with red zones; and UBSan's alignment check (the GPU's misaligned address).
# Each runs the checkers' self-tests (kernels written to break them must be reported,
# their fixed twins must pass), every kernel's tests, and the CUDA backend's
# whole-forward tests through the emulator (graph replay and the forward of each further
# weight format under memory only; see below). Fails
# (rather than skips) if a sanitizer is missing. Extra arguments go to `cargo test`
# (before its `--`).
set -euo pipefail
cd "$(dirname "$0")/.."
export SPARKD_REQUIRE_EMU_CHECKS=1
for check in races memory; do
    echo "== emulator under SPARKD_EMU_CHECK=$check"
    # --workspace, as in test-cuda-compile.sh: the build `cargo test --workspace` made.
    SPARKD_EMU_CHECK=$check cargo test --workspace \
        --test emu_checks --test emu_layers --test emu_weights "$@"
    # Left out of the race run, kept in the memory run:
    # - graph replay: it replays the launches the forward tests check launch by launch,
    #   and what it adds (capture, replay, graphs dropped with their buffers) is host
    #   logic (~100 s under the race checker);
    # - the whole forward of each further weight format: the forward is the same
    #   launches whatever the format but the weight kernels, and emu_weights above
    #   race-checks those kernels (matvec, fused gate-up, tensor-core matmul, dequant)
    #   for every format. The race run keeps a forward of Q4_0 (two layers, mmq
    #   prefill), Q4_1 (matvec only), and every architecture's and split-K's
    #   (~120 s of the race run's ~240 s on 2 cores).
    skip=()
    if [ "$check" = races ]; then
        skip=(--skip emulated_cuda_graphs_replay_decode_exactly_as_launch_by_launch)
        for format in f16 iq4_nl iq4_xs q2_k q3_k q4_k q6_k q8_0; do
            skip+=(--skip "emulated_cuda_forward_matches_the_cpu_llama_$format")
        done
    fi
    SPARKD_EMU_CHECK=$check cargo test -p sparkd --lib backend::cuda "$@" -- "${skip[@]}"
done
