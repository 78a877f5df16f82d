#!/usr/bin/env bash
# `systemd-analyze verify` on the unit files, with ExecStart pointed at the built binary
# (verify checks that the executable exists). Skips visibly when the tool is absent.
set -euo pipefail
cd "$(dirname "$0")/.."
if ! command -v systemd-analyze >/dev/null; then
    echo "skipping: systemd-analyze not found"
    exit 0
fi
bin="${1:-$PWD/target/debug/sparkd}"
[[ -x "$bin" ]] || { echo "verify-units: $bin is not built" >&2; exit 1; }
work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT
sed "s#/usr/local/bin/sparkd#$bin#" systemd/sparkd.service > "$work/sparkd.service"
cp systemd/sparkd.socket "$work/"
out="$(SYSTEMD_LOG_LEVEL=notice systemd-analyze verify "$work/sparkd.socket" "$work/sparkd.service" 2>&1)" || {
    echo "$out" >&2; exit 1; }
if [[ -n "$out" ]]; then echo "$out" >&2; exit 1; fi
echo "systemd units verified"
