# The layer loop without copies: XLA's dynamic-slice fusion (cuBLAS reads the layer's
# slice of the stacked weights in place) against full unrolling; and the GEMV path.
source scripts/gpu/env.sh
cd scripts/bench
timeout 420 python3 layer_loop.py --model llama2-7b --dtype bfloat16 --unroll 1 --tokens 1,16 \
    --options '[{"xla_gpu_enable_dynamic_slice_fusion": true}, {"xla_gpu_enable_dynamic_slice_fusion": true, "xla_gpu_enable_triton_gemm": false}, {"xla_gpu_enable_triton_gemm": false}, {"xla_gpu_enable_while_loop_double_buffering": true}]' \
    --out $OUT/layer_loop_options 2>&1 | grep -v Warning | tail -12
timeout 150 python3 layer_loop.py --model llama2-7b --dtype bfloat16 --unroll all --tokens 1,16 \
    --options '[{"xla_gpu_enable_triton_gemm": false}]' \
    --out $OUT/layer_loop_unrolled_options 2>&1 | grep -v Warning | tail -4
