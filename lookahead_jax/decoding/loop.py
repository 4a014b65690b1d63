"""The jittable pieces of decoding, public for research loops that drive it themselves:
`start` (prefill), `step` (one forward pass) and `run_loop` (steps on the device).

All three are pure functions of (params, state) with a static `DecodeSpec`:

    state = start(params, prompt [B, P], prompt_len [B], max_new_tokens [B], rng [B, 2],
                  sampling, spec=spec, new_positions=64)
        # right-padded prompts, the first token emitted; sampling: RowSampling [B]; the
        # bucket: a static bound on every row's max_new_tokens (sizes buffers and cache)
    state = step(params, state, spec=spec)      # every active row emits 1..max_emit tokens
    state = run_loop(params, state, steps_per_call, stop_at_finish, spec=spec)  # while_loop

`DecodeState` (decode_state.py) holds each row's tokens [B, S], lengths and flags; a
row's new tokens are `tokens[b, prompt_len[b] : prompt_len[b] + n_out[b]]`. Example:

    spec = DecodeSpec(lm=model.lm, eos_ids=model.eos_ids,
                      lookahead=LookaheadConfig.for_tokens(16))
    greedy = RowSampling.of([SamplingConfig()] * B)
    state = jax.jit(functools.partial(start, spec=spec, new_positions=64))(
        model.params, prompt, prompt_len, max_new_tokens, row_keys(0, B), greedy)
    step_fn = jax.jit(functools.partial(step, spec=spec), donate_argnums=1)
    while not state.done.all():
        state = step_fn(model.params, state)

`jitted(...)` wraps them with `jax.jit` (the state donated, so the cache, token buffer
and pool are updated in place, and with `compiler_options()`); on a mesh it adds
`in_shardings` and `out_shardings` from sharding.py's rules, so params stay where `load`
put them and every state array keeps its batch-over-`data` layout from step to step.
"""

from __future__ import annotations

import dataclasses
import functools

import jax
import jax.numpy as jnp
from jax.sharding import NamedSharding, PartitionSpec

from lookahead_jax import shapes
from lookahead_jax.decoding.decode_state import (
    CachedPrefix,
    DecodeSpec,
    DecodeState,
    RaggedPrompts,
    SharedPrefix,
    prefill,
)
from lookahead_jax.decoding.grammar_rows import GrammarRows
from lookahead_jax.decoding.lookahead import init_lookahead, lookahead_step
from lookahead_jax.decoding.plain import plain_step
from lookahead_jax.decoding.sampling import RowSampling
from lookahead_jax.distributed import sharding


@shapes.checked
def start(
    params,
    prompt_bp,
    prompt_len_b,
    max_new_b,
    rng_b2,
    sampling: RowSampling,
    prefix: CachedPrefix | RaggedPrompts | SharedPrefix | None = None,
    grammar: GrammarRows | None = None,
    *,
    spec: DecodeSpec,
    new_positions: int,
) -> DecodeState:
    """Prefill the right-padded prompts [B, P] and emit each row's first token; with
    lookahead, also set up the window, pool and recycling tables.
    prefix: the rows' cached prefixes (decode_state.CachedPrefix; None: none), or the
    prompts packed in one ragged pass (decode_state.RaggedPrompts), or packed after a
    prefix they share (decode_state.SharedPrefix).
    grammar: the rows' grammar states and table (spec.grammar; grammar_rows.py).

    sampling: each row's settings ([B] arrays; sampling.RowSampling).
    new_positions: room past the prompt bucket P for new tokens, at least the largest
    max_new_tokens of any row (with P and the widest step's emit, it sizes S)."""
    state = prefill(
        params,
        prompt_bp,
        prompt_len_b,
        max_new_b,
        rng_b2,
        sampling,
        prefix,
        grammar,
        spec=spec,
        new_positions=new_positions,
    )
    if spec.lookahead is not None:
        state = init_lookahead(state, spec, prompt_bp.shape[1])
    return state


@shapes.checked
def step(params, state: DecodeState, *, spec: DecodeSpec) -> DecodeState:
    """One forward pass: plain (1 token per row) or lookahead (1..max_emit)."""
    if spec.lookahead is None:
        return plain_step(params, state, spec)
    return lookahead_step(params, state, spec)


