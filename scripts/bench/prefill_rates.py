"""The prefill's rate on the CPU (issue 58, part 1): the model's forward over a prompt
batch [B, P] through the small-M kernel (the default build: packed weights) and through
XLA's own matmuls (lj.load(cpu_kernel=False)), and offline lj.Engine runs (16 slots,
plain, 32 chat prompts: the 20 code prompts and 12 MT-bench ones, 128 new tokens) with
their prefill seconds, the positions their prefills ran and their padding: the engine's
rule (admissions cut into the prefills that pad least, at quarter-octave sides:
engine/prefill_shapes.py), the same with compiles taken as free (the cut it converges
to once the padding has paid for every shape it wants) and the rule before it (one
prefill per power-of-two bucket, emulated here): `--rules`, in one process, alternating,
each rule's engine kept across its runs (as a server keeps its own).

    python scripts/bench/prefill_rates.py --out benchmarks/cpu/prefill_rates
    python scripts/bench/prefill_rates.py --engine-only --runs 4 --out benchmarks/cpu/prefill_groups
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

from machine import run_header  # noqa: E402
from prompts import code, mt_bench  # noqa: E402
from results import write_results  # noqa: E402

SHAPES = ((1, 64), (1, 256), (4, 256), (16, 128))
GFLOP_PER_TOKEN = 0.27  # SmolLM2-135M: 2 x its weights, the LM head left out


def forward_s(model, B: int, P: int, repeats: int = 3) -> float:
    """Min seconds of the compiled forward over [B, P] random tokens (a prefill's pass:
    causal, no cache, the last position's logits)."""
    import jax
    import jax.numpy as jnp
    import numpy as np

    from lookahead_jax.decoding.decode_state import causal_mask
    from lookahead_jax.models import seam

    tokens = jnp.asarray(np.random.default_rng(0).integers(3, 40000, (B, P)), jnp.int32)
    positions = jnp.broadcast_to(jnp.arange(P, dtype=jnp.int32), (B, P))
    last = jnp.full((B, 1), P - 1, jnp.int32)

    def f(params, t, q):
        return seam.apply(model.lm, params, t, q, causal_mask(P), None, last)

    exe = jax.jit(f).lower(model.params, tokens, positions).compile()
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        jax.block_until_ready(exe(model.params, tokens, positions))
        times.append(time.perf_counter() - t0)
    return min(times)


class ByBucket:
    """The rule before prefill_shapes.groups, emulated: prefill sides are the power-of-two
    buckets, an engine run's first admission of all its slots one prefill, any other one
    prefill per bucket among its prompts."""

    def __init__(self, engine):
        from lookahead_jax.engine.prefill_shapes import PaddedShapes

        self.engine, self.first = engine, True

        def groups(shapes, kind, sides, batch, positions_per_s, ready=None):
            first, self.first = self.first, False
            if first and len(sides) == batch:  # (the state was None)
                return [list(range(batch))]
            by: dict[int, list[int]] = {}
            for i, side in enumerate(sides):
                by.setdefault(side, []).append(i)
            return list(by.values())

        engine.prefill_shapes = type("ByBucket", (PaddedShapes,), {"groups": groups})()

    def run(self):
        """A patch of the sides for one run."""
        import types
        from unittest import mock

        from lookahead_jax.engine import device_slots, inputs

        self.first = True
        sides = types.SimpleNamespace(**{**vars(inputs), "prefill_side": inputs.bucket})
        return mock.patch.object(device_slots, "inputs", sides)


def free_compiles(engine) -> None:
    """The engine's rule with every compile taken as free (the cut it converges to once
    its traffic has paid for every shape it wants), the compile seconds still counted."""
    from lookahead_jax.engine.prefill_shapes import PaddedShapes

    class Free(PaddedShapes):
        def __init__(self):
            super().__init__()
            self.compile_s = [1e-9]

        def ran(self, kind, n, side, compile_s):
            super().ran(kind, n, side, 0.0)

    engine.prefill_shapes = Free()


def engine_runs(model, rules: list[str], runs: int) -> dict:
    """`runs` offline runs of one engine per rule (its prefill shapes and the padding
    spent kept across them, as a server keeps them), the rules alternating."""
    import contextlib

    import lookahead_jax as lj

    rows = code() + mt_bench()[:12]
    ids = [model.tokenizer.encode_prompt(r.get("prompt") or r["turns"][0], chat=True) for r in rows]
    prompt_tokens = sum(map(len, ids))
    engines = {
        rule: lj.Engine(model, batch=16, max_new_tokens=128, steps_per_call=64) for rule in rules
    }
    patches = {rule: ByBucket(engines[rule]) for rule in rules if rule == "bucket"}
    if "free-compiles" in engines:
        free_compiles(engines["free-compiles"])
    out: dict[str, list[dict]] = {rule: [] for rule in rules}
    for i in range(runs):
        for rule, engine in engines.items():
            with patches[rule].run() if rule in patches else contextlib.nullcontext():
                t0 = time.perf_counter()
                list(engine.run(ids))
                wall = time.perf_counter() - t0
            s = engine.stats
            run = {
                "prompts": len(ids),
                "prompt_tokens": prompt_tokens,
                "prefill_positions": s.prefill_positions,
                "padding": 1 - prompt_tokens / s.prefill_positions,
                "prefill_calls": s.prefill_calls,
                "prefill_s": s.prefill_s,
                "compile_s": s.compile_s,
                "decode_s": s.decode_s,
                "wall_s": wall,
                "new_tokens": s.new_tokens,
                "prefill_shapes": s.prefill_shapes,
            }
            print(rule, i, run, file=sys.stderr, flush=True)
            out[rule].append(run)
    return out


RULES = {
    "least-padding": "the engine's (least padding)",
    "free-compiles": "the engine's, compiles taken as free",
    "bucket": "by bucket (before)",
}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default="benchmarks/cpu/prefill_rates")
    ap.add_argument("--engine-only", action="store_true", help="no forward table")
    ap.add_argument("--rules", default=",".join(RULES), help="engine rules, in turn")
    ap.add_argument("--runs", type=int, default=6, help="engine runs a rule")
    args = ap.parse_args()
    import lookahead_jax as lj

    result = {**run_header(), "forward": []}
    builds = ("kernel",) if args.engine_only else ("kernel", "xla")
    models = {
        build: lj.load("smollm2-135m", dtype="float32", cpu_kernel=build == "kernel")
        for build in builds
    }
    for B, P in () if args.engine_only else SHAPES:
        for build, model in models.items():
            s = forward_s(model, B, P)
            result["forward"].append({"build": build, "B": B, "P": P, "s": s})
            print(f"{build} [{B}, {P}] {s:.3f} s", file=sys.stderr, flush=True)
    result["engine"] = engine_runs(models["kernel"], args.rules.split(","), args.runs)
    lines = [f"# The prefill's rate ({result['cpu']}, SmolLM2-135M float32)", ""]
    lines += [f"`{result['command']}`", ""]
    if result["forward"]:
        lines += [
            "| [B, P] | kernel s | XLA s | kernel positions/s | XLA positions/s | kernel / XLA |",
            "|---|---|---|---|---|---|",
        ]
        rows = {(r["build"], r["B"], r["P"]): r["s"] for r in result["forward"]}
        for B, P in SHAPES:
            k, x = rows[("kernel", B, P)], rows[("xla", B, P)]
            lines.append(
                f"| [{B}, {P}] | {k:.3f} | {x:.3f} | {B * P / k:.0f} | {B * P / x:.0f} | "
                f"{k / x:.2f} |"
            )
        lines += [
            "",
            f"At {GFLOP_PER_TOKEN} GFLOP a position, 1,000 positions/s is "
            f"{GFLOP_PER_TOKEN * 1000:.0f} GFLOP/s.",
            "",
        ]
    any_run = next(iter(result["engine"].values()))[0]
    lines += [
        f"lj.Engine (16 slots, plain, the kernel build), {any_run['prompts']} chat prompts of "
        f"{any_run['prompt_tokens']} tokens, 128 new tokens; {args.runs} runs of one engine "
        "per rule (the first compiles), the rules alternating; per rule its first run, its "
        "last and the one of least prefill seconds:",
        "",
        "| prefill rule | run | prefill s | compile s | calls | positions | padding | "
        "positions/s | prompt tokens/s | decode s | wall s | shapes |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for rule, runs in result["engine"].items():
        fastest = min(range(len(runs)), key=lambda i: runs[i]["prefill_s"])
        for i in sorted({0, len(runs) - 1, fastest}):
            e = runs[i]
            shapes = ", ".join(f"{k}: {v}" for k, v in e["prefill_shapes"].items())
            lines.append(
                f"| {RULES.get(rule, rule)} | {i + 1} | {e['prefill_s']:.2f} | "
                f"{e['compile_s']:.1f} | {e['prefill_calls']} | {e['prefill_positions']} | "
                f"{e['padding']:.0%} | {e['prefill_positions'] / e['prefill_s']:.0f} | "
                f"{e['prompt_tokens'] / e['prefill_s']:.0f} | {e['decode_s']:.1f} | "
                f"{e['wall_s']:.1f} | {shapes} |"
            )
    lines += [
        "",
        "The engines share the process's compiled programs (decoding/programs.py): a shape "
        "one engine compiled runs free for the others, so once the free-compiles engine has "
        "compiled the shapes its cut wants, the engine's own rule runs them too.",
    ]
    write_results(args.out, result, "\n".join(lines) + "\n")


if __name__ == "__main__":
    main()
