#!/usr/bin/env bash
# Installs NVRTC and the CUDA runtime (libraries + headers) from NVIDIA's PyPI wheels
# into a cache directory, for compiling sparkd's kernels on a machine without a CUDA
# toolkit (CI). Idempotent and quiet: a second run only prints the paths.
#
# Pinned to CUDA 13.0, the oldest 13.x: NVRTC 12.x cannot target sm_121 (GB10), and the
# CI check uses the release that DGX Spark's driver ships. (sparkd loads SASS, so a
# newer 13.x NVRTC also works with that driver.)
#
# Output (stdout), one `NAME=value` line each, ready for `eval`:
#   SPARKD_NVRTC_LIB      the libnvrtc.so.13 to load
#   SPARKD_CUDA_LIB_DIR   its directory (for LD_LIBRARY_PATH)
#   SPARKD_CUDA_INCLUDE   the CUDA headers (cuda_fp16.h, nvrtc.h, ...)
# Environment: SPARKD_CACHE (default ${XDG_CACHE_HOME:-$HOME/.cache}/sparkd), PYTHON.
set -euo pipefail

CUDA_WHEEL_VERSION=13.0.88
PACKAGES=("nvidia-cuda-nvrtc==$CUDA_WHEEL_VERSION" "nvidia-cuda-runtime==$CUDA_WHEEL_VERSION")

CACHE="${SPARKD_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/sparkd}"
DEST="$CACHE/cuda-wheels/$CUDA_WHEEL_VERSION"
STAMP="$DEST/.installed"
PYTHON="${PYTHON:-python3}"

if [ ! -f "$STAMP" ] || [ "$(cat "$STAMP")" != "${PACKAGES[*]}" ]; then
  mkdir -p "$CACHE/cuda-wheels"
  WORK=$(mktemp -d "$CACHE/cuda-wheels/.install-XXXXXX")
  trap 'rm -rf "$WORK"' EXIT
  # --target keeps the wheels out of every Python environment; --no-deps because the
  # wheels' only dependencies are on each other, pinned here.
  PIP_ROOT_USER_ACTION=ignore "$PYTHON" -m pip install --quiet --disable-pip-version-check --no-input \
    --no-deps --only-binary=:all: --target "$WORK/site" "${PACKAGES[@]}" >&2
  echo "${PACKAGES[*]}" > "$WORK/site/.installed"
  rm -rf "$DEST"
  mv "$WORK/site" "$DEST"
fi

lib=$(find "$DEST" -name 'libnvrtc.so.13' -print -quit)
inc=$(find "$DEST" -name 'cuda_fp16.h' -printf '%h\n' -quit)
if [ -z "$lib" ] || [ -z "$inc" ]; then
  echo "install-cuda-wheels: $DEST lacks libnvrtc.so.13 or cuda_fp16.h; remove it and retry" >&2
  exit 1
fi
printf 'SPARKD_NVRTC_LIB=%q\n' "$lib"
printf 'SPARKD_CUDA_LIB_DIR=%q\n' "$(dirname "$lib")"
printf 'SPARKD_CUDA_INCLUDE=%q\n' "$inc"
