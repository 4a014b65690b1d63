"""auto's cost curve measured two ways, side by side in one process: on the full model,
and on its first layers run over and over in a loop to the full depth
(autotune.probe_model, what `measure_cost_curve` does for a deep model). Both the curves
(each size's step over the one-token step) and what measuring them cost (wall seconds,
compilation included).

    python scripts/bench/probe_layers.py --out benchmarks/cpu/probe_layers

SmolLM2-135M float32 (the CPU kernel where it runs), a 256-token context, batch 1; the
two ways alternate for `--rounds` rounds, each compiling its programs afresh.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--batch", type=int, default=1)
    ap.add_argument("--out", default="benchmarks/cpu/probe_layers")
    args = ap.parse_args()

    from machine import cpu_model
    from results import write_results

    import lookahead_jax as lj
    from lookahead_jax.decoding import autotune

    model = lj.load("smollm2-135m", compilation_cache=False)
    probe = autotune.probe_model(model)[0]
    if probe is model.lm:
        raise SystemExit("this model's probes are not cut")
    ways = {"full": model.lm.cfg.num_layers, "looped": probe.cfg.num_layers}
    runs = {way: [] for way in ways}
    for _ in range(args.rounds):
        for way, layers_per_pass in ways.items():
            t0 = time.perf_counter()
            probed = autotune.probe_model(model, layers_per_pass)
            curve = autotune.measure_cost_curve(model, batch=args.batch, probe=probed)
            seconds = time.perf_counter() - t0
            ratios = {t: curve[t] / curve[1] for t in sorted(curve)}
            runs[way].append({"seconds": seconds, "one_token_ms": 1e3 * curve[1], "ratios": ratios})
            print(way, f"{seconds:.1f} s", {t: round(r, 3) for t, r in ratios.items()}, flush=True)
    sizes = sorted(set.intersection(*(set(r["ratios"]) for rs in runs.values() for r in rs)))
    result = {
        "cpu": cpu_model(),
        "batch": args.batch,
        "probe": f"{probe.cfg.num_layers} layers x {probe.layer_passes}",
        "runs": runs,
        "command": "python " + " ".join(sys.argv),
    }
    names = [f"{way} {i + 1}" for i in range(args.rounds) for way in ways]
    cells = [runs[way][i] for i in range(args.rounds) for way in ways]
    lines = [
        f"# auto's cost curve: the full model's steps against {result['probe']} layers "
        f"in a loop ({result['cpu']})",
        "",
        f"`{result['command']}`",
        "",
        f"SmolLM2-135M float32, batch {args.batch}, 256-token context. Each column is one "
        "`measure_cost_curve` (compiling its programs afresh), the two ways alternating; "
        "cells are a T-token step over the one-token step.",
        "",
        "| T | " + " | ".join(names) + " |",
        "|---|" + "---|" * len(names),
    ]
    for t in sizes:
        lines.append(f"| {t} | " + " | ".join(f"{c['ratios'][t]:.3f}" for c in cells) + " |")
    lines.append("| one-token ms | " + " | ".join(f"{c['one_token_ms']:.1f}" for c in cells) + " |")
    lines.append("| **seconds** | " + " | ".join(f"{c['seconds']:.1f}" for c in cells) + " |")
    spread = {
        t: float(np.mean([c["ratios"][t] for c in runs["looped"]]))
        / float(np.mean([c["ratios"][t] for c in runs["full"]]))
        for t in sizes
    }
    result["looped_over_full"] = spread
    lines += [
        "",
        "Mean looped ratio over mean full ratio: "
        + ", ".join(f"T={t} {v:.3f}" for t, v in spread.items())
        + ".",
    ]
    write_results(args.out, result, "\n".join(lines) + "\n")


if __name__ == "__main__":
    main()
