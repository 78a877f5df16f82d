#!/usr/bin/env bash
# From a fresh clone to an answer: fetch the default model if missing, build, start the
# daemon (it stays resident) and answer a prompt through it.
set -euo pipefail
cd "$(dirname "$0")/.."
PROMPT="${1:-In one sentence, what is a DGX Spark?}"
scripts/fetch-default-model.sh >/dev/null
cargo build --release --bins
exec target/release/spark run "$PROMPT"
