# Issue 36, call C (the one that gave benchmarks/gpu/bench_smollm2.*): call6.sh's benchmark
# again on the same warm machine, smaller (16 MT-bench + 8 code prompts, one repeat), its
# programs now in the compilation cache: call6.sh's run spent 4.6 of its 5 minutes
# compiling (30 unrolled layers, four systems, every prompt bucket) and was cut off.
source scripts/gpu/env.sh
cd scripts/bench
timeout 190 python3 bench.py --no-hf --per-category 2 --max-new-tokens 256 --repeats 1 \
    --sweep "tokens=16 tokens=64" --sweep-prompts 99 --sweep-repeats 1 \
    --out $OUT/bench_smollm2 2>&1 | grep -v -i warning | tail -45
