"""Where a decode step's time goes, by kind of operation: step_ratio.py's compiled loop
(SmolLM2-135M, float32, the CPU kernels, a 256-token prompt in a 512-position cache) for
each `--cases` layout and batch, `--steps` steps traced with jax.profiler; each thunk's
time summed by what it runs (a custom call by its target: the matmul kernel, the
attention kernel; a fusion by its kind, e.g. XLA:CPU's `ynn_fusion`s), per step. The
trace's own overhead makes a traced step slower than an untimed one (the untraced ms
is beside it): read the shares, not the sum.

    python scripts/bench/step_trace.py --cases 16:1,plain:16 --out benchmarks/cpu/step_trace
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
SKIP = ("$", "Thunk", "Pjit", "Common", "end: ")  # Python frames, executor spans, waits


def by_kind(events: list[dict], hlo: str, steps: int) -> dict[str, float]:
    """ms a step for each kind of thunk in a trace's events (hlo: the program's text, to
    name a custom call by its target)."""
    target = dict(re.findall(r"%?([\w.\-]+) = .*custom-call\(.*custom_call_target=\"(\w+)\"", hlo))
    ms: collections.Counter = collections.Counter()
    for e in events:
        name = e.get("name", "")
        if e.get("ph") != "X" or name.startswith(SKIP) or name == "copy":
            continue
        ms[target.get(name, re.sub(r"\.\d+$", "", name))] += e.get("dur", 0) / 1e3 / steps
    return dict(ms.most_common())


def trace_case(model, layout: str, batch: int, steps: int) -> dict:
    """One case: its untraced ms a step (min of 3) and its traced ms a step by kind."""
    import jax
    from step_ratio import programs, time_steps

    state, loop = programs(model, layout, batch)
    untraced = min(time_steps(model, state, loop, steps) for _ in range(3))
    with tempfile.TemporaryDirectory() as d:
        with jax.profiler.trace(d, create_perfetto_trace=True):
            traced = time_steps(model, state, loop, steps)
        with gzip.open(next(Path(d).rglob("*.trace.json.gz"))) as f:
            events = json.load(f)
    events = events["traceEvents"] if isinstance(events, dict) else events
    kinds = by_kind(events, loop.as_text(), steps)
    return {"layout": layout, "batch": batch, "untraced_ms": untraced, "traced_ms": traced,
            "ms_by_kind": kinds}  # fmt: skip


def markdown(result: dict, top: int = 8) -> str:
    lines = [
        f"# Where a step's time goes ({result['cpu']}, SmolLM2-135M float32, the CPU kernels)",
        "",
        f"`{result['command']}`",
        "",
        "| step | batch | untraced ms | traced ms | by kind, traced ms a step (share) |",
        "|---|---|---|---|---|",
    ]
    for c in result["cases"]:
        total = sum(c["ms_by_kind"].values())
        kinds = "; ".join(
            f"{k} {v:.2f} ({100 * v / total:.0f} %)" for k, v in list(c["ms_by_kind"].items())[:top]
        )
        step = "plain" if c["layout"] == "plain" else f"tokens={c['layout']}"
        lines.append(
            f"| {step} | {c['batch']} | {c['untraced_ms']:.1f} | {c['traced_ms']:.1f} | {kinds} |"
        )
    return "\n".join(lines) + "\n"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--cases", default="16:1,plain:16", help="layout:batch, comma-separated")
    ap.add_argument("--steps", type=int, default=8)
    ap.add_argument("--out", default="benchmarks/cpu/step_trace")
    args = ap.parse_args()
    from machine import run_header
    from results import write_results

    import lookahead_jax as lj

    model = lj.load("smollm2-135m", weights="float", cpu_kernel=True, fuse=False)
    cases = [c.split(":") for c in args.cases.split(",")]
    result = {**run_header(), "cases": []}
    for layout, batch in cases:
        result["cases"].append(trace_case(model, layout, int(batch), args.steps))
        print(f"traced {layout} at {batch}", flush=True)
    write_results(args.out, result, markdown(result))


if __name__ == "__main__":
    main()
