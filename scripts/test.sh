#!/usr/bin/env bash
# Runs every test: the workspace's unit, integration and end-to-end tests (the real
# daemon and CLI binaries on a synthetic model, plus the default model when present),
# then the official OpenAI Python SDK against the HTTP shim.
set -euo pipefail
cd "$(dirname "$0")/.."
# No separate `cargo build --bins` first: `cargo test --workspace` builds the `sparkd` and
# `spark` binaries itself (their packages have integration tests), with the same features
# as the tests. A plain `cargo build` resolves features without the dev-dependencies
# (serde_json, hashbrown, regex-syntax... end up with other features), so it compiled
# sparkd and half its dependencies a second time: about 3 minutes of a CI run on 2 cores.
cargo test --workspace --no-fail-fast
tests/openai_sdk/e2e.sh
tests/browser/run.sh
scripts/verify-units.sh
