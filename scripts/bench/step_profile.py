"""Where a decoding step's time goes: a jax.profiler trace of the whole on-device loop
(`lj.generate`, random weights of a real shape), summed per device kernel.

Decodes `--new-tokens` tokens for `--batch` random prompts once to compile, then again
under the profiler, and reads the Perfetto trace the profiler writes: every event on the
device's streams, summed by kernel name and by the HLO op the kernel runs for (where the
trace names it), per decoding step. Kernels are put in classes by name (matmul, attention,
K/V update, logits/sampling, copies, other fusions) as a first reading; the per-kernel
table beside it is the evidence.

    python scripts/bench/step_profile.py --model llama3-8b --dtype bfloat16 --batch 1 \
        --context 512 --out benchmarks/gpu/step_profile_llama3_8b

Writes OUT.json (the summary) and OUT.trace.json.gz (the trace, where under 16 MB).
"""

from __future__ import annotations

import argparse
import gzip
import json
import shutil
import sys
import tempfile
from collections import defaultdict
from pathlib import Path

import jax
from cost_curve import SHAPES, bench_model
from step_overhead import random_prompts

import lookahead_jax as lj

# first match wins; names are lower-cased kernel names and HLO op names
CLASSES = [
    ("copy", ("memcpy", "memset", "copy")),
    ("matmul", ("gemm", "gemv", "cublas", "cutlass", "sm90_xmma", "dot", "matmul", "nvjet")),
    ("kv_update", ("dynamic_update_slice", "dynamic-update-slice", "scatter")),
    ("attention", ("softmax", "attention", "exp")),
    ("reduce", ("reduce", "argmax", "sort", "top_k")),
    ("while_loop", ("while", "condition")),
]


def classify(name: str, op: str) -> str:
    text = f"{name} {op}".lower()
    for cls, keys in CLASSES:
        if any(k in text for k in keys):
            return cls
    return "other_fusion"


def device_events(trace: dict) -> tuple[list[dict], dict[str, float]]:
    """(events, us per device line): the complete ('X') events on device processes (their
    process_name starts with '/device:'), each {'name', 'op', 'dur_us'}, and the total time
    on each of the device's lines (threads). On a GPU the kernels are on 'Stream' lines,
    beside derived lines (XLA modules / ops) that cover the same time: only the stream
    lines are counted where there are any."""
    events = trace["traceEvents"] if isinstance(trace, dict) else trace
    meta = [e for e in events if e.get("ph") == "M"]
    device_pids = {
        e["pid"]
        for e in meta
        if e.get("name") == "process_name"
        and str(e.get("args", {}).get("name", "")).startswith("/device:")
    }
    threads = {
        (e["pid"], e.get("tid")): str(e.get("args", {}).get("name", ""))
        for e in meta
        if e.get("name") == "thread_name" and e["pid"] in device_pids
    }
    streams = {k for k, name in threads.items() if "stream" in name.lower()}
    per_line: dict[str, float] = defaultdict(float)
    out = []
    for e in events:
        if e.get("ph") != "X" or e.get("pid") not in device_pids:
            continue
        line = (e["pid"], e.get("tid"))
        per_line[threads.get(line, str(line))] += float(e["dur"])
        if streams and line not in streams:
            continue
        args = e.get("args", {}) or {}
        op = args.get("hlo_op") or args.get("long_name") or ""
        out.append({"name": e.get("name", ""), "op": str(op), "dur_us": float(e["dur"])})
    return out, dict(per_line)


def summarize(events: list[dict], steps: int, top: int = 40) -> dict:
    by_kernel: dict[str, list[float]] = defaultdict(lambda: [0.0, 0])
    by_class: dict[str, float] = defaultdict(float)
    for e in events:
        k = by_kernel[e["name"][:160]]
        k[0] += e["dur_us"]
        k[1] += 1
        by_class[classify(e["name"], e["op"])] += e["dur_us"]
    total = sum(v[0] for v in by_kernel.values())
    kernels = sorted(by_kernel.items(), key=lambda kv: -kv[1][0])[:top]
    return {
        "device_us_per_step": total / steps,
        "kernel_launches_per_step": sum(v[1] for v in by_kernel.values()) / steps,
        "by_class_us_per_step": {c: t / steps for c, t in sorted(by_class.items())},
        "top_kernels": [
            {"name": n, "us_per_step": t / steps, "calls_per_step": c / steps}
            for n, (t, c) in kernels
        ],
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="llama3-8b", help=f"one of {', '.join(SHAPES)}")
    ap.add_argument("--dtype", default="bfloat16")
    ap.add_argument("--batch", type=int, default=1)
    ap.add_argument("--context", type=int, default=512, help="prompt tokens")
    ap.add_argument("--new-tokens", type=int, default=32)
    ap.add_argument("--layout", default="plain", help="plain or a token budget T")
    ap.add_argument("--out", default="benchmarks/gpu/step_profile")
    args = ap.parse_args()

    model = bench_model(args.model, args.dtype)
    prompts = random_prompts(model.cfg.vocab_size, args.batch, args.context)
    config = None if args.layout == "plain" else lj.LookaheadConfig.for_budget(int(args.layout))
    kw = dict(max_new_tokens=args.new_tokens, lookahead=config)
    lj.generate(model, prompts, **kw)  # compile
    warm = lj.generate(model, prompts, **kw)
    logdir = Path(tempfile.mkdtemp(prefix="step-profile-"))
    with jax.profiler.trace(str(logdir), create_perfetto_trace=True):
        r = lj.generate(model, prompts, **kw)
    steps = max(r.steps)
    found = sorted(logdir.rglob("perfetto_trace.json.gz"))
    if not found:
        raise SystemExit(f"the profiler wrote no perfetto trace under {logdir}")
    with gzip.open(found[0]) as f:
        trace = json.load(f)
    events, per_line = device_events(trace)
    summary = summarize(events, steps)
    summary["device_lines_us_per_step"] = {k: v / steps for k, v in per_line.items()}
    device = jax.devices()[0]
    record = {
        "command": " ".join(["python", *sys.argv]),
        "model": args.model,
        "dtype": args.dtype,
        "batch": args.batch,
        "context": args.context,
        "layout": args.layout,
        "device": f"{device.platform}:{device.device_kind}",
        "jax": jax.__version__,
        "steps": steps,
        "step_ms_unprofiled": warm.stats["step_ms"],
        **summary,
    }
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.with_name(out.name + ".json").write_text(json.dumps(record, indent=2) + "\n")
    if found[0].stat().st_size < 16 << 20:
        shutil.copy(found[0], out.with_name(out.name + ".trace.json.gz"))
    print(
        f"{args.model} B={args.batch} {args.layout}: {record['step_ms_unprofiled']:.2f}"
        f" ms/step (unprofiled), device {summary['device_us_per_step'] / 1000:.2f} ms/step in "
        f"{summary['kernel_launches_per_step']:.0f} kernels; by class (us/step): "
        + ", ".join(f"{c} {t:.0f}" for c, t in summary["by_class_us_per_step"].items())
    )
    for k in summary["top_kernels"][:12]:
        print(f"  {k['us_per_step']:9.1f} us x{k['calls_per_step']:5.1f}  {k['name'][:110]}")


if __name__ == "__main__":
    main()
