"""Rotary position embeddings, in Hugging Face's "rotate half" layout.

Positions are explicit `[B, T]` integers, so any token layout (a padded prompt,
the lookahead window, the verification branch) gets its RoPE from data.
"""

import jax
import jax.numpy as jnp
import numpy as np


def rope_cos_sin(positions_bt: jnp.ndarray, inv_freq: np.ndarray, dtype) -> tuple:
    """cos, sin `[B, T, Dh]` for integer positions `[B, T]` (computed in float32; on a
    CPU computed once, see _computed_once)."""
    freqs = positions_bt.astype(jnp.float32)[..., None] * jnp.asarray(inv_freq)  # [B, T, Dh/2]
    emb = jnp.concatenate([freqs, freqs], axis=-1)

    def cos_sin(emb):
        return jnp.cos(emb).astype(dtype), jnp.sin(emb).astype(dtype)

    return jax.lax.platform_dependent(
        positions_bt, emb, cpu=_computed_once(cos_sin), default=lambda _, emb: cos_sin(emb)
    )


def _computed_once(cos_sin):
    """cos_sin(emb), materialized once on XLA:CPU. Left to itself XLA:CPU fuses cos and
    sin into every consumer — each layer's RoPE multiplies for q (twice: the cache's and
    the new tokens' attention read it in two layouts) and k — evaluating them per element
    of the heads they broadcast over: 6.4 ms of a 16-token step's 65 on SmolLM2 (Intel
    Xeon; benchmarks/cpu/step_profile.md's copy_bitcast_fusion). A conditional's results
    are a fusion boundary (an optimization barrier is not: XLA removes it before fusing):
    one branch passes the values on, the other computes them again, so either gives the
    same; positions are never negative, so the first runs. Not on GPUs, where a
    conditional reads its predicate back to the host."""

    def once(positions_bt, emb):
        computed = cos_sin(emb)
        return jax.lax.cond(
            jnp.min(positions_bt) >= 0,
            lambda cs, _: cs,
            lambda _, emb: cos_sin(emb),
            computed,
            emb,
        )

    return once


def apply_rope(x_bthe: jnp.ndarray, cos_bte: jnp.ndarray, sin_bte: jnp.ndarray) -> jnp.ndarray:
    """Rotate `x [B, T, heads, Dh]` by the per-token angles."""
    half = x_bthe.shape[-1] // 2
    rotated = jnp.concatenate([-x_bthe[..., half:], x_bthe[..., :half]], axis=-1)
    return x_bthe * cos_bte[:, :, None, :] + rotated * sin_bte[:, :, None, :]
