#!/usr/bin/env bash
# End-to-end test of the web page `spark serve-openai` serves at `/`, in headless Chromium
# driven by playwright-core: a real daemon on a synthetic model, the real shim, a real browser.
#
# Builds nothing: it expects target/debug/sparkd and target/debug/spark (or under
# $CARGO_TARGET_DIR). Installs what it needs itself: Debian's chromium (apt, when root) and
# playwright-core (npm, cached). Prints `N passed, M failed`; exits non-zero on failure.
#   SPARKD_CACHE      where node_modules is cached (default ~/.cache/sparkd)
#   SPARKD_TEST_OUT   where the screenshots go (default target/test-output)
#   CHROMIUM          the browser (default /usr/bin/chromium)
set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
root="$(cd "$here/../.." && pwd)"
cd "$root"

say() { echo "browser test: $*" >&2; }
die() { say "$*"; exit 2; }

bin="${CARGO_TARGET_DIR:-target}/debug"
for exe in sparkd spark; do
    [[ -x "$bin/$exe" ]] || die "$bin/$exe is missing; build it first: cargo test --workspace --no-run"
done
"$bin/spark" serve-openai --help >/dev/null 2>&1 \
    || die "$bin/spark has no serve-openai subcommand; rebuild it: cargo build -p spark-client"

# --- what the test needs -------------------------------------------------------------------

apt_install() {
    [[ "$(id -u)" == 0 ]] || die "$* missing; install it (apt-get install $*) or run as root"
    say "installing $* (apt)"
    DEBIAN_FRONTEND=noninteractive apt-get update -qq >/dev/null
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "$@" >/dev/null
}

chromium="${CHROMIUM:-/usr/bin/chromium}"
[[ -x "$chromium" ]] || apt_install chromium
[[ -x "$chromium" ]] || die "no browser at $chromium"
command -v node >/dev/null && command -v npm >/dev/null || apt_install nodejs npm
command -v curl >/dev/null || apt_install curl
node_major="$(node -p 'process.versions.node.split(".")[0]')"
(( node_major >= 20 )) || die "playwright-core needs Node.js 20 or newer (found $(node --version))"

# playwright-core only, from the committed lock; never a browser download.
modules="${SPARKD_CACHE:-$HOME/.cache/sparkd}/browser-node"
stamp="$modules/.lock.sha256"
want="$(cat "$here/package.json" "$here/package-lock.json" | sha256sum | cut -d' ' -f1)"
if [[ "$(cat "$stamp" 2>/dev/null)" != "$want" || ! -d "$modules/node_modules/playwright-core" ]]; then
    say "installing playwright-core into $modules (npm)"
    mkdir -p "$modules"
    cp "$here/package.json" "$here/package-lock.json" "$modules/"
    (cd "$modules" && PLAYWRIGHT_SKIP_BROWSER_DOWNLOAD=1 npm ci --silent --no-audit --no-fund >/dev/null)
    echo "$want" > "$stamp"
fi

out="${SPARKD_TEST_OUT:-target/test-output}"
mkdir -p "$out"
out="$(cd "$out" && pwd)"

# --- daemon and shim -----------------------------------------------------------------------

tmp="$(mktemp -d "${TMPDIR:-/tmp}/sparkd-browser.XXXXXX")"
pids=()
cleanup() {
    local status=$?
    for pid in "${pids[@]}"; do kill "$pid" 2>/dev/null || true; done
    for pid in "${pids[@]}"; do wait "$pid" 2>/dev/null || true; done
    if (( status != 0 )) && [[ -d "$tmp" ]]; then
        for log in "$tmp"/*.log; do
            [[ -s "$log" ]] && { say "--- $(basename "$log") (last lines)"; tail -n 20 "$log" >&2; }
        done
    fi
    rm -rf "$tmp"
    exit "$status"
}
trap cleanup EXIT
trap 'exit 130' INT
trap 'exit 143' TERM

# The tiny preset with more layers: same small vocabulary and context, but slow enough
# (tens of ms a token instead of a fraction of one) that a long answer can be stopped midway.
"$bin/sparkd" synth --preset tiny --layers 96 --out "$tmp/tiny.gguf" >/dev/null
"$bin/sparkd" serve --model "$tmp/tiny.gguf" --socket "$tmp/s.sock" >"$tmp/sparkd.log" 2>&1 &
pids+=($!)

port="$(node -e 'const s = require("net").createServer().listen(0, "127.0.0.1", () => { console.log(s.address().port); s.close(); })')"
api_key="browser-test-$RANDOM$RANDOM"
base="http://127.0.0.1:$port"
env -u SPARKD_API_KEY "$bin/spark" --no-start serve-openai --listen "127.0.0.1:$port" --socket "$tmp/s.sock" \
    --api-key "$api_key" >"$tmp/shim.log" 2>&1 &
pids+=($!)

for _ in $(seq 1 150); do
    curl -fsS -o /dev/null "$base/health" 2>/dev/null && break
    for pid in "${pids[@]}"; do kill -0 "$pid" 2>/dev/null || die "the daemon or the shim exited early"; done
    sleep 0.2
done
curl -fsS -o /dev/null "$base/health" || die "$base/health did not answer 200 within 30 s"

# The random model often ends an answer after a few tokens, faster than anyone can press
# stop; the stop check bans these end-of-generation tokens (logit_bias) for its long answer.
end_tokens="$("$bin/spark" --socket "$tmp/s.sock" --no-start tokenize --special --json '<|im_end|><|endoftext|>' \
    | grep -o '^\[[0-9,]*\]')" || die "cannot tokenize the end-of-generation tokens"

# --- the test ------------------------------------------------------------------------------

END_TOKENS="$end_tokens" BASE_URL="$base" API_KEY="$api_key" CHROMIUM="$chromium" OUT_DIR="$out" \
    NODE_MODULES_DIR="$modules/node_modules" USER_DATA_DIR="$tmp/chromium-profile" \
    node "$here/web_chat.test.mjs"
