"""Rotary position embeddings, in Hugging Face's "rotate half" layout.

Positions are explicit `[B, T]` integers, so any token layout (a padded prompt,
the lookahead window, the verification branch) gets its RoPE from data.
"""

import jax.numpy as jnp
import numpy as np


def rope_cos_sin(positions_bt: jnp.ndarray, inv_freq: np.ndarray, dtype) -> tuple:
    """cos, sin `[B, T, Dh]` for integer positions `[B, T]` (computed in float32)."""
    freqs = positions_bt.astype(jnp.float32)[..., None] * jnp.asarray(inv_freq)  # [B, T, Dh/2]
    emb = jnp.concatenate([freqs, freqs], axis=-1)
    return jnp.cos(emb).astype(dtype), jnp.sin(emb).astype(dtype)


def apply_rope(x_bthe: jnp.ndarray, cos_bte: jnp.ndarray, sin_bte: jnp.ndarray) -> jnp.ndarray:
    """Rotate `x [B, T, heads, Dh]` by the per-token angles."""
    half = x_bthe.shape[-1] // 2
    rotated = jnp.concatenate([-x_bthe[..., half:], x_bthe[..., :half]], axis=-1)
    return x_bthe * cos_bte[:, :, None, :] + rotated * sin_bte[:, :, None, :]
