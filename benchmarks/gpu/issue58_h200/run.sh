# Issue 58's check on a lent H200 (one session, three device calls, a fourth in a later
# one, `s79`, and three in stop 83's, `s83`, `s83-engine`, `s83`; the bundled GGUF is
# 94 MiB and a call carries at most 64 MiB, so call 1 parks half of it on the device,
# which keeps its files while warm, ~30 s between calls):
#
#   on the CPU machine, once (as scripts/gpu/smollm2_setup.py's docstring says):
#     split -b 48M <the GGUF> .gpu/part-; .gpu/1/gguf.part-aa, .gpu/2/gguf.part-ab,
#     .gpu/2/gguf.sha256, .gpu/2/tok/ (tokenizer files); .whl/ (the gguf wheel)
#   run(command="bash benchmarks/gpu/issue58_h200/run.sh tests", carry=[".gpu/1", ".whl"])
#   run(command="bash benchmarks/gpu/issue58_h200/run.sh fails", carry=[".whl"])
#   run(command="bash benchmarks/gpu/issue58_h200/run.sh engine", carry=[".gpu/2", ".whl"])
#   (stop 79) run(command="bash benchmarks/gpu/issue58_h200/run.sh s79", carry=[".whl"])
#   (stop 83) run(command="bash benchmarks/gpu/issue58_h200/run.sh s83",
#                 carry=[".gpu/1", ".whl"])
#             run(command="bash benchmarks/gpu/issue58_h200/run.sh s83-engine",
#                 carry=[".gpu/3", ".whl"])  (within ~30 s: it reads s83's /tmp/parts)
#   (the tracked tree had grown to 15.9 MB: .gpu/2 no longer fits beside it, so .gpu/3 holds
#   gguf.part-ab, gguf.sha256 and tok.tar.xz, `tar -C .gpu/2 -cJf .gpu/3/tok.tar.xz tok`)
#
# tests: the exactness tests of this issue's new paths (packed ragged prefill passes, row
# buckets, per-round auto) on the GPU, tiny models in float64 / float32.
# engine: lj.Engine on the real SmolLM2-135M (float32), plain against auto, B = 1 and 16
# (this session ran these lines inline, carry [".gpu/2", ".whl"], timeout_s 400).
set -uo pipefail
source scripts/gpu/env.sh
export XLA_FLAGS=  # the suite's CPU-only compiler flags (tests/conftest.py) stay off here
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader
case "${1:-}" in
tests)
    mkdir -p /tmp/parts && cp .gpu/1/gguf.part-aa /tmp/parts/  # for the engine call
    timeout 260 python3 -m pytest -q -p no:cacheprovider --timeout 120 --durations 10 \
        tests/test_ragged_prefill.py tests/test_engine.py tests/test_round_policies.py \
        tests/test_lookahead_exactness.py -k "not smollm2" 2>&1 | tee "$OUT/gpu_tests.log" \
        | grep -v -i warning | tail -40
    ;;
fails)  # the failures of `tests` again, with their tracebacks
    timeout 230 python3 -m pytest -q -p no:cacheprovider --timeout 100 --tb=short \
        tests/test_engine.py::test_engine_equals_plain_decoding_alone \
        tests/test_ragged_prefill.py::test_a_burst_after_warm_up_runs_as_one_ragged_pass_at_the_warmed_shape \
        tests/test_ragged_prefill.py::test_an_admission_with_cached_blocks_run_as_one_ragged_pass_keeps_the_tokens \
        2>&1 | grep -v -i warning > "$OUT/gpu_fail.log"
    grep -E "^E |Error|assert|^FAILED|passed|failed" "$OUT/gpu_fail.log" | head -60
    ;;
engine)
    python3 scripts/gpu/smollm2_setup.py /tmp/site .gpu/2/tok .gpu/2/gguf.sha256 \
        /tmp/parts/gguf.part-aa .gpu/2/gguf.part-ab || exit 1
    export XLA_PYTHON_CLIENT_MEM_FRACTION=.5
    timeout 350 python3 scripts/bench/engine_bench.py --systems engine_plain,engine_auto \
        --batches 1,16 --per-category 1 --max-new-tokens 128 --cache-dir /tmp/ljc \
        --out "$OUT/engine_h200" 2>&1 \
        | grep -v -i warning | tail -40
    ;;
s79)  # a later session (stop 79): the paths changed since, and top_k's cost on the card
    timeout 200 python3 -m pytest -q -p no:cacheprovider --timeout 120 \
        tests/test_vocab_top_k.py tests/test_guess_sources.py tests/test_engine.py \
        -k "top_k or recycl or offline_order or grows or template or table" 2>&1 \
        | grep -v -i warning | tee "$OUT/gpu_tests_s79.log" | tail -15
    timeout 150 python3 benchmarks/gpu/issue58_h200/top_k_bench.py "$OUT/top_k_h200.json" \
        2>&1 | grep -v -i warning | tail -12
    ;;
s83)  # stop 83: the paths changed since stop 79 (program keys, per-round auto's STAY and
    # hopeless rules, shared-prefix passes, online hand-backs, prefix hits), tiny models
    if [ -d .gpu/1 ]; then mkdir -p /tmp/parts && cp .gpu/1/gguf.part-aa /tmp/parts/; fi
    timeout 200 python3 -m pytest -q -p no:cacheprovider --timeout 120 -rs \
        tests/test_programs.py tests/test_round_policies.py tests/test_engine.py \
        tests/test_ragged_prefill.py tests/test_prefix_cache.py -k "key or stay or hopeless \
        or cold_tokens or come_in or waiting_for or shared_prefix or holds_more or share_cached" \
        2>&1 | grep -v -i warning | tee "$OUT/gpu_tests_s83.log" | tail -25
    # the CPU kernel's tests skip where arrays live on a GPU (tests/helpers.cpu_kernel_runs)
    python3 -m pytest -q -p no:cacheprovider -rs tests/test_cpu_kernel.py 2>&1 \
        | grep -v -i warning | tee -a "$OUT/gpu_tests_s83.log" | tail -3
    ;;
s83-engine)  # lj.Engine (offline) at one row, plain against auto, at this tree
    [ -f /tmp/parts/gguf.part-aa ] || { echo "no /tmp/parts/gguf.part-aa: s83 first" >&2; exit 1; }
    mkdir -p .gpu/2 && tar -C .gpu/2 -xJf .gpu/3/tok.tar.xz \
        && cp .gpu/3/gguf.part-ab .gpu/3/gguf.sha256 .gpu/2/ || exit 1
    python3 scripts/gpu/smollm2_setup.py /tmp/site .gpu/2/tok .gpu/2/gguf.sha256 \
        /tmp/parts/gguf.part-aa .gpu/2/gguf.part-ab || exit 1
    export XLA_PYTHON_CLIENT_MEM_FRACTION=.5
    timeout 420 python3 scripts/bench/engine_bench.py --systems engine_plain,engine_auto \
        --batches 1 --per-category 1 --max-new-tokens 128 --cache-dir /tmp/ljc \
        --out "$OUT/engine_h200_s83" 2>&1 | grep -v -i warning | tail -30
    ;;
*)
    echo "usage: bash benchmarks/gpu/issue58_h200/run.sh tests|fails|engine|s79|s83|s83-engine" >&2
    exit 2
    ;;
esac
