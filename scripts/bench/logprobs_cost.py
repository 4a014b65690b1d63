"""What logprobs cost the requests that do not ask for them (issue 47): the online engine
(as the server runs it) over the same prompts three ways, interleaved round by round:

  off     Engine(max_logprobs=None): no logprob buffers or code in the programs
  unused  Engine(max_logprobs=20), the server's default: the buffers, and a predicate a
          step; no request asks
  one     the same engine, one request of the batch asks `logprobs` 5 (its tokens'
          logprobs and top-5 alternatives computed in every step it is in)

SmolLM2-135M float32, greedy, lookahead auto (tuned once, then fixed: the same layout in
every run), batch 8, the first --prompts MT-bench first turns, --max-new-tokens each.
Reported: the other requests' (those that never ask) tokens per second, best and median
over --repeats (the machine is shared: the best is the least disturbed), and whether
every request's tokens equal the "off" run's.

    python scripts/bench/logprobs_cost.py --out benchmarks/cpu/logprobs_cost
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
os.environ.setdefault("HF_HUB_OFFLINE", "1")

WAYS = ("off", "unused", "one")


def run_once(engine, prompts, asks_one: bool, max_new: int):
    """One online batch: every prompt submitted, rounds until done. Returns ({id: tokens},
    seconds, the new tokens of requests 1.. (those that never ask))."""
    import lookahead_jax as lj

    results = {}

    def listener(update):
        if update.result is not None:
            results[update.id] = update.result

    t = time.perf_counter()
    for i, p in enumerate(prompts):
        logprobs = 5 if asks_one and i == 0 else None
        engine.submit(lj.Request(p, id=i, max_new_tokens=max_new, logprobs=logprobs), listener)
    while engine.round():
        pass
    seconds = time.perf_counter() - t
    others = sum(len(r.token_ids) for i, r in results.items() if i != 0)
    return {i: r.token_ids for i, r in results.items()}, seconds, others


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--prompts", type=int, default=8)
    ap.add_argument("--max-new-tokens", type=int, default=128)
    ap.add_argument("--repeats", type=int, default=9)
    ap.add_argument("--out", required=True)
    args = ap.parse_args()

    import jax
    from machine import cpu_model
    from prompts import mt_bench
    from results import write_results

    import lookahead_jax as lj
    from lookahead_jax.decoding import autotune
    from lookahead_jax.guesses.lookahead_config import max_step_tokens

    model = lj.load("smollm2-135m")
    prompts = [r["prompt"] for r in mt_bench()[: args.prompts]]
    batch = len(prompts)
    limit = max_step_tokens(model.lm.max_context)
    layout = autotune.AutoRun(model, lj.SamplingConfig(), limit, batch=batch).config
    common = dict(batch=batch, max_new_tokens=args.max_new_tokens, lookahead=layout,
                  chat=True, sampled=False, max_prompt_tokens=512)  # fmt: skip
    engines = {
        "off": lj.Engine(model, max_logprobs=None, **common),
        "unused": lj.Engine(model, **common),
    }
    engines["one"] = engines["unused"]
    for way in WAYS:  # warm-up: every program compiled
        run_once(engines[way], prompts, way == "one", args.max_new_tokens)
    rates = {way: [] for way in WAYS}
    same = True
    reference = None
    for _ in range(args.repeats):
        for way in WAYS:
            tokens, seconds, others = run_once(
                engines[way], prompts, way == "one", args.max_new_tokens
            )
            reference = reference or tokens
            same &= tokens == reference
            rates[way].append(others / seconds)
    rows = {
        way: {"best_tok_s": max(r), "median_tok_s": statistics.median(r), "runs": r}
        for way, r in rates.items()
    }
    best, median = rows["off"]["best_tok_s"], rows["off"]["median_tok_s"]
    lines = [
        "# What logprobs cost the requests that do not ask",
        "",
        f"Command: `python scripts/bench/logprobs_cost.py --out {args.out}` "
        f"({args.prompts} MT-bench prompts, {args.max_new_tokens} new tokens, batch {batch}, "
        f"{args.repeats} repeats, interleaved).",
        f"CPU: {cpu_model()} ({os.cpu_count()} cores), jax {jax.__version__}, SmolLM2-135M "
        f"float32, greedy, lookahead {layout.name if layout else 'plain'} (auto's choice, fixed).",
        "",
        "Tokens/s: the new tokens of requests 1..7 (which never ask; request 0 asks in "
        "`one`) over the seconds of the whole batch.",
        "",
        "| engine | best tok/s | median tok/s | best / off | median / off |",
        "|---|---:|---:|---:|---:|",
    ]
    for way, row in rows.items():
        lines.append(
            f"| {way} | {row['best_tok_s']:.1f} | {row['median_tok_s']:.1f} | "
            f"{row['best_tok_s'] / best:.3f} | {row['median_tok_s'] / median:.3f} |"
        )
    lines += ["", f"Every run's tokens equal the first run's: {same}."]
    result = {
        "cpu": cpu_model(),
        "layout": layout.name if layout else None,
        "batch": batch,
        "max_new_tokens": args.max_new_tokens,
        "repeats": args.repeats,
        "same_tokens": same,
        "ways": rows,
    }
    write_results(args.out, result, "\n".join(lines) + "\n")


if __name__ == "__main__":
    main()
