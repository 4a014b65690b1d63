"""The training objective: consistency (a Jacobi state's predictions pulled toward the
fixed point's) plus a next-token loss on the fixed point, from one forward pass in
layout.py's arrangement. Two teachers say what "the fixed point's" distribution is:

teacher "self" (the CLLM recipe): the model being trained, held constant (stop-gradient)

    consistency = mean over informative (k, j) of
                  KL( p(. | x, y*[:k*n+j])  ||  p(. | x, y*[:k*n], g_k[:j]) )
    ar          = mean over t < out_len of  -log p(y*_t | x, y*[:t])

teacher "base": the frozen base model q (its logits passed in as `teacher_byv`)

    consistency = mean over informative (k, j) of
                  KL( q(. | x, y*[:k*n+j])  ||  p(. | x, y*[:k*n], g_k[:j]) )
    ar          = mean over t < out_len of  KL( q(. | x, y*[:t])  ||  p(. | x, y*[:t]) )

"self"'s next-token loss trains on the greedy tokens, which sharpens the model toward its
own argmax (held-out NLL rises); "base" distils the whole distribution, pulling the tuned
model toward the base's where the text is right (measured on SmolLM2 it still drifts:
README "Training for lookahead"). Either way the model learns to reach, from any point
of a trajectory, what is predicted at its end. `ar` is thus an NLL with one teacher and
a KL with the other: its values are not comparable between the two.

A position (k, j) is informative when g_k differs from y* somewhere before j (j >= 1):
before the first wrong guess both contexts are the same text, so the term is the
fixed point's own (zero for "self"; for "base" the KL that `ar` already counts) and is
left out of the mean — at the fixed point itself the consistency loss is exactly 0.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

TEACHERS = ("self", "base")


def informative(fixed_by, guess_by, out_len_b, block: int):
    """[B, Y] bool: block k's position j has a wrong guess before it and lies inside the
    row's output (Y = m * n, flattened as k * n + j)."""
    B, Y = fixed_by.shape
    wrong = (guess_by != fixed_by).reshape(B, Y // block, block)
    wrong_before = jnp.cumsum(wrong, axis=-1) - wrong > 0  # any of g_k[:j] wrong
    inside = jnp.arange(Y)[None] < out_len_b[:, None]
    return wrong_before.reshape(B, Y) & inside


def kl(target_byv, logp_byv):
    """[B, Y]: KL(target || p) over the vocabulary axis, from log-probabilities."""
    return jnp.sum(jnp.exp(target_byv) * (target_byv - logp_byv), axis=-1)


def losses(logits_brv, fixed_by, guess_by, out_len_b, block: int, teacher_byv=None):
    """(consistency, ar), each a scalar mean. logits_brv: the 2Y rows of
    layout.logits_rows — fixed-point rows first (row t predicts y*_t), then guess rows
    (row Y + k*n + j predicts block k's token j from g_k[:j], for j >= 1).
    teacher_byv: None (teacher "self") or the base model's Y fixed-point rows [B, Y, V]."""
    Y = fixed_by.shape[1]
    logp = jax.nn.log_softmax(logits_brv, axis=-1)
    fixed_lp, guess_lp = logp[:, :Y], logp[:, Y:]

    inside = jnp.arange(Y)[None] < out_len_b[:, None]
    if teacher_byv is None:
        target = jax.lax.stop_gradient(fixed_lp)
        per_token = -jnp.take_along_axis(fixed_lp, fixed_by[..., None], axis=-1)[..., 0]
    else:
        target = jax.nn.log_softmax(jax.lax.stop_gradient(teacher_byv), axis=-1)
        per_token = kl(target, fixed_lp)
    ar = jnp.sum(per_token * inside) / jnp.maximum(jnp.sum(inside), 1)

    kl_by = kl(target, guess_lp)  # [B, Y]
    where = informative(fixed_by, guess_by, out_len_b, block)
    consistency = jnp.sum(jnp.where(where, kl_by, 0)) / jnp.maximum(jnp.sum(where), 1)
    return consistency, ar
