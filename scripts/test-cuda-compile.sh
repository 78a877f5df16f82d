#!/usr/bin/env bash
# CI check of the CUDA kernels without a GPU: installs NVRTC 13.0 from PyPI wheels (once,
# cached) and runs the sparkd-kernels tests with it, which compile every kernel module
# to SASS for sm_90 and sm_121, require a log free of diagnostics, check the kernel list,
# and require ptxas to report no register spills; checks the stand-in driver library's
# module and launch rules directly; then runs the real sparkd binary on `--device cuda`
# with that library (the emulator behind the CUDA driver API). Fails (rather than skips)
# if NVRTC cannot load.
# Extra arguments go to `cargo test`.
set -euo pipefail
cd "$(dirname "$0")/.."
eval "$(scripts/install-cuda-wheels.sh)"
export SPARKD_NVRTC_LIB SPARKD_CUDA_INCLUDE
export SPARKD_REQUIRE_NVRTC=1
# Only the NVRTC test: the emulator tests already ran in `cargo test --workspace`.
# `--workspace` with a target filter, not `-p`: selecting one package resolves features
# for it alone, and the different feature set rebuilds sparkd and the e2e crate (~70 s
# on 2 cores) instead of reusing what `cargo test --workspace` built.
cargo test --workspace --test nvrtc_compile --test fake_driver_rules "$@"
# Then the real sparkd on `--device cuda` through the stand-in driver
# (kernels/emu/fake_libcuda.cpp): gpu-parity, the daemon, and unusable-GPU errors.
# `cargo test --no-run`, not `cargo build`: the binaries with the tests' features, which
# `cargo test --workspace` already built (see scripts/test.sh), so this is a no-op in CI.
cargo test --workspace --no-run
cargo test --workspace --test cuda_fake_driver "$@"
