"""Time to first token at concurrency 1 against its floor (issue 34's target: TTFT <= the
prefill plus one device round).

For each prompt (chat, as serve_bench.py sends it), in this process: the prefill alone
(`lj.generate` with one new token: its `prefill_s`, compile excluded) and one device round
(`stream_steps` plain steps, from a 32-token decode's `step_ms`); then, through
`python -m lookahead_jax.serve --batch 1 --no-lookahead` in a subprocess, the streamed
request's TTFT (sending to the first chunk with text), after a warm-up pass. The server
sends the prefill's token as soon as the prefill ends, so TTFT - prefill is what the HTTP
layer, the queue and the engine's thread hand-over add.

    python scripts/bench/ttft_bench.py --per-category 1 --out benchmarks/cpu/ttft
"""

from __future__ import annotations

import argparse
import asyncio
import os
import signal
import sys
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--ckpt", default="smollm2-135m")
    ap.add_argument("--sets", default="mt_bench,code")
    ap.add_argument("--per-category", type=int, default=1, help="0: every prompt")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--out", default="benchmarks/cpu/ttft")
    args = ap.parse_args()

    import jax
    from machine import cpu_model
    from prompts import select
    from results import write_results
    from serve_bench import drive, start_server

    import lookahead_jax as lj
    from lookahead_jax.cli.serve import build_parser

    rows_ = select(args.sets.split(","), args.per_category)
    prompts = [r["prompt"] for r in rows_]
    stream_steps = build_parser().get_default("stream_steps")  # the server's default
    model = lj.load(args.ckpt)
    local = []
    for p in prompts:
        lj.generate(model, [p], max_new_tokens=1, chat=True, lookahead=None)  # compile
        prefill = min(
            lj.generate(model, [p], max_new_tokens=1, chat=True, lookahead=None).stats["prefill_s"]
            for _ in range(args.repeats)
        )
        step_ms = lj.generate(model, [p], max_new_tokens=32, chat=True, lookahead=None).stats[
            "step_ms"
        ]
        local.append({"prefill_s": prefill, "round_s": stream_steps * step_ms / 1000})
    del model
    proc, url = start_server(args.ckpt, 1, "plain", 32)
    try:
        asyncio.run(drive(url, prompts, 1, 1))  # warm-up: every prompt bucket compiles
        runs = [asyncio.run(drive(url, prompts, 1, 8)) for _ in range(args.repeats)]
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.wait(timeout=120)
    rows = []
    for i, (p, loc) in enumerate(zip(prompts, local, strict=True)):
        ttft = min(run["requests"][i]["ttft_s"] for run in runs)
        floor = loc["prefill_s"] + loc["round_s"]
        label = " ".join(p[:60].replace("`", "").split())  # one line in the table
        rows.append({"prompt": label, **loc, "ttft_s": ttft, "within": ttft <= floor})
    result = {
        "command": "python " + " ".join(sys.argv),
        "cpu": cpu_model(),
        "cores": os.cpu_count(),
        "jax": jax.__version__,
        "stream_steps": stream_steps,
        "rows": rows,
        "within": f"{sum(r['within'] for r in rows)}/{len(rows)}",
    }
    med = {k: float(np.median([r[k] for r in rows])) for k in ("prefill_s", "round_s", "ttft_s")}
    lines = [
        "# Time to first token against the prefill plus one round (concurrency 1)",
        "",
        f"`{result['command']}` — CPU: {result['cpu']} ({result['cores']} cores), jax "
        f"{result['jax']}, {args.ckpt}, plain, server `--batch 1`, min of {args.repeats} "
        f"repeats per prompt; a round is {stream_steps} steps (the server's stream_steps).",
        "",
        f"TTFT within prefill + one round: **{result['within']}** prompts; medians: "
        f"prefill {1000 * med['prefill_s']:.0f} ms, round {1000 * med['round_s']:.0f} ms, "
        f"TTFT {1000 * med['ttft_s']:.0f} ms.",
        "",
        "| prompt | prefill | one round | TTFT | TTFT - prefill | within |",
        "|---|---|---|---|---|---|",
    ]
    for r in rows:
        lines.append(
            f"| {r['prompt'].replace('|', '/')!s} | {1000 * r['prefill_s']:.0f} ms | "
            f"{1000 * r['round_s']:.0f} ms | {1000 * r['ttft_s']:.0f} ms | "
            f"{1000 * (r['ttft_s'] - r['prefill_s']):.0f} ms | {'yes' if r['within'] else 'no'} |"
        )
    write_results(args.out, result, "\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
