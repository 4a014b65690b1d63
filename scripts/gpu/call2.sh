# Why the plain 7B step runs at ~30 % of the copy bandwidth: the layer loop; and what
# 'highest' precision costs in float32.
source scripts/gpu/env.sh
cd scripts/bench
timeout 200 python3 layer_loop.py --model llama2-7b --dtype bfloat16 --unroll 1,2,4,all \
    --tokens 1,16 --out $OUT/layer_loop_llama2_7b 2>&1 | grep -v Warning | tail -12
XLA_FLAGS="--xla_dump_to=/tmp/dump --xla_dump_hlo_as_text --xla_dump_hlo_module_re=.*apply.*" \
    timeout 100 python3 layer_loop.py --model llama2-7b --dtype bfloat16 --unroll 1 --tokens 1 \
    --repeats 3 --out /tmp/ll 2>&1 | tail -1
f=$(ls -S /tmp/dump/*after_optimizations.txt | head -1); echo "$f"
cp "$f" $OUT/scan_after_optimizations.txt
grep -c "copy" "$f"; grep -E "^\s*(ROOT )?%?[a-z_.0-9-]+ = .*(copy|dynamic-slice|dynamic-update-slice)\(" "$f" | sed 's/metadata=.*//' | head -30
timeout 150 python3 precision_check.py --seeds 0 --cost-shape llama2-7b --cost-tokens 1,16,64 \
    --out $OUT/precision_cost 2>&1 | grep -v Warning | tail -8
