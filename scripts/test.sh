#!/usr/bin/env bash
# Runs every test: the workspace's unit, integration and end-to-end tests (the real
# daemon and CLI binaries on a synthetic model, plus the default model when present),
# then the official OpenAI Python SDK against the HTTP shim.
set -euo pipefail
cd "$(dirname "$0")/.."
cargo build --workspace --bins
cargo test --workspace --no-fail-fast
tests/openai_sdk/e2e.sh
tests/browser/run.sh
scripts/verify-units.sh
