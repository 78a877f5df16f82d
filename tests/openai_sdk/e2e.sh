#!/usr/bin/env bash
# Runs the OpenAI Python SDK test against the real stack: a `sparkd` on the default model
# (or, when it has not been fetched, a synthetic one) and `spark serve-openai` in front of
# it on a free loopback port. Expects target/debug/{sparkd,spark} to be built.
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
bin="$root/target/debug"
for b in sparkd spark; do
    [[ -x "$bin/$b" ]] || { echo "openai e2e: $bin/$b is not built (cargo test --workspace --no-run)" >&2; exit 1; }
done
work="$(mktemp -d /tmp/sp-oai-XXXXXX)"
pids=()
cleanup() {
    for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done
    wait 2>/dev/null || true
    rm -rf "$work"
}
trap cleanup EXIT

model="${SPARKD_MODELS:-${XDG_DATA_HOME:-$HOME/.local/share}/sparkd/models}/smollm2-135m-instruct.gguf"
if [[ ! -f "$model" ]]; then
    echo "openai e2e: default model absent, using a synthetic one"
    model="$work/tiny.gguf"
    "$bin/sparkd" synth --preset tiny --out "$model" >/dev/null
fi
"$bin/sparkd" serve --model "$model" --socket "$work/s.sock" --no-pull 2>"$work/sparkd.log" &
pids+=($!)
port="$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')"
"$bin/spark" --no-start serve-openai --socket "$work/s.sock" --listen "127.0.0.1:$port" 2>"$work/shim.log" &
pids+=($!)
for _ in $(seq 1 300); do
    if curl -fsS "http://127.0.0.1:$port/health" >/dev/null 2>&1; then break; fi
    sleep 0.1
done
curl -fsS "http://127.0.0.1:$port/health" >/dev/null || {
    echo "openai e2e: the shim never became healthy" >&2
    cat "$work/sparkd.log" "$work/shim.log" >&2
    exit 1
}
OPENAI_BASE_URL="http://127.0.0.1:$port/v1" "$root/tests/openai_sdk/run.sh"
