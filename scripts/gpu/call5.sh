# Issue 36, call A: the 7B/8B shapes (random weights) after issue 33's cache layout: where a
# plain step's time goes (profile), the step against T, int8 against bfloat16, the loop's
# copies in the GPU program, the engine at batch.
# Issue 36's run gave these scripts 35-50 s each and none printed a figure (random-weight
# init and the unrolled 32-layer compiles take longer on the device): the budgets below
# fill one 10-minute call; the B=8 cost curve is left for a second call.
source scripts/gpu/env.sh
mkdir -p /tmp/res
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader
python3 -c "import jax, flax; print('jax', jax.__version__, jax.devices(), 'flax', flax.__version__)"
cd scripts/bench
pack() { tar czf "$OUT/results_a.tgz" -C /tmp/res .; }
run() { local t=$1; shift; echo "== $*"; timeout "$t" python3 "$@" 2>&1 | grep -v -i warning | tail -16; pack; }
run 100 step_profile.py --model llama3-8b --dtype bfloat16 --batch 1 --context 512 \
    --new-tokens 32 --out /tmp/res/step_profile_llama3_8b
run 120 cost_curve.py --model llama3-8b --dtype bfloat16 --batch 1 --context 512 \
    --tokens 1,16,64 --repeats 10 --out /tmp/res/cost_curve_llama3_8b
run 100 weights_step.py --model llama2-7b --dtype bfloat16 --tokens 1,16 --repeats 10 \
    --out /tmp/res/weights_step_llama2_7b
run 60 loop_copies.py --versions current=../.. --shape llama2-7b --dtype bfloat16 --batches 8 --layouts plain,16 \
    --out /tmp/res/loop_copies_llama2_7b
run 180 engine_shapes.py --model llama2-7b --dtype bfloat16 --batches 1,8,32,64 \
    --layouts plain,16 --out /tmp/res/engine_llama2_7b
