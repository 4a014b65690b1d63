# Sourced by a device-machine run (the earlier ones, scripts/gpu/call1.sh … call8.sh, retired
# after 8008873: `git show 8008873:scripts/gpu/call5.sh`): the gguf wheel carried in .whl,
# this checkout on PYTHONPATH (nothing there can be installed from an index).
export PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1 LOOKAHEAD_JAX_CACHE=/tmp/ljc
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
    --target /tmp/site .whl/*.whl >/dev/null 2>&1 || echo "no wheels installed"
export PYTHONPATH=/tmp/site:$PWD
OUT=${OUT:-benchmarks/gpu}
mkdir -p "$OUT"
