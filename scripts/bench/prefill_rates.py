"""The prefill's rate on the CPU (issue 58, part 1): the model's forward over a prompt
batch [B, P] through the small-M kernel (the default build: packed weights) and through
XLA's own matmuls (lj.load(cpu_kernel=False)), and an offline lj.Engine run (16 slots,
plain, 32 chat prompts: the 20 code prompts and 12 MT-bench ones, 128 new tokens) with
its prefill seconds, the positions its prefills ran and their padding.

    python scripts/bench/prefill_rates.py --out benchmarks/cpu/prefill_rates
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


def engine_run(model) -> dict:
    """The second of two offline runs (the first compiles), with a prefill timer."""
    import lookahead_jax as lj
    from lookahead_jax.engine.device_slots import DeviceSlots

    rows = code() + mt_bench()[:12]
    ids = [model.tokenizer.encode_prompt(r.get("prompt") or r["turns"][0], chat=True) for r in rows]
    slots: list = []
    init = DeviceSlots.__init__

    def keep(self, *a, **k):
        init(self, *a, **k)
        slots.append(self)

    DeviceSlots.__init__ = keep
    try:
        for _ in range(2):
            slots.clear()
            engine = lj.Engine(model, batch=16, max_new_tokens=128, steps_per_call=64)
            t0 = time.perf_counter()
            list(engine.run(ids))
            wall = time.perf_counter() - t0
    finally:
        DeviceSlots.__init__ = init
    s, prompt_tokens = engine.stats, sum(map(len, ids))
    return {
        "prompts": len(ids),
        "prompt_tokens": prompt_tokens,
        "prefilled_positions": slots[0].prefilled_positions,
        "padding": 1 - prompt_tokens / slots[0].prefilled_positions,
        "prefill_calls": s.prefill_calls,
        "prefill_s": s.prefill_s,
        "decode_s": s.decode_s,
        "wall_s": wall,
        "new_tokens": s.new_tokens,
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default="benchmarks/cpu/prefill_rates")
    args = ap.parse_args()
    import lookahead_jax as lj

    result = {**run_header(), "forward": []}
    models = {
        build: lj.load("smollm2-135m", dtype="float32", cpu_kernel=build == "kernel")
        for build in ("kernel", "xla")
    }
    for B, P in SHAPES:
        for build, model in models.items():
            s = forward_s(model, B, P)
            result["forward"].append({"build": build, "B": B, "P": P, "s": s})
            print(f"{build} [{B}, {P}] {s:.3f} s", file=sys.stderr, flush=True)
    result["engine"] = engine_run(models["kernel"])
    lines = [
        f"# The prefill's rate ({result['cpu']}, SmolLM2-135M float32)",
        "",
        f"`{result['command']}`",
        "",
        "| [B, P] | kernel s | XLA s | kernel positions/s | XLA positions/s | kernel / XLA |",
        "|---|---|---|---|---|---|",
    ]
    rows = {(r["build"], r["B"], r["P"]): r["s"] for r in result["forward"]}
    for B, P in SHAPES:
        k, x = rows[("kernel", B, P)], rows[("xla", B, P)]
        lines.append(
            f"| [{B}, {P}] | {k:.3f} | {x:.3f} | {B * P / k:.0f} | {B * P / x:.0f} | {k / x:.2f} |"
        )
    e = result["engine"]
    lines += [
        "",
        f"At {GFLOP_PER_TOKEN} GFLOP a position, 1,000 positions/s is "
        f"{GFLOP_PER_TOKEN * 1000:.0f} GFLOP/s.",
        "",
        f"lj.Engine (16 slots, plain, the kernel build), {e['prompts']} chat prompts of "
        f"{e['prompt_tokens']} tokens, 128 new tokens, the second of two runs: prefill "
        f"{e['prefill_s']:.1f} s in {e['prefill_calls']} calls over "
        f"{e['prefilled_positions']} positions ({e['padding']:.0%} padding: "
        f"{e['prefilled_positions'] / e['prefill_s']:.0f} positions/s), decode "
        f"{e['decode_s']:.1f} s, wall {e['wall_s']:.1f} s, {e['new_tokens']} new tokens.",
    ]
    write_results(args.out, result, "\n".join(lines) + "\n")


if __name__ == "__main__":
    main()
