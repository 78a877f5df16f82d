#!/usr/bin/env bash
# CI check of the CUDA kernels for shared-memory races, without a GPU: the emulator
# tests again with the job runner built under ThreadSanitizer (SPARKD_EMU_RACECHECK=1,
# see kernels/emu/cuda_emu.h), where each emulated GPU thread is a TSan fiber and only
# __syncthreads orders memory within a block. First the emulator's self-tests (kernels
# written to race must be reported, their fixed twins must pass), then every kernel's
# tests, then the CUDA backend's whole-forward tests through the emulator. Fails
# (rather than skips) if ThreadSanitizer is missing. Extra arguments go to `cargo test`.
set -euo pipefail
cd "$(dirname "$0")/.."
export SPARKD_EMU_RACECHECK=1 SPARKD_REQUIRE_RACECHECK=1
cargo test -p sparkd-kernels --test emu_racecheck --test emu_layers --test emu_weights "$@"
cargo test -p sparkd --lib backend::cuda "$@"
