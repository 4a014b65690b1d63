"""The jitted entry points: start (prefill), one step, and the on-device loop.

All take a static `DecodeSpec`; the state is donated so the cache, token
buffer and pool are updated in place. Two loops drive the same step:

* `run_loop` — `lax.while_loop` on the device until every row is done or
  `max_steps` steps ran (the cap lets a caller return to the host now and then,
  e.g. to honour Ctrl-C, without changing any token);
* the host loop in generation.py, which calls `step` once per forward pass and
  reads the new tokens after each one (streaming).
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp

from lookahead_jax.decode_state import DecodeSpec, DecodeState, prefill
from lookahead_jax.lookahead import init_lookahead, lookahead_step
from lookahead_jax.model import Params
from lookahead_jax.plain import plain_step


def _step(params: Params, state: DecodeState, spec: DecodeSpec) -> DecodeState:
    if spec.lookahead is None:
        return plain_step(params, state, spec)
    return lookahead_step(params, state, spec)


@functools.partial(jax.jit, static_argnames=("spec", "max_new_cap"))
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


@functools.partial(jax.jit, static_argnames=("spec",), donate_argnames=("state",))
def step(params, state: DecodeState, *, spec: DecodeSpec) -> DecodeState:
    return _step(params, state, spec)


@functools.partial(jax.jit, static_argnames=("spec",), donate_argnames=("state",))
def run_loop(params, state: DecodeState, max_steps, *, spec: DecodeSpec) -> DecodeState:
    """Step until every row is done, or `max_steps` more steps ran."""

    def cond(carry):
        state, i = carry
        return jnp.any(~state.done) & (i < max_steps)

    def body(carry):
        state, i = carry
        return _step(params, state, spec), i + 1

    state, _ = jax.lax.while_loop(cond, body, (state, jnp.int32(0)))
    return state
