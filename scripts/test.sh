#!/usr/bin/env bash
# Runs every test: the workspace's unit, integration and end-to-end tests (the real
# daemon and CLI binaries on a synthetic model, plus the default model when present),
# then the official OpenAI Python SDK against the HTTP shim.
set -euo pipefail
cd "$(dirname "$0")/.."
cargo build --workspace --bins
cargo test --workspace --no-fail-fast
if [ -x tests/openai_sdk/run.sh ]; then
  tests/openai_sdk/run.sh
fi
