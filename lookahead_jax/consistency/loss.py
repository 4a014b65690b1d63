"""The training objective: consistency (a Jacobi state's predictions pulled toward the
fixed point's) plus a next-token loss on the fixed point, from one forward pass in
layout.py's arrangement.

    consistency = mean over informative (k, j) of
                  KL( p(. | x, y*[:k*n+j])  ||  p(. | x, y*[:k*n], g_k[:j]) )
    ar          = mean over t < out_len of  -log p(y*_t | x, y*[:t])

The fixed point's distributions are held constant (stop-gradient): the model learns to
reach, from any point of a trajectory, what it would predict at its end. A position
(k, j) is informative when g_k differs from y* somewhere before j (j >= 1): before the
first wrong guess both contexts are the same text and the KL is zero, so they are left
out of the mean — and at the fixed point itself the consistency loss is exactly 0.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp


def informative(fixed_bn, guess_bn, out_len_b, block: int):
    """[B, N] bool: block k's position j has a wrong guess before it and lies inside the
    row's output (N = m * n, flattened as k * n + j)."""
    B, N = fixed_bn.shape
    wrong = (guess_bn != fixed_bn).reshape(B, N // block, block)
    wrong_before = jnp.cumsum(wrong, axis=-1) - wrong > 0  # any of g_k[:j] wrong
    inside = jnp.arange(N)[None] < out_len_b[:, None]
    return wrong_before.reshape(B, N) & inside


def losses(logits_brv, fixed_bn, guess_bn, out_len_b, block: int):
    """(consistency, ar), each a scalar mean. logits_brv: the 2N rows of
    layout.logits_rows — fixed-point rows first (row t predicts y*_t), then guess rows
    (row N + k*n + j predicts block k's token j from g_k[:j], for j >= 1)."""
    N = fixed_bn.shape[1]
    logp = jax.nn.log_softmax(logits_brv, axis=-1)
    fixed_lp, guess_lp = logp[:, :N], logp[:, N:]

    inside = jnp.arange(N)[None] < out_len_b[:, None]
    nll = -jnp.take_along_axis(fixed_lp, fixed_bn[..., None], axis=-1)[..., 0]
    ar = jnp.sum(nll * inside) / jnp.maximum(jnp.sum(inside), 1)

    target = jax.lax.stop_gradient(fixed_lp)
    kl = jnp.sum(jnp.exp(target) * (target - guess_lp), axis=-1)  # [B, N]
    where = informative(fixed_bn, guess_bn, out_len_b, block)
    consistency = jnp.sum(jnp.where(where, kl, 0)) / jnp.maximum(jnp.sum(where), 1)
    return consistency, ar
