"""The command line's default against plain decoding on code prompts, as a user runs it:
`python -m lookahead_jax.generate --prompt P --chat --json` (auto) and the same with
`--no-lookahead`, each a fresh process (JAX's persistent compilation cache warm), the two
modes alternating, min and median of `--repeats`.

    python scripts/bench/cli_code.py --out benchmarks/cpu/cli_code

Reported per prompt: tokens/s as the CLI reports it (new tokens / (prefill_s + decode_s)),
its prefill_s beside the prefill program's own time (the compiled `start` program for
that prompt, run again after a first run in one process, with the CLI's XLA flags: what
a prefill costs once everything around it is paid), load_s, compile_s, the call's wall
time (process start to exit), and auto's choice.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
ROOT = HERE.parents[1]


def cli(prompt: str, mode: list[str], max_new: int) -> dict:
    cmd = [sys.executable, "-m", "lookahead_jax.generate", "--prompt", prompt, "--chat",
           "--max-new-tokens", str(max_new), "--json", *mode]  # fmt: skip
    t = time.perf_counter()
    out = subprocess.run(
        cmd, capture_output=True, text=True, cwd=ROOT, env=dict(os.environ, HF_HUB_OFFLINE="1")
    )
    if out.returncode != 0:
        raise SystemExit(out.stderr[-3000:])
    return {**json.loads(out.stdout), "wall_s": time.perf_counter() - t}


def program_seconds(prompts: list[str], max_new: int, repeats: int = 3) -> list[float]:
    """Each prompt's compiled prefill program (plain `start`, batch 1, its bucket, the
    CLI's S), min over runs after a first one, in this process."""
    from lookahead_jax.cli.generate import one_shot_xla_flags

    # the CLI's own flags (it turns XLA:CPU's YNN fusions off for a single prompt), set
    # before JAX starts its backend here
    one_shot_xla_flags()
    import jax
    import numpy as np

    import lookahead_jax as lj
    from lookahead_jax.decoding import programs
    from lookahead_jax.decoding.decode_state import DecodeSpec
    from lookahead_jax.decoding.sampling import RowSampling, SamplingConfig
    from lookahead_jax.engine import inputs
    from lookahead_jax.engine.device_slots import DeviceSlots
    from lookahead_jax.engine.stats import Stats

    model = lj.load("smollm2-135m")
    spec = DecodeSpec(lm=model.lm, eos_ids=tuple(model.eos_ids), cache_dtype="float32")
    out = []
    for p in prompts:
        ids = inputs.encode_prompts(model, [p], True)[0]
        P = inputs.bucket(len(ids))
        device = DeviceSlots(model, 1, spec, inputs.bucket(max_new), P, Stats(batch=1))
        start, _ = programs.compiled(model, spec, device.new_positions, device.loop_args(), "start")
        prompt = np.zeros((1, P), np.int32)
        prompt[0, : len(ids)] = ids
        sampling = RowSampling.of([SamplingConfig()], [False], [False])
        args = (model.params, prompt, np.array([len(ids)], np.int32),
                np.array([max_new], np.int32), np.zeros((1, 2), np.uint32), sampling)  # fmt: skip
        times = []
        for _ in range(repeats + 1):
            t = time.perf_counter()
            jax.block_until_ready(start(*args))
            times.append(time.perf_counter() - t)
        out.append(min(times[1:]))
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--prompts", default="1,5,9,13,17", help="code.jsonl ids")
    ap.add_argument("--max-new-tokens", type=int, default=192)
    ap.add_argument("--repeats", type=int, default=2)
    ap.add_argument("--out", default="benchmarks/cpu/cli_code")
    args = ap.parse_args()

    from machine import run_header
    from prompts import code
    from results import write_results

    wanted = [int(i) for i in args.prompts.split(",")]
    rows = [r for r in code() if int(r["id"]) in wanted]
    result = {**run_header(), "max_new_tokens": args.max_new_tokens, "rows": []}
    modes = {"auto": [], "plain": ["--no-lookahead"]}
    cli(rows[0]["prompt"], [], 8)  # a first call: auto's measurement, compiles cached
    for r in rows:
        runs = {m: [] for m in modes}
        for _ in range(args.repeats):
            for m, flags in modes.items():
                runs[m].append(cli(r["prompt"], flags, args.max_new_tokens))
        row = {"id": r["id"], "category": r["category"]}
        for m, rs in runs.items():
            row[m] = {
                k: {"min": min(x[k] for x in rs), "median": statistics.median(x[k] for x in rs)}
                for k in ("tokens_per_s", "prefill_s", "compile_s", "decode_s", "load_s", "wall_s")
            }
            row[m]["new_tokens"] = rs[0]["new_tokens"]
            row[m]["steps"] = rs[0]["steps"]
            row[m]["chosen"] = rs[0]["config"].get("lookahead_auto", {}).get("chosen")
        row["same_tokens"] = runs["auto"][0]["token_ids"] == runs["plain"][0]["token_ids"]
        result["rows"].append(row)
        print(json.dumps(row), flush=True)
    programs_s = program_seconds([r["prompt"] for r in rows], args.max_new_tokens)
    for row, secs in zip(result["rows"], programs_s, strict=True):
        row["prefill_program_s"] = secs
    lines = [
        "# The CLI's default against --no-lookahead on code prompts",
        "",
        f"CPU: {result['cpu']} ({result['cores']} cores), JAX {result['jax']}, SmolLM2-135M "
        f"float32, {args.max_new_tokens} new tokens, `--chat --json`, each run a fresh process "
        f"(compilation cache warm), the modes alternating; medians of {args.repeats}.",
        "",
        f"Command: `{result['command']}`",
        "",
        "| prompt | auto's choice | plain tokens/s | auto tokens/s | auto / plain | prefill_s "
        "plain, auto | prefill program s | load_s plain, auto | compile_s plain, auto | "
        "wall s plain, auto | same tokens |",
        "|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    ratios = []
    for row in result["rows"]:
        p, a = row["plain"], row["auto"]
        ratio = a["tokens_per_s"]["median"] / p["tokens_per_s"]["median"]
        ratios.append(ratio)
        lines.append(
            f"| {row['id']} ({row['category']}) | {a['chosen']} | "
            f"{p['tokens_per_s']['median']:.1f} | {a['tokens_per_s']['median']:.1f} | "
            f"**{ratio:.2f}x** | {p['prefill_s']['median']:.2f}, {a['prefill_s']['median']:.2f} | "
            f"{row['prefill_program_s']:.2f} | {p['load_s']['median']:.2f}, "
            f"{a['load_s']['median']:.2f} | {p['compile_s']['median']:.2f}, "
            f"{a['compile_s']['median']:.2f} | {p['wall_s']['median']:.2f}, "
            f"{a['wall_s']['median']:.2f} | {row['same_tokens']} |"
        )
    result["geomean"] = statistics.geometric_mean(ratios)
    lines += ["", f"Geometric mean auto / plain: **{result['geomean']:.2f}x**."]
    write_results(args.out, result, "\n".join(lines) + "\n")


if __name__ == "__main__":
    main()
