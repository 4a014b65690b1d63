#!/usr/bin/env bash
# Set up (first run only) and generate with lookahead decoding on the bundled SmolLM2-135M.
# Extra arguments go to the CLI, e.g.: scripts/demo.sh --prompt "Write a limerick" --json
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup_env.sh
export HF_HUB_OFFLINE=1
if [ $# -eq 0 ]; then
  set -- --stream --color --max-new-tokens 200 \
    --prompt "Write a Python function that checks whether a string is a palindrome, then explain it."
fi
exec .venv/bin/python -m lookahead_jax.generate "$@"
