"""The engine's prefill time against its prefill programs alone (issue 58: the engine's
prefill within 1.25x its prompt tokens at the program's own rate): engine_bench.py's
prompts and engine (`--sets`, batch `--batch`, plain, `--max-new-tokens`), a warm-up run,
then a run whose prefills' programs and arguments are recorded; each recorded program
then runs alone `--repeats` times (min). Reports the engine's prefill_s, the programs'
own seconds, each program's positions a second, and the prompt tokens at the largest
program's rate.

    python scripts/bench/prefill_programs.py --out benchmarks/cpu/prefill_programs
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))


def recorded_run(model, ids, kw) -> tuple[dict, float, list]:
    """A run of a fresh engine (after a warm-up one) whose prefill programs are recorded:
    (its stats, its seconds, [(program, args)])."""
    import lookahead_jax as lj
    from lookahead_jax.engine import device_slots

    list(lj.Engine(model, **kw).run(ids))  # warm-up: every shape compiled
    calls, compiled = [], device_slots.DeviceSlots._compiled

    def recording(self, new_positions, args, name):
        exe, secs = compiled(self, new_positions, args, name)
        if name != "start":
            return exe, secs

        def run(*a):
            calls.append((exe, a))
            return exe(*a)

        return run, secs

    device_slots.DeviceSlots._compiled = recording
    try:
        engine = lj.Engine(model, **kw)
        t = time.perf_counter()
        list(engine.run(ids))
        seconds = time.perf_counter() - t
    finally:
        device_slots.DeviceSlots._compiled = compiled
    return engine.stats.as_dict(), seconds, calls


def positions(args) -> tuple[str, int]:
    """A prefill's kind and positions from its arguments (prefill_args.rows' prompt
    [n, P], then a RaggedPrompts [1, Tr] where it is a ragged pass)."""
    from lookahead_jax.decoding.decode_state import RaggedPrompts

    ragged = next((a for a in args if isinstance(a, RaggedPrompts)), None)
    if ragged is not None:
        return f"ragged [{args[1].shape[0]} rows, {ragged.tokens.shape[1]}]", ragged.tokens.shape[1]
    n, P = args[1].shape
    return f"prompt [{n}, {P}]", n * P


def alone(calls: list, repeats: int) -> list[dict]:
    """Each recorded program run alone: its kind and shape, positions, min seconds."""
    import jax

    out = []
    for exe, args in calls:
        best = float("inf")
        for _ in range(repeats):
            t = time.perf_counter()
            jax.block_until_ready(exe(*args))
            best = min(best, time.perf_counter() - t)
        shape, n = positions(args)
        out.append({"shape": shape, "positions": n, "seconds": best})
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sets", default="code")
    ap.add_argument("--batch", type=int, default=16)
    ap.add_argument("--max-new-tokens", type=int, default=128)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--out", default="benchmarks/cpu/prefill_programs")
    args = ap.parse_args()
    from engine_bench import pick_prompts
    from machine import run_header
    from results import write_results

    import lookahead_jax as lj

    model = lj.load("smollm2-135m")
    rows = pick_prompts(0, args.sets)
    ids = [model.tokenizer.encode_prompt(r["prompt"], chat=True) for r in rows]
    kw = dict(batch=args.batch, max_new_tokens=args.max_new_tokens, lookahead=None)
    kw["steps_per_call"] = 64  # (engine_bench's)
    stats, seconds, calls = recorded_run(model, ids, kw)
    programs = alone(calls, args.repeats)
    tokens, own = sum(map(len, ids)), sum(p["seconds"] for p in programs)
    largest = max(programs, key=lambda p: p["positions"])
    rate = largest["positions"] / largest["seconds"]  # positions a second
    result = {**run_header(), "run_s": seconds, "prefill_s": stats["prefill_s"], "programs_s": own,
              "prompt_tokens": tokens, "positions": stats["prefill_positions"],
              "largest_rate": rate, "programs": programs}  # fmt: skip
    table = "\n".join(
        f"| {p['shape']} | {p['positions']} | {p['seconds']:.3f} | "
        f"{p['positions'] / p['seconds']:.0f} |"
        for p in programs
    )
    md = (
        f"# The engine's prefill against its programs alone ({result['cpu']})\n\n"
        f"`{result['command']}`\n\n"
        f"Engine run {seconds:.2f} s; prefill_s {stats['prefill_s']:.2f} s; its prefill "
        f"programs alone {own:.2f} s (**{stats['prefill_s'] / own:.2f}x**); {tokens} prompt "
        f"tokens in {result['positions']} positions; the prompt tokens at the largest "
        f"program's rate ({rate:.0f} positions/s): {tokens / rate:.2f} s, the engine's "
        f"prefill_s **{stats['prefill_s'] * rate / tokens:.2f}x** that.\n\n"
        f"| prefill | positions | alone, s (min) | positions/s |\n|---|---|---|---|\n{table}\n"
    )
    write_results(args.out, result, md)


if __name__ == "__main__":
    main()
