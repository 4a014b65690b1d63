"""What a step of T tokens or B rows costs over a one-token step, per matmul build: the
issue-45 figures, all measured in one process, the builds interleaved round by round.

Builds: "xla" (lj.load(cpu_kernel=False): XLA:CPU's own matmuls and attention) and
"kernel" (the default on an x86-64 CPU: the small-M kernel over packed weights and the
cache attention kernel, models/cpu_kernel/), each in float32 and int8 weights; `--fuse`
as lj.load's (default: its own choice; "off" before stop 92). Steps: plain at batch 1
and 16, and lookahead steps of T = 2, 4, 8, 16 tokens at batch 1 (`for_tokens(T)`),
SmolLM2-135M with a 256-token prompt in a 512-position cache, `--steps` steps of the
compiled `run_loop` from a copy of one prefilled state, min and median of `--repeats`.

Beside them: a chain of the 30 layers' matrix-vector products (M = 1, XLA) over the same
weights in GB/s, and the one-token step's rate (weight bytes / step time).

    python scripts/bench/step_ratio.py --out benchmarks/cpu/step_ratio
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
PROMPT_TOKENS = 256
POSITIONS = 512


def programs(model, layout: str, batch: int):
    """The prefilled state (the prompt in the cache) and the loop compiled for it."""
    import jax.numpy as jnp

    import lookahead_jax as lj
    from lookahead_jax import decoding
    from lookahead_jax.decoding import programs as progs
    from lookahead_jax.decoding import sampling
    from lookahead_jax.decoding.decode_state import DecodeSpec

    config = None if layout == "plain" else lj.LookaheadConfig.for_tokens(int(layout))
    spec = DecodeSpec(lm=model.lm, eos_ids=(), lookahead=config, cache_dtype="float32")
    cap = POSITIONS - PROMPT_TOKENS - spec.max_emit
    rng = np.random.default_rng(0)
    prompt = rng.integers(3, model.lm.vocab_size, (batch, PROMPT_TOKENS)).astype(np.int32)
    args = (
        model.params,
        jnp.asarray(prompt),
        jnp.full((batch,), PROMPT_TOKENS, jnp.int32),
        jnp.full((batch,), cap, jnp.int32),
        jnp.asarray(np.zeros((batch, 2), np.uint32)),
        sampling.RowSampling.of([sampling.SamplingConfig()] * batch),
    )
    fns = decoding.jitted(spec, cap, None, args)
    with progs.precision_scope("float32"):
        state = fns.start.lower(*args).compile()(*args)
        loop = fns.run_loop.lower(model.params, state, jnp.int32(0), False).compile()
    return state, loop


def time_steps(model, prefilled, loop, steps: int) -> float:
    """ms per step of one run of `steps` steps from (a copy of) the prefilled state."""
    import jax
    import jax.numpy as jnp

    state = jax.block_until_ready(jax.tree.map(jnp.copy, prefilled))  # the loop donates it
    t0 = time.perf_counter()
    state = jax.block_until_ready(loop(model.params, state, jnp.int32(steps), False))
    ms = 1000 * (time.perf_counter() - t0) / steps
    assert int(state.steps.min()) == steps, "every row decodes every step"
    return ms


def weight_bytes(params) -> int:
    import jax

    return sum(x.nbytes for x in jax.tree.leaves(params))


def matvec_chain_gbps(model, repeats: int) -> float:
    """GB/s of XLA's M = 1 matmuls over every layer matrix and the LM head of the float
    model (its own arrays, one program), min over repeats."""
    import jax
    import jax.numpy as jnp

    p = model.params
    mats = [
        w.reshape(w.shape[0], -1) if w.ndim > 2 else w
        for lp in p.layers
        for w in (
            lp.wq,
            lp.wk,
            lp.wv,
            lp.wo.reshape(-1, lp.wo.shape[-1]),
            lp.w_gate,
            lp.w_up,
            lp.w_down,
        )
    ]
    head = p.embed

    @jax.jit
    def chain(x, mats, head):
        outs = [x[: w.shape[0]] @ w for w in mats]
        return outs, head @ x[: head.shape[1]]

    x = jnp.ones((max(w.shape[0] for w in mats),), jnp.float32)
    jax.block_until_ready(chain(x, mats, head))
    best = float("inf")
    for _ in range(repeats):
        t0 = time.perf_counter()
        jax.block_until_ready(chain(x, mats, head))
        best = min(best, time.perf_counter() - t0)
    total = sum(w.nbytes for w in mats) + head.nbytes
    return total / best / 1e9


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--builds", default="xla,kernel")
    ap.add_argument("--weights", default="float,int8")
    ap.add_argument("--steps", type=int, default=8)
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--out", default="benchmarks/cpu/step_ratio")
    ap.add_argument("--fuse", choices=("default", "on", "off"), default="default")
    args = ap.parse_args()

    from machine import cpu_model

    import lookahead_jax as lj

    cases = [("plain", 1), ("2", 1), ("4", 1), ("8", 1), ("16", 1), ("plain", 16)]
    models, compiled = {}, {}
    fuse = {"default": None, "on": True, "off": False}[args.fuse]
    for build in args.builds.split(","):
        for weights in args.weights.split(","):
            key = f"{build}/{weights}"
            models[key] = lj.load(
                "smollm2-135m", weights=weights, cpu_kernel=build == "kernel", fuse=fuse
            )
            for layout, batch in cases:
                if weights != "float" and layout != "plain":
                    continue  # int8: the plain step is what the issue asks of it
                compiled[(key, layout, batch)] = programs(models[key], layout, batch)
                print(f"compiled {key} {layout} B={batch}", file=sys.stderr, flush=True)
    times = {k: [] for k in compiled}
    for r in range(args.repeats + 1):
        for (key, layout, batch), (state, loop) in compiled.items():
            ms = time_steps(models[key], state, loop, args.steps)
            if r:  # the first round warms up
                times[(key, layout, batch)].append(ms)
    # the reference chain reads plain weight arrays: the xla build's (packed ones have no
    # reshape); none when only the kernel build runs
    ref_gbps = matvec_chain_gbps(models["xla/float"], 7) if "xla/float" in models else None

    rows = []
    for (key, layout, batch), ts in times.items():
        build, weights = key.split("/")
        one = times[(key, "plain", 1)]
        base = times[(f"{build}/float", "plain", 1)]
        rows.append(
            {
                "build": build,
                "weights": weights,
                "layout": layout,
                "batch": batch,
                "step_ms": {"min": min(ts), "median": float(np.median(ts))},
                "over_one_token": min(ts) / min(one),
                "over_float_plain": min(ts) / min(base),
            }
        )
    reads = {
        key: weight_bytes(m.params) / (min(times[(key, "plain", 1)]) / 1000) / 1e9
        for key, m in models.items()
    }
    result = {
        "cpu": cpu_model(),
        "matvec_chain_gbps": ref_gbps,
        "one_token_step_gbps": reads,
        "rows": rows,
        "command": " ".join(sys.argv) + f" (--fuse {args.fuse})",
    }
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.with_suffix(".json").write_text(json.dumps(result, indent=1))
    lines = [
        f"# Step cost over a one-token step ({result['cpu']}, SmolLM2-135M, 256-token prompt)",
        "",
        f"`{result['command']}`",
        "",
        "| build | weights | step | batch | ms (min / median) | over the one-token step "
        "| over float32 plain |",
        "|---|---|---|---|---|---|---|",
    ]
    for row in rows:
        step = "plain" if row["layout"] == "plain" else f"tokens={row['layout']}"
        ms = row["step_ms"]
        lines.append(
            f"| {row['build']} | {row['weights']} | {step} | {row['batch']} "
            f"| {ms['min']:.1f} / {ms['median']:.1f} | {row['over_one_token']:.2f} "
            f"| {row['over_float_plain']:.2f} |"
        )
    if ref_gbps is not None:
        lines += [
            "",
            f"A chain of XLA matrix-vector products over the same weights: {ref_gbps:.1f} GB/s. "
            "The one-token step reads its weights at: "
            + ", ".join(f"{k} {v:.1f} GB/s ({v / ref_gbps:.0%})" for k, v in reads.items())
            + ".",
        ]
    out.with_suffix(".md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
