# Issue 36, the second session's last device minutes (about 4): one 7B-shape figure, the
# step against T for llama2-7b in bfloat16, with the weights now drawn one tensor at a
# time (cost_curve.random_params; call5.sh's scripts printed nothing in 10 minutes, and
# XLA flagged the one-program init_params as a "very slow compile"). Each output line is
# stamped with the time, to see where the minutes go.
source scripts/gpu/env.sh
cd scripts/bench
stamp() { while IFS= read -r line; do echo "$(date +%T) $line"; done; }
date +%T
timeout 190 python3 cost_curve.py --model llama2-7b --dtype bfloat16 --batch 1 --context 512 \
    --tokens 1,16 --repeats 10 --out "$OUT/cost_curve_llama2_7b" 2>&1 | grep -v -i warning | stamp
date +%T
