"""Where a CPU decode step's time goes: a jax.profiler trace of the compiled loop (as
lj.generate compiles it: step_ratio.programs, SmolLM2-135M float32, a 256-token prompt in
a 512-position cache) for a plain step at batch 1 and 16 and a 16-token lookahead step at
batch 1, its XLA:CPU ops summed by kind: the CPU kernels' calls (`ffi_call`: the small-M
matmuls and the cache attention; the largest of them, the LM head, apart), XLA's fusions
by their kind of name, per step.

    python scripts/bench/step_profile.py --out benchmarks/cpu/step_profile
"""

from __future__ import annotations

import argparse
import collections
import gzip
import json
import re
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

from machine import run_header  # noqa: E402
from results import write_results  # noqa: E402
from step_ratio import programs, time_steps  # noqa: E402

CASES = (("plain", 1), ("plain", 16), ("16", 1))
# host-side and enclosing events: not ops
SKIP = re.compile(r"^(\$|ThunkExecutor|while|end: |PjitFunction|CommonPjRt)")


def op_kind(name: str) -> str:
    """An XLA:CPU op's kind: its name without the instance number (fusion.12 -> fusion)."""
    return "ffi_call" if name.startswith("ffi_call") else re.sub(r"[._]?\d+$", "", name)


def profile(model, loop, state, steps: int) -> dict:
    import jax
    import jax.numpy as jnp

    s = jax.block_until_ready(jax.tree.map(jnp.copy, state))
    with tempfile.TemporaryDirectory() as logdir:
        with jax.profiler.trace(logdir, create_perfetto_trace=True):
            jax.block_until_ready(loop(model.params, s, jnp.int32(steps), False))
        with gzip.open(sorted(Path(logdir).rglob("perfetto_trace.json.gz"))[0]) as f:
            trace = json.load(f)
    events = trace["traceEvents"] if isinstance(trace, dict) else trace
    ops = collections.defaultdict(lambda: [0.0, 0])
    for e in events:
        if e.get("ph") == "X" and not SKIP.match(e.get("name", "")):
            ops[e["name"]][0] += e.get("dur", 0) / 1000 / steps  # ms a step
            ops[e["name"]][1] += 1 / steps
    kinds = collections.defaultdict(lambda: [0.0, 0.0])
    for name, (ms, calls) in ops.items():
        kinds[op_kind(name)][0] += ms
        kinds[op_kind(name)][1] += calls
    ffi = sorted(((ms, n) for n, (ms, _) in ops.items() if n.startswith("ffi_call")), reverse=True)
    return {
        "by_kind": {
            k: {"ms": v[0], "calls": v[1]}
            for k, v in sorted(kinds.items(), key=lambda kv: -kv[1][0])
        },
        "largest_ffi_call_ms": ffi[0][0] if ffi else 0.0,
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=8)
    ap.add_argument("--out", default="benchmarks/cpu/step_profile")
    args = ap.parse_args()
    import lookahead_jax as lj

    model = lj.load("smollm2-135m", dtype="float32", fuse=False)
    result = {**run_header(), "cases": []}
    for layout, batch in CASES:
        state, loop = programs(model, layout, batch)
        times = [time_steps(model, state, loop, args.steps) for _ in range(4)][1:]
        case = {"layout": layout, "batch": batch, "step_ms_min": min(times)}
        case.update(profile(model, loop, state, args.steps))
        result["cases"].append(case)
        print(f"{layout} B={batch}: {min(times):.1f} ms", file=sys.stderr, flush=True)
    lines = [
        f"# Where a CPU step's time goes ({result['cpu']}, SmolLM2-135M float32)",
        "",
        f"`{result['command']}`: ms a step from a jax.profiler trace of {args.steps} steps "
        "of the compiled loop (ops summed by kind; the largest CPU-kernel call, the LM head, "
        "also apart). Step times: min of 3 untraced runs (a traced run's sums can exceed "
        "them: the profiler's own cost).",
        "",
        "| step | ms a step | CPU kernels (ffi_call) | of which the LM head "
        "| next kinds (ms, calls a step) |",
        "|---|---|---|---|---|",
    ]
    for c in result["cases"]:
        kinds = c["by_kind"]
        ffi = kinds.get("ffi_call", {"ms": 0.0, "calls": 0})
        others = [(k, v) for k, v in kinds.items() if k != "ffi_call"][:4]
        label = "plain" if c["layout"] == "plain" else f"tokens={c['layout']}"
        lines.append(
            f"| {label}, B = {c['batch']} | {c['step_ms_min']:.1f} | {ffi['ms']:.1f} "
            f"({ffi['calls']:.0f} calls) | {c['largest_ffi_call_ms']:.1f} | "
            + ", ".join(f"{k} {v['ms']:.2f} ({v['calls']:.0f})" for k, v in others)
            + " |"
        )
    write_results(args.out, result, "\n".join(lines) + "\n")


if __name__ == "__main__":
    main()
