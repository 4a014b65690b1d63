"""The k largest logits of each row over a vocabulary, as jax.lax.top_k, for what reads
them every step (logprobs' alternatives, token recycling's table): XLA:CPU lowers
lax.top_k to a TopK that sorts the whole row, 1.0 ms a step for a 16-token lookahead
step's [15, 49152] at k = 8 where `top_k` takes 0.15 ms (AMD EPYC Zen 4), and 3.6
against 0.4 ms for 24 rows (an earlier AMD EPYC)."""

from __future__ import annotations

import jax
import jax.numpy as jnp

CHUNK = 128  # vocabulary entries a chunk in top_k's first stage


def top_k(x, k: int):
    """jax.lax.top_k(x, k) over the last axis, exactly, in two stages: the k largest
    values lie in the k chunks of CHUNK entries with the largest maxima, so one max over
    V and a top-k over k chunks replace a top-k over all of V (which XLA:CPU sorts for:
    the module docstring; on an H200 it takes 0.15-0.8x lax.top_k's time too:
    benchmarks/gpu/issue58_h200/README.md). Ties may come in another order than
    lax.top_k's.

    x [..., V] -> (values [..., k], int32 ids [..., k]), the largest first."""
    V = x.shape[-1]
    if k == 0 or V <= 4 * CHUNK or V % CHUNK:
        values, ids = jax.lax.top_k(x, k)
        return values, ids.astype(jnp.int32)
    chunks = x.reshape(*x.shape[:-1], V // CHUNK, CHUNK)  # [..., V/C, C]
    _, best_chunks = jax.lax.top_k(chunks.max(-1), min(k, V // CHUNK))  # [..., k]
    picked = jnp.take_along_axis(chunks, best_chunks[..., None], axis=-2)  # [..., k, C]
    values, at = jax.lax.top_k(picked.reshape(*picked.shape[:-2], -1), k)  # [..., k]
    ids = jnp.take_along_axis(best_chunks, at // CHUNK, axis=-1) * CHUNK + at % CHUNK
    return values, ids.astype(jnp.int32)
