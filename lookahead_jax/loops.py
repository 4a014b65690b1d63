"""The jitted entry points: start (prefill), one step, and the on-device loop.

All three take a static `DecodeSpec`; the state is donated so the cache, token
buffer and pool are updated in place. Two loops drive the same step:

* `run_loop` — `lax.while_loop` on the device until every row is done or
  `max_steps` steps ran (the cap lets a caller return to the host now and then,
  e.g. to honour Ctrl-C, without changing any token);
* the host loop in generation.py, which calls `step` once per forward pass and
  reads the new tokens after each one (streaming).

`jitted(...)` wraps them with `jax.jit`; on a mesh it adds `in_shardings` and
`out_shardings` from sharding.py's rules, so params stay where `load` put them
and every state array keeps its batch-over-`data` layout from step to step.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

from lookahead_jax import sharding
from lookahead_jax.decode_state import DecodeSpec, DecodeState, prefill
from lookahead_jax.lookahead import init_lookahead, lookahead_step
from lookahead_jax.model import Params, unflatten
from lookahead_jax.plain import plain_step


def start(
    params, prompt_bp, prompt_len_b, max_new_b, keys_b2, *, spec: DecodeSpec, max_new_cap: int
) -> DecodeState:
    """Prefill the right-padded prompts [B, P] and emit each row's first token."""
    state = prefill(
        params, prompt_bp, prompt_len_b, max_new_b, keys_b2, spec=spec, max_new_cap=max_new_cap
    )
    if spec.lookahead is not None:
        state = init_lookahead(state, spec, prompt_bp.shape[1])
    return state


def step(params: Params, state: DecodeState, *, spec: DecodeSpec) -> DecodeState:
    if spec.lookahead is None:
        return plain_step(params, state, spec)
    return lookahead_step(params, state, spec)


def run_loop(params, state: DecodeState, max_steps, *, spec: DecodeSpec) -> DecodeState:
    """Step until every row is done, or `max_steps` more steps ran."""

    def cond(carry):
        state, i = carry
        return jnp.any(~state.done) & (i < max_steps)

    def body(carry):
        state, i = carry
        return step(params, state, spec=spec), i + 1

    state, _ = jax.lax.while_loop(cond, body, (state, jnp.int32(0)))
    return state


def jitted(spec: DecodeSpec, max_new_cap: int, mesh, start_args) -> dict:
    """{'start', 'step', 'run_loop'} as jax.jit functions for these start arguments
    (params, prompt [B, P], prompt_len [B], max_new [B], keys [B, 2])."""
    start_fn = functools.partial(start, spec=spec, max_new_cap=max_new_cap)
    step_fn = functools.partial(step, spec=spec)
    loop_fn = functools.partial(run_loop, spec=spec)
    if mesh is None:
        return {
            "start": jax.jit(start_fn),
            "step": jax.jit(step_fn, donate_argnums=1),
            "run_loop": jax.jit(loop_fn, donate_argnums=1),
        }
    params_sh = unflatten(sharding.param_shardings(spec.model, mesh))
    rows = NamedSharding(mesh, P(sharding.DATA))
    state_sh = sharding.state_shardings(jax.eval_shape(start_fn, *start_args), spec.model, mesh)
    scalar = NamedSharding(mesh, P())
    return {
        "start": jax.jit(
            start_fn, in_shardings=(params_sh, rows, rows, rows, rows), out_shardings=state_sh
        ),
        "step": jax.jit(
            step_fn, in_shardings=(params_sh, state_sh), out_shardings=state_sh, donate_argnums=1
        ),
        "run_loop": jax.jit(
            loop_fn,
            in_shardings=(params_sh, state_sh, scalar),
            out_shardings=state_sh,
            donate_argnums=1,
        ),
    }
