# Issue 36, call B: the real SmolLM2-135M end to end on the GPU (float32): MT-bench and code
# prompts, 256 tokens, plain / auto / tokens=16 / tokens=64, every lookahead row checked
# against plain; and the step's fixed overhead at this size. Needs call5.sh's parked part.
source scripts/gpu/env.sh
mkdir -p /tmp/res && rm -rf /tmp/res/*
python3 scripts/gpu/smollm2_setup.py /tmp/site .gpu/b/tok .gpu/b/gguf.sha256 \
    /tmp/parts/gguf.part-aa .gpu/b/gguf.part-ab || exit 1
cd scripts/bench
pack() { tar czf "$OUT/results_b.tgz" -C /tmp/res .; }
run() { local t=$1; shift; echo "== $*"; timeout "$t" python3 "$@" 2>&1 | grep -v -i warning | tail -40; pack; }
run 300 bench.py --no-hf --per-category 3 --max-new-tokens 256 --repeats 2 \
    --sweep "tokens=16 tokens=64" --sweep-prompts 99 --sweep-repeats 2 --out /tmp/res/bench
run 50 step_overhead.py --model smollm2-135m --dtype float32 --batch 1 --layouts plain,16,64 \
    --prompt-len 256 --new-tokens 128 --repeats 2 --out /tmp/res/step_overhead_smollm2
