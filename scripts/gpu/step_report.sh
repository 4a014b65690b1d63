# Issue 49's device run (scripts/gpu/step_report.py) in two calls of about 5 minutes
# (a task has 15 device minutes, the machine's start included):
# a call carries at most 64 MiB and the bundled SmolLM2 GGUF is 94 MiB, so the first
# call parks one half of it on the device (which keeps its files while warm, ~30 s
# between calls) and the second joins them.
#
#   bash scripts/gpu/step_report.sh prepare   # on the CPU machine, once: .gpu/ and .whl/
#   run(command="bash scripts/gpu/step_report.sh 1", carry=[".gpu/1", ".whl"], timeout_s=330)
#   run(command="bash scripts/gpu/step_report.sh 2", carry=[".gpu/2", ".whl"], timeout_s=330)
#
# The follow-up the first report asked for (benchmarks/gpu/step_report_h200/README.md), in
# two calls the same way: llama3-8b's LM head at B = 1 and Triton GEMMs for float
# weights, then SmolLM2 end to end in bfloat16 and float32 with prefill and decode apart.
#
#   run(command="bash scripts/gpu/step_report.sh head", carry=[".gpu/1", ".whl"], timeout_s=320)
#   run(command="bash scripts/gpu/step_report.sh smollm2", carry=[".gpu/2", ".whl"], timeout_s=320)
#
# The check of auto's curve of whole decode steps on the card (step_report_h200/README.md),
# then SmolLM2 end to end with it, in two calls the same way (the first parks half the GGUF):
#
#   run(command="bash scripts/gpu/step_report.sh auto", carry=[".gpu/1", ".whl"], timeout_s=300)
#   run(command="bash scripts/gpu/step_report.sh smollm2", carry=[".gpu/2", ".whl"], timeout_s=320)
#
# Each call writes $OUT/step_report_N.{json,md}; a part that fails is recorded there and
# the next one runs. The parts' order puts the issue's targets first.
set -uo pipefail
case "${1:-}" in
prepare)
    set -e
    rm -rf .gpu && mkdir -p .gpu/1 .gpu/2/tok .whl
    gguf=$(.venv/bin/python -c "from lookahead_jax.checkpoints import default_model as d; print(d.gguf_path())")
    converted=$(.venv/bin/python -c "from lookahead_jax.checkpoints import default_model as d; print(d.resolve(None))")
    split -b 48M "$gguf" .gpu/part-
    mv .gpu/part-aa .gpu/1/gguf.part-aa && mv .gpu/part-ab .gpu/2/gguf.part-ab
    sha256sum "$gguf" | cut -d' ' -f1 > .gpu/2/gguf.sha256
    cp "$converted"/tokenizer*.json "$converted"/chat_template.jinja .gpu/2/tok/
    .venv/bin/python -m pip download -q --no-deps --only-binary=:all: -d .whl gguf
    du -sh .gpu/1 .gpu/2 .whl
    ;;
1)
    source scripts/gpu/env.sh
    mkdir -p /tmp/parts && cp .gpu/1/gguf.part-aa /tmp/parts/  # for call 2
    nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader
    timeout 300 python3 scripts/gpu/step_report.py --out "$OUT/step_report_1" --budget-s 230 \
        --parts device,engine,cost_curve 2>&1 | grep -v -i warning | tail -40
    ;;
head)
    source scripts/gpu/env.sh
    mkdir -p /tmp/parts && cp .gpu/1/gguf.part-aa /tmp/parts/  # for the next call
    nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader
    timeout 300 python3 scripts/gpu/step_report.py --out "$OUT/step_report_head" --budget-s 240 \
        --parts device,head,triton --main llama3-8b 2>&1 | grep -v -i warning | tail -40
    ;;
auto)
    source scripts/gpu/env.sh
    mkdir -p /tmp/parts && cp .gpu/1/gguf.part-aa /tmp/parts/  # for the next call
    nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader
    timeout 270 python3 scripts/gpu/auto_check.py --out "$OUT/auto_check" --curves steps \
        --dtypes float32,bfloat16 2>&1 | grep -v -i warning | tail -40
    ;;
smollm2)
    source scripts/gpu/env.sh
    python3 scripts/gpu/smollm2_setup.py /tmp/site .gpu/2/tok .gpu/2/gguf.sha256 \
        /tmp/parts/gguf.part-aa .gpu/2/gguf.part-ab || echo "no SmolLM2: its part is skipped"
    ckpt=$(python3 -c "from lookahead_jax.checkpoints import default_model as d; print(d.resolve(None))" 2>/dev/null)
    timeout 300 python3 scripts/gpu/step_report.py --out "$OUT/step_report_smollm2" \
        --parts device,smollm2 --smollm2-dtypes float32 --systems plain,auto,tokens=16 \
        ${ckpt:+--smollm2 "$ckpt"} 2>&1 | grep -v -i warning | tail -40
    ;;
2)
    source scripts/gpu/env.sh
    python3 scripts/gpu/smollm2_setup.py /tmp/site .gpu/2/tok .gpu/2/gguf.sha256 \
        /tmp/parts/gguf.part-aa .gpu/2/gguf.part-ab || echo "no SmolLM2: its part is skipped"
    ckpt=$(python3 -c "from lookahead_jax.checkpoints import default_model as d; print(d.resolve(None))" 2>/dev/null)
    timeout 290 python3 scripts/gpu/step_report.py --out "$OUT/step_report_2" --budget-s 220 \
        --parts device,options,profile,smollm2 ${ckpt:+--smollm2 "$ckpt"} 2>&1 | grep -v -i warning | tail -40
    ;;
*)
    echo "usage: bash scripts/gpu/step_report.sh prepare|1|2|head|auto|smollm2" >&2
    exit 2
    ;;
esac
