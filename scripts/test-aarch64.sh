#!/usr/bin/env bash
# Runs the CPU backend and quant tests (NEON kernels against their scalar twins) for
# aarch64 under QEMU. Installs the cross toolchain and QEMU when they are missing.
# Usage: scripts/test-aarch64.sh [extra test filters or args...]
set -euo pipefail
cd "$(dirname "$0")/.."

target=aarch64-unknown-linux-gnu

if ! rustup target list --installed 2>/dev/null | grep -qx "$target"; then
    echo "installing the Rust $target target" >&2
    rustup target add "$target" >/dev/null
fi

missing=()
command -v aarch64-linux-gnu-gcc >/dev/null || missing+=(gcc-aarch64-linux-gnu)
command -v qemu-aarch64 >/dev/null || missing+=(qemu-user)
[ -d /usr/aarch64-linux-gnu/lib ] || missing+=(libc6-dev-arm64-cross)
if [ ${#missing[@]} -gt 0 ]; then
    echo "installing ${missing[*]}" >&2
    sudo_cmd=()
    [ "$(id -u)" -eq 0 ] || sudo_cmd=(sudo)
    "${sudo_cmd[@]}" apt-get update -qq >/dev/null
    DEBIAN_FRONTEND=noninteractive "${sudo_cmd[@]}" apt-get install -y -qq "${missing[@]}" >/dev/null
fi

# The linker and QEMU runner come from .cargo/config.toml.
filters=("$@")
[ ${#filters[@]} -gt 0 ] || filters=(backend::cpu quant)
# The cross-test profile (Cargo.toml) builds the dependencies unoptimised: only our code
# is under test here.
exec cargo test -p sparkd --target "$target" --profile cross-test --lib -- "${filters[@]}"
