"""Plain autoregressive decoding: one forward pass per new token."""

from __future__ import annotations

import dataclasses

import jax.numpy as jnp

from lookahead_jax.decoding import grammar_rows
from lookahead_jax.decoding.decode_state import DecodeSpec, DecodeState, emit, input_tokens
from lookahead_jax.decoding.sampling import choose_tokens
from lookahead_jax.models import kv_cache, packed, seam


def plain_step(params, state: DecodeState, spec: DecodeSpec) -> DecodeState:
    """Feed each row's newest token at its own position; emit one token per active row."""
    B = state.tokens.shape[0]
    active = ~state.done
    positions = state.cache.lengths[:, None]
    logits, new_k, new_v = seam.apply(
        spec.lm,
        params,
        input_tokens(state)[:, None],
        positions,
        jnp.ones((1, 1, 1), bool),
        state.cache,
    )
    if state.grammar is not None:
        rows = state.grammar
        logits = grammar_rows.mask_if_any(logits, rows.state_b[:, None], rows.tables)
    index = state.n_out[:, None]
    kernel = packed.is_packed(params)  # (the CPU kernel runs the model: the argmax too)
    nxt = choose_tokens(logits, state.sampling, state.rng, index, spec.sampled, kernel)
    one = active.astype(jnp.int32)
    cache = kv_cache.commit(state.cache, new_k, new_v, jnp.zeros((B, 1), jnp.int32), one)
    state = dataclasses.replace(
        state,
        cache=cache,
        steps=state.steps + one,
        accept_hist=state.accept_hist.at[:, 0].add(one),
    )
    one_b = jnp.ones((B,), jnp.int32)
    return emit(state, spec, nxt, one_b, (logits, jnp.zeros((B, 1), jnp.int32)))
