#!/usr/bin/env bash
# Set up (first run only) and run the whole test suite, lint included.
# Extra arguments go to pytest, e.g.: scripts/test.sh -k exactness -x
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup_env.sh test
export HF_HUB_OFFLINE=1
.venv/bin/ruff check .
.venv/bin/ruff format --check .
exec .venv/bin/python -m pytest -q "$@"
