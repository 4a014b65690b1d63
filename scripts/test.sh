#!/usr/bin/env bash
# Set up (first run only) and run the whole test suite, lint included.
# Extra arguments go to pytest, e.g.: scripts/test.sh -k exactness -x
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup_env.sh test
export HF_HUB_OFFLINE=1
.venv/bin/ruff check .
.venv/bin/ruff format --check .
.venv/bin/lint-imports --no-cache  # the layers contract (pyproject.toml)
# One pytest worker per core, at most 4 (each holds its own models and compiled programs);
# LOOKAHEAD_JAX_TEST_WORKERS=0 runs in this process.
cores="$(nproc 2>/dev/null || getconf _NPROCESSORS_ONLN)"  # nproc: Linux; getconf: macOS
workers="${LOOKAHEAD_JAX_TEST_WORKERS:-$(( cores < 4 ? cores : 4 ))}"
# --durations: the slowest tests in every log, CI's included (the suite's budget is 15 min)
# --dist loadfile: a file's tests run in one worker, so its module fixtures are made once
# and its tests share the programs they compile (most tests of a file use the same shapes);
# --no-loadscope-reorder: files go out in collection order, the longest first
# (tests/conftest.py's LONGEST_FILES), not xdist's most-tests-first;
# --max-worker-restart 0: a worker that dies (or a test past pytest-timeout's limit)
# ends the run at once with its name, where replacing it hung stop 76's CI to its limit
exec .venv/bin/python -m pytest -q -n "$workers" --dist loadfile --no-loadscope-reorder \
    --max-worker-restart 0 --durations=25 "$@"
