"""The cost curve on accelerators: whole decode steps, not bare forwards.

cost_curve.py times one forward pass of T tokens. On a CPU that is the step: its
drafting, verification and pool updates are small beside the matmuls (Intel Xeon,
SmolLM2-135M: a 16-token forward probed at 2.09x a one-token one, the loop's 16-token
step at 1.94x: benchmarks/cpu/step_ratio_xeon_avx512). On a GPU a small model's forward
is a few hundred microseconds and the step's own work — many small kernels, each a
launch — costs more than the forward: on an H200 the probe put a 64-token layout at
1.66x a plain step and the loop ran it at 3.3x, so `auto` chose it and decoded at 0.75x
plain (benchmarks/gpu/step_report_h200/step_report_smollm2.md). There the curve is the
decode loop's own step: for each T, the layout `auto` would run at T tokens a step
(LookaheadConfig.for_tokens), prefilled once and stepped STEPS steps a loop call, over `batch`
rows of random tokens (no EOS: every row steps every time), on the probe model
(cost_curve.probe_model: the first layers looped, as the forwards are).
"""

from __future__ import annotations

import time

import jax
import jax.numpy as jnp
import numpy as np

from lookahead_jax.decoding import loop, programs, sampling
from lookahead_jax.decoding.decode_state import DecodeSpec
from lookahead_jax.guesses.lookahead_config import LookaheadConfig
from lookahead_jax.models.bundle import float_dtype

STEPS = 16  # steps a timing runs (one loop call)


def layout_for(tokens: int) -> LookaheadConfig | None:
    """The layout `auto` runs at `tokens` tokens a step (None: plain, T = 1)."""
    if tokens == 1:
        return None
    config = LookaheadConfig.for_tokens(tokens)
    if config.tokens_per_step != tokens:  # (autotune probes only sizes that some layout runs)
        raise ValueError(f"no LookaheadConfig.for_tokens layout runs {tokens} tokens a step")
    return config


def loop_step_s(lm, params, tokens: int, context: int, batch: int, repeats: int) -> float:
    """Seconds of one decode step (the fastest of `repeats` loop calls of STEPS steps,
    after one untimed) of the layout running `tokens` tokens a step, `batch` rows,
    `context` prompt tokens each."""
    dtype = str(float_dtype(params))
    spec = DecodeSpec(lm=lm, eos_ids=(), lookahead=layout_for(tokens), cache_dtype=dtype)
    new_positions = (repeats + 1) * STEPS * spec.max_emit + 8
    rng = np.random.default_rng(3)
    args = (
        params,
        jnp.asarray(rng.integers(0, lm.vocab_size, (batch, context), np.int32)),
        jnp.full((batch,), context, jnp.int32),
        jnp.full((batch,), new_positions, jnp.int32),
        jnp.zeros((batch, 2), jnp.uint32),
        sampling.RowSampling.of([sampling.SamplingConfig()] * batch),
    )
    fns = loop.jitted(spec, new_positions, None, args)
    with programs.precision_scope(dtype):
        state = fns.start(*args)
        run = fns.run_loop.lower(params, state, jnp.int32(0), False).compile()
    state = jax.block_until_ready(run(params, state, jnp.int32(STEPS), False))  # warm up
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        state = jax.block_until_ready(run(params, state, jnp.int32(STEPS), False))
        times.append((time.perf_counter() - t0) / STEPS)
    return min(times)


def measure_step_curve(
    probe, tokens: tuple[int, ...], context: int = 256, repeats: int = 4,
    stop_above: float = float("inf"), batch: int = 1,
) -> dict:  # fmt: skip
    """{T: seconds} of a decode step at each T of `tokens` (1: plain), timed on `probe`
    ((lm, params): cost_curve.probe_model's), in increasing T, stopping after the first
    T costing more than `stop_above` plain steps (no layout that large can pay off)."""
    lm, params = probe
    curve: dict[int, float] = {}
    for t in sorted(set(tokens) | {1}):
        curve[t] = loop_step_s(lm, params, t, context, batch, repeats)
        if t > 1 and curve[t] / curve[1] > stop_above:
            break
    return curve