def run_loop(
    params,
    state: DecodeState,
    steps_per_call,
    stop_at_finish=False,
    *,
    spec: DecodeSpec,
    plain: bool = False,
) -> DecodeState:
    """Step until every row is done, or `steps_per_call` more steps ran (the cap lets a caller
    return to the host now and then, e.g. to honour Ctrl-C, without changing any
    token), or — with `stop_at_finish` (a traced bool) — as soon as a row that was
    active at the call finishes (the engine then refills its slot).

    plain: plain steps over a lookahead state (its guess sources left as they are, so a
    later lookahead call resumes from them: their guesses are only older, and every
    guess is verified) — `auto`'s rounds where lookahead does not pay (engine/
    round_choice.py); the same tokens either way."""
    done_at_call = state.done

    def cond(carry):
        state, i = carry
        finished = jnp.any(state.done & ~done_at_call)
        return jnp.any(~state.done) & (i < steps_per_call) & ~(stop_at_finish & finished)

    def body(carry):
        state, i = carry
        if plain:
            return plain_step(params, state, spec), i + 1
        return step(params, state, spec=spec), i + 1

    state, _ = jax.lax.while_loop(cond, body, (state, jnp.int32(0)))
    return state


def compiler_options(platform: str | None = None) -> dict:
    """XLA options the decode programs are compiled with on this platform (default: the
    first device's).

    Copy insertion by region analysis (CPU and GPU): the attention's loop over cache
    blocks (models/llama.py) reads each layer's K/V buffers, which the step then updates
    in place with its commit. Without it XLA copies every buffer before that loop and
    again before the update, two copies of the whole cache a step (the loop's HLO;
    tests/test_loop_copies.py).

    NVIDIA GPUs: Triton GEMM fusions (XLA's default, said here because it was once off).
    With the layers unrolled they beat cuBLAS for every shape measured on an H200
    (benchmarks/gpu/step_report_h200/step_report_head.md, llama3-8b shape, bf16: 0.88x
    for a 16-token step at B = 1, 0.87x / 0.72x / 0.67x for plain steps at B = 8 / 32 / 64;
    llama2-7b at B = 1: 0.90x), and for per-channel int8 weights they fuse the int8 -> bf16
    convert that cuBLAS's path writes out whole (5.02 ms against 13.34). Q8_0 weights are
    unmeasured on a GPU. (Under the old scan over stacked layers Triton GEMMs copied each
    layer's weight slice first: benchmarks/gpu/layer_loop_llama2_7b.json.)
    """
    platform = platform or jax.devices()[0].platform
    if platform == "gpu":
        return {
            "xla_gpu_enable_triton_gemm": True,
            "xla_gpu_copy_insertion_use_region_analysis": True,
        }
    if platform == "cpu":
        return {"xla_cpu_copy_insertion_use_region_analysis": True}
    return {}


@dataclasses.dataclass(frozen=True)
class Jitted:
    """The three entry points as jax.jit functions (not yet compiled)."""

    start: object
    step: object
    run_loop: object
    run_plain: object  # run_loop with plain steps over the same (lookahead) state


def jitted(spec: DecodeSpec, new_positions: int, mesh, start_args) -> Jitted:
    """`start`, `step` and `run_loop` jitted for these start arguments (params,
    prompt [B, P], prompt_len [B], max_new_tokens [B], rng [B, 2], RowSampling of [B] arrays); on
    a mesh with explicit in/out shardings."""
    start_fn = functools.partial(start, spec=spec, new_positions=new_positions)
    step_fn = functools.partial(step, spec=spec)
    loop_fn = functools.partial(run_loop, spec=spec)
    plain_fn = functools.partial(run_loop, spec=spec, plain=True)
    jit = functools.partial(jax.jit, compiler_options=compiler_options())
    if mesh is None:
        return Jitted(
            start=jit(start_fn),
            step=jit(step_fn, donate_argnums=1),
            run_loop=jit(loop_fn, donate_argnums=1),
            run_plain=jit(plain_fn, donate_argnums=1),
        )
    params_sh = spec.lm.param_shardings(mesh)
    by_row = jax.tree.map(lambda x: sharding.batch_major(x, mesh), tuple(start_args[1:]))
    state_sh = sharding.state_shardings(jax.eval_shape(start_fn, *start_args), mesh)
    scalar = NamedSharding(mesh, PartitionSpec())
    return Jitted(
        start=jit(
            start_fn,
            in_shardings=(params_sh, *by_row),
            out_shardings=state_sh,
        ),
        step=jit(
            step_fn, in_shardings=(params_sh, state_sh), out_shardings=state_sh, donate_argnums=1
        ),
        run_loop=jit(
            loop_fn,
            in_shardings=(params_sh, state_sh, scalar, scalar),
            out_shardings=state_sh,
            donate_argnums=1,
        ),
        run_plain=jit(
            plain_fn,
            in_shardings=(params_sh, state_sh, scalar, scalar),
            out_shardings=state_sh,
            donate_argnums=1,
        ),
    )
