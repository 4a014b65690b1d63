# The figures with the fix (cuBLAS matmuls): cost curves, step overhead, compile times.
source scripts/gpu/env.sh
cd scripts/bench
for m in llama2-7b llama3-8b; do
  timeout 170 python3 cost_curve.py --model $m --dtype bfloat16 --batch 1,8 --context 512,2048 \
      --tokens 1,2,4,8,16,32,64,128,256 --repeats 10 --out $OUT/cost_curve_${m/-/_} 2>&1 \
      | grep "plain step\|T= *16 \|T= *64 " | sed 's/fraction_of/\n   fraction_of/' | cut -c1-200
done
timeout 190 python3 step_overhead.py --model llama2-7b --dtype bfloat16 --batch 1,8 \
    --layouts plain,8,16,32,64 --new-tokens 64 --repeats 2 --cache-label cold \
    --out $OUT/step_overhead_llama2_7b 2>&1 | grep -v Warning | tail -12
timeout 60 python3 step_overhead.py --model llama2-7b --dtype bfloat16 --batch 1 \
    --layouts plain,16,64 --new-tokens 64 --repeats 1 --cache-label warm \
    --out $OUT/step_overhead_llama2_7b_warm 2>&1 | grep -v Warning | tail -4
