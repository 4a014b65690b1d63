"""A prompt's own logprobs: log p(prompt[i] | prompt[:i]) for every position i >= 1 and the
most likely tokens there (what `echo` with `logprobs` returns, and how evaluation
harnesses score a continuation).

The logits of every prompt position are [B, P, V] — 400 MB for one 2,048-token prompt
over a 49k vocabulary — so the prompt runs in chunks of C positions, each a causal pass
over the cache the chunks before it wrote (the same attention as a lookahead step's
with the cache), and only each chunk's [B, C, V] logits exist at a time:

    chunk c:  tokens prompt[:, cC : (c+1)C] at positions cC.., the cache holds 0..cC-1
              logits row t predicts prompt[:, cC + t + 1]

Padding past a row's prompt is run too (it comes after every real position, so no real
position sees it) and its entries are dropped by the caller. Values are the model's raw
log_softmax, as for new tokens (logprobs.py).
"""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp

from lookahead_jax.decoding import logprobs
from lookahead_jax.models import kv_cache, seam

CHUNK = 64  # positions a pass (a prompt bucket, a power of two, is a multiple of it or less)


def prompt_logprobs(params, prompt_bp, lm, alternatives: int, cache_dtype: str):
    """(logprob [B, P], top ids [B, P, O], top logprobs [B, P, O]) of the right-padded
    prompts [B, P]: entry i is token i's given the tokens before it (entry 0, which has
    none, is 0: the caller's None). Traced inside decoding's `start` (decode_state.py)."""
    B, P = prompt_bp.shape
    C = math.gcd(P, CHUNK)  # chunks of C positions cover P exactly
    cache = lm.init_cache(B, P, jnp.dtype(cache_dtype))
    # the token each logits row predicts: the prompt shifted left by one
    next_bp = jnp.concatenate([prompt_bp[:, 1:], jnp.zeros((B, 1), prompt_bp.dtype)], axis=1)
    all_rows_bc = jnp.broadcast_to(jnp.arange(C, dtype=jnp.int32), (B, C))

    def chunk(cache, c):
        start = c * C
        tokens_bc = jax.lax.dynamic_slice_in_dim(prompt_bp, start, C, axis=1)
        positions_bc = start + all_rows_bc
        logits_bcv, new_k, new_v = seam.apply_causal(
            lm, params, tokens_bc, positions_bc, cache, all_rows_bc
        )
        cache = kv_cache.commit(cache, new_k, new_v, all_rows_bc, jnp.full((B,), C, jnp.int32))
        next_bc = jax.lax.dynamic_slice_in_dim(next_bp, start, C, axis=1)
        return cache, logprobs.of_tokens(logits_bcv, all_rows_bc, next_bc, alternatives)

    _, (token_nbc, ids_nbco, top_nbco) = jax.lax.scan(chunk, cache, jnp.arange(P // C))

    def positions(x_nbc):  # [P // C, B, C, ...] -> [B, P, ...], shifted right by one
        x_bp = jnp.moveaxis(x_nbc, 0, 1).reshape(B, P, *x_nbc.shape[3:])
        return jnp.concatenate([jnp.zeros_like(x_bp[:, :1]), x_bp[:, :-1]], axis=1)

    return positions(token_nbc), positions(ids_nbco), positions(top_nbco)
