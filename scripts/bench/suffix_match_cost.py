"""What suffix match costs a lookahead step: its proposal alone, and SmolLM2 decoding end to
end, with the best positions found by `suffix_match.largest` (rounds of argmax) against
jax.lax.top_k (which XLA:CPU lowers to a sort of the whole text), side by side in one run.

    python scripts/bench/suffix_match_cost.py --out benchmarks/cpu/suffix_match_cost

Proposal alone: B rows of S tokens of text (and M of the engine's memory, suffix_match.py),
2 continuations of 8 keyed on 4 tokens (tokens=16's suffix source). End to end:
lj.generate with --lookahead tokens=16, greedy, MT-bench prompts (chat template), each
setting run alternately `--repeats` times after a warm-up; the step's milliseconds
(stats.step_ms) as min / median.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))


def propose_ms(select, B: int, S: int, M: int, repeats: int) -> float:
    """The min over `repeats` of one compiled proposal's milliseconds."""
    import jax
    import jax.numpy as jnp
    import numpy as np

    from lookahead_jax.guesses import suffix_match as sm

    rng = np.random.default_rng(0)
    tokens = jnp.asarray(rng.integers(0, 49152, (B, M + S)), jnp.int32)
    end = jnp.full((B,), M + S - 100, jnp.int32)
    with swapped(sm, select):
        f = jax.jit(lambda t, e: sm.propose(t, e, key_max=4, span=8, count=2))
        jax.block_until_ready(f(tokens, end))
        times = []
        for _ in range(repeats):
            t0 = time.perf_counter()
            jax.block_until_ready(f(tokens, end))
            times.append(time.perf_counter() - t0)
    return 1e3 * min(times)


class swapped:
    """suffix_match.largest replaced by `select` while inside."""

    def __init__(self, module, select):
        self.module, self.select = module, select

    def __enter__(self):
        self.kept = self.module.largest
        self.module.largest = self.select

    def __exit__(self, *exc):
        self.module.largest = self.kept


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--ckpt", default="smollm2-135m")
    ap.add_argument("--batches", default="1,8")
    ap.add_argument("--max-new-tokens", type=int, default=96)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--out", default="benchmarks/cpu/suffix_match_cost")
    args = ap.parse_args()

    import jax
    from machine import run_header
    from prompts import mt_bench
    from results import write_results

    import lookahead_jax as lj
    from lookahead_jax.decoding import programs
    from lookahead_jax.guesses import suffix_match as sm

    selects = {"top_k": jax.lax.top_k, "argmax rounds": sm.largest}
    result = {**run_header(), "ckpt": args.ckpt, "proposal": [], "decode": []}
    for B, S, M in [(8, 512, 0), (8, 2048, 0), (8, 2048, 2048), (16, 2048, 2048)]:
        row = {"B": B, "S": S, "M": M}
        for name, select in selects.items():
            row[name] = propose_ms(select, B, S, M, repeats=30)
        result["proposal"].append(row)

    model = lj.load(args.ckpt)
    questions = [r["prompt"] for r in mt_bench()]
    la = lj.LookaheadConfig.for_tokens(16)
    for B in (int(b) for b in args.batches.split(",")):
        prompts = questions[:B]
        times: dict[str, list[float]] = {name: [] for name in selects}
        tokens: dict[str, list] = {}
        for select in selects.values():  # a warm-up each (its own programs)
            with swapped(sm, select):
                programs.clear()
                lj.generate(model, prompts, max_new_tokens=args.max_new_tokens, lookahead=la)
        for _ in range(args.repeats):
            for name, select in selects.items():
                with swapped(sm, select):  # compiled again (stats.step_ms leaves it out)
                    programs.clear()
                    out = lj.generate(
                        model, prompts, max_new_tokens=args.max_new_tokens, lookahead=la
                    )
                times[name].append(out.stats.step_ms)
                tokens[name] = out.token_ids
        row = {"batch": B, "same_tokens": tokens["top_k"] == tokens["argmax rounds"]}
        for name in selects:
            row[name] = {"min": min(times[name]), "median": statistics.median(times[name])}
        result["decode"].append(row)

    lines = [
        "# What suffix match costs a lookahead step: top_k against rounds of argmax",
        "",
        f"CPU: {result['cpu']} ({result['cores']} cores), JAX {result['jax']}, "
        f"{args.ckpt} float32.",
        "",
        f"Command: `{result['command']}`",
        "",
        "Proposal alone (B rows, S tokens of text, M of memory; 2 continuations of 8, "
        "keyed on 4), ms, min of 30:",
        "",
        "| B | S | M | top_k | argmax rounds |",
        "|---|---|---|---|---|",
    ]
    for r in result["proposal"]:
        lines.append(
            f"| {r['B']} | {r['S']} | {r['M']} | {r['top_k']:.2f} | {r['argmax rounds']:.2f} |"
        )
    lines += [
        "",
        f"lj.generate, --lookahead tokens=16, greedy, MT-bench prompts, "
        f"{args.max_new_tokens} new tokens, ms a step (min / median of {args.repeats}):",
        "",
        "| batch | top_k | argmax rounds | ratio (medians) | same tokens |",
        "|---|---|---|---|---|",
    ]
    for r in result["decode"]:
        a, b = r["top_k"], r["argmax rounds"]
        lines.append(
            f"| {r['batch']} | {a['min']:.1f} / {a['median']:.1f} | "
            f"{b['min']:.1f} / {b['median']:.1f} | **{b['median'] / a['median']:.2f}x** | "
            f"{r['same_tokens']} |"
        )
    write_results(args.out, result, "\n".join(lines) + "\n")


if __name__ == "__main__":
    main()
