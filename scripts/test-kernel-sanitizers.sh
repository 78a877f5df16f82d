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
# whole-forward tests through the emulator (graph replay under memory only). Fails
# (rather than skips) if a sanitizer is missing. Extra arguments go to `cargo test`
# (before its `--`).
set -euo pipefail
cd "$(dirname "$0")/.."
export SPARKD_REQUIRE_EMU_CHECKS=1
for check in races memory; do
    echo "== emulator under SPARKD_EMU_CHECK=$check"
    SPARKD_EMU_CHECK=$check cargo test -p sparkd-kernels \
        --test emu_checks --test emu_layers --test emu_weights "$@"
    # Graph replay is left out of the race run: it replays the launches the forward
    # tests check for races launch by launch, and what it adds (capture, replay,
    # graphs dropped with their buffers) is host logic, which the memory run and the
    # plain tests check. It is the slowest test under the race checker (~100 s).
    skip=()
    if [ "$check" = races ]; then
        skip=(--skip emulated_cuda_graphs_replay_decode_exactly_as_launch_by_launch)
    fi
    SPARKD_EMU_CHECK=$check cargo test -p sparkd --lib backend::cuda "$@" -- "${skip[@]}"
done
