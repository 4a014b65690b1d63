# Precision, exactness on the GPU, and the llama2-7b cost curve.
source scripts/gpu/env.sh
nvidia-smi --query-gpu=name,memory.total,driver_version,clocks.sm,clocks.mem --format=csv
python3 -c "import jax, flax, orbax.checkpoint, transformers; print('jax', jax.__version__, jax.devices(), 'flax', flax.__version__, 'transformers', transformers.__version__)"
(cd scripts/bench && timeout 200 python3 precision_check.py --out $OUT/precision) 2>&1 | grep -v Warning | tail -20
XLA_PYTHON_CLIENT_PREALLOCATE=false timeout 200 python3 -m pytest -q -x -n 4 -p no:cacheprovider \
    tests/test_lookahead_exactness.py -k "not smollm" 2>&1 | tail -15
(cd scripts/bench && timeout 280 python3 cost_curve.py --model llama2-7b --dtype bfloat16 --batch 1,8 \
    --context 512,2048 --tokens 1,2,4,8,16,32,64,128,256 --repeats 10 \
    --out $OUT/cost_curve_llama2_7b) 2>&1 | grep -v Warning | tail -45
