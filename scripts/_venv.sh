# Sourced by the scripts: create .venv and install the project (with test tools) when missing or
# when pyproject.toml changed since the last install.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
VENV="${CTXPROXY_VENV:-$ROOT/.venv}"
PYTHON="${PYTHON:-python3}"
stamp="$VENV/.ctxproxy-installed"
want="$(sha256sum "$ROOT/pyproject.toml" | cut -d' ' -f1)"
if [ ! -x "$VENV/bin/python" ] || [ "$(cat "$stamp" 2>/dev/null)" != "$want" ]; then
  echo "ctxproxy: setting up $VENV (one-time)..." >&2
  "$PYTHON" -m venv "$VENV"
  "$VENV/bin/python" -m pip install --quiet --upgrade pip >&2
  "$VENV/bin/python" -m pip install --quiet -e "$ROOT[test]" >&2
  echo "$want" > "$stamp"
fi
export LITELLM_LOCAL_MODEL_COST_MAP=True
# A start compiles every module without cached bytecode, and with PYTHONDONTWRITEBYTECODE set (common in
# containers and CI) none is ever written: ~0.5 s of each start of the proxy here. Compile the package
# (only what changed since; pip does the same for installed packages).
if [ -n "${PYTHONDONTWRITEBYTECODE:-}" ]; then
  "$VENV/bin/python" -m compileall -q "$ROOT/proxy" >/dev/null || true
fi
