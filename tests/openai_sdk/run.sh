#!/usr/bin/env bash
# Runs the official `openai` Python SDK against a running `spark serve-openai`.
#   OPENAI_BASE_URL  the shim's /v1 URL (default http://127.0.0.1:8080/v1)
#   OPENAI_API_KEY   the shim's --api-key, if it has one
#   SPARKD_CACHE     where the virtualenv is cached (default ~/.cache/sparkd)
set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
venv="${SPARKD_CACHE:-$HOME/.cache/sparkd}/venv-openai"
stamp="$venv/.requirements.sha256"
want="$(sha256sum "$here/requirements.txt" | cut -d' ' -f1)"

if [[ ! -x "$venv/bin/python" ]]; then
    python3 -m venv "$venv"
fi
# Reinstall only when the pinned requirements changed since the venv was filled.
if [[ "$(cat "$stamp" 2>/dev/null)" != "$want" ]]; then
    "$venv/bin/python" -m pip install --quiet --disable-pip-version-check -r "$here/requirements.txt"
    echo "$want" > "$stamp"
fi

exec "$venv/bin/python" "$here/test_shim.py" "$@"
