#!/usr/bin/env bash
# Fetches the real chat templates llama.cpp tests its own Jinja against (its
# models/templates/*.jinja, 70 models' templates, shipped in the llama-cpp-python sdist
# on PyPI) into ${XDG_CACHE_HOME:-~/.cache}/sparkd/chat-templates/, verified by sha256,
# and prints the folder. A no-op when they are already there. The files are the
# models' own, so they stay in the cache and are not committed.
# tests/chat_template_corpus.rs (in daemon/) renders every one of them.
set -euo pipefail
VERSION=0.3.36
SHA256=832db0699007f1be95a7e41ef12e88926b02ba836461e36a36372db2760c1a2e
URL=https://files.pythonhosted.org/packages/ec/e9/e7de2b0463ea3ffbf0ede6cb21b58c1258a8f6521aae45ca773a59fe7cf3/llama_cpp_python-$VERSION.tar.gz
ROOT="${XDG_CACHE_HOME:-$HOME/.cache}/sparkd/chat-templates"
DEST="$ROOT/llama-cpp-python-$VERSION"
if [ -f "$DEST/.complete" ]; then
  echo "$DEST"; exit 0
fi
mkdir -p "$ROOT"
WORK=$(mktemp -d "$ROOT/.fetch-XXXXXX")
trap 'rm -rf "$WORK"' EXIT
python3 - "$URL" "$WORK/sdist.tar.gz" <<'PY'
import sys, urllib.request
with urllib.request.urlopen(sys.argv[1], timeout=180) as src, open(sys.argv[2], "wb") as dst:
    while True:
        b = src.read(1 << 20)
        if not b:
            break
        dst.write(b)
PY
echo "$SHA256  $WORK/sdist.tar.gz" | sha256sum -c --status || { echo "checksum mismatch for llama-cpp-python $VERSION" >&2; exit 1; }
mkdir -p "$WORK/templates"
python3 - "$WORK/sdist.tar.gz" "$WORK/templates" <<'PY'
import os, sys, tarfile
prefix = "/vendor/llama.cpp/models/templates/"
count = 0
with tarfile.open(sys.argv[1]) as tar:
    for member in tar:
        name = member.name
        if member.isfile() and prefix in name and name.endswith(".jinja"):
            # Only the base name is used: nothing is written outside the folder.
            base = os.path.basename(name)
            with tar.extractfile(member) as src, open(os.path.join(sys.argv[2], base), "wb") as dst:
                dst.write(src.read())
            count += 1
if count < 50:
    sys.exit(f"expected the sdist's chat templates, found {count}")
PY
touch "$WORK/templates/.complete"
rm -rf "$DEST"
mv "$WORK/templates" "$DEST"
echo "$DEST"
