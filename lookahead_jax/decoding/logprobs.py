"""Each new token's log-probability and its most likely alternatives, kept on the device
beside the token buffer.

Which distribution: the model's own, log_softmax of its raw logits — before temperature,
top-k and top-p (vLLM's default `raw_logprobs`; OpenAI's logprobs are likewise the
model's, whatever the temperature). So a token's logprob does not depend on how it was
chosen, and a greedy and a sampled decode report the same numbers for the same text.

Why it is exact with lookahead: a step computes the model's logits at every position it
accepts (the input's row, then each accepted node's: lookahead.py), with plain
decoding's context, so each emitted token's logprob is plain decoding's for it, to float
rounding (a T-token pass's logits agree with a one-token pass's: seam.py).

Layout, beside `DecodeState.tokens [B, S]` (O = DecodeSpec.logprobs alternatives):

    token    [B, S]     float32  log p(tokens[b, i] | tokens[b, :i])
    top_ids  [B, S, O]  int32    the O most likely tokens at i, most likely first
    top      [B, S, O]  float32  their logprobs

A step writes its new tokens' positions; the prefill writes the prompt's positions for
the rows that ask (`RowSampling.prompt_logprobs`: prompt_logprobs.py; entry 0, which
follows nothing, is 0). A step computes logprobs only when some active row asks
(`RowSampling.logprobs`), and only for the asking rows while they are a quarter of the
batch or fewer (`of_tokens_if`): a batch whose rows do not ask pays a predicate a step.
"""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
from jaxtyping import Array, Float, Int

from lookahead_jax.vocab_top_k import top_k


@jax.tree_util.register_dataclass
@dataclasses.dataclass
class Logprobs:
    """Per-position logprobs of a row's tokens: its new tokens', and its prompt's where
    it asked (module docstring)."""

    token: Float[Array, "B S"]
    top_ids: Int[Array, "B S O"]
    top: Float[Array, "B S O"]


def init(batch: int, positions: int, k: int) -> Logprobs:
    return Logprobs(
        token=jnp.zeros((batch, positions), jnp.float32),
        top_ids=jnp.zeros((batch, positions, k), jnp.int32),
        top=jnp.zeros((batch, positions, k), jnp.float32),
    )


def of_tokens(logits_brv, rows_be, tokens_be, alternatives: int):
    """(logprob [B, E], top ids [B, E, O], top logprobs [B, E, O]) of the E tokens
    `tokens_be`, token e chosen from logits row `rows_be[b, e]` of `logits_brv [B, R, V]`
    (O = alternatives). A logprob is the logit less the row's logsumexp, so no [B, E, V]
    log_softmax is written out."""
    logits_bev = jnp.take_along_axis(logits_brv, rows_be[:, :, None], axis=1)
    logits_bev = logits_bev.astype(jnp.promote_types(logits_bev.dtype, jnp.float32))
    lse_be1 = jax.nn.logsumexp(logits_bev, axis=-1, keepdims=True)
    token_be = jnp.take_along_axis(logits_bev, tokens_be[:, :, None], axis=2)[:, :, 0]
    top_beo, ids_beo = top_k(logits_bev, alternatives)
    f32 = jnp.float32
    return (token_be - lse_be1[..., 0]).astype(f32), ids_beo, (top_beo - lse_be1).astype(f32)


def of_tokens_if(want_b, logits_brv, rows_be, tokens_be, alternatives: int):
    """`of_tokens` for the rows that want them (want_b [B]; zeros for the others): none
    computed in a step where no row wants them (a predicate a step), and while at most a
    quarter of the rows want them, only those rows (gathered first, so a request asking
    for logprobs does not make the step compute them for the whole batch)."""
    B, E = tokens_be.shape
    few = max(1, B // 4)

    def skip():
        zeros_beo = jnp.zeros((B, E, alternatives), jnp.float32)
        return jnp.zeros((B, E), jnp.float32), zeros_beo.astype(jnp.int32), zeros_beo

    def all_rows():
        return of_tokens(logits_brv, rows_be, tokens_be, alternatives)

    def some_rows():  # the wanting rows first; the values scattered back to them
        picked_f = jnp.argsort(~want_b, stable=True)[:few]
        values = of_tokens(
            logits_brv[picked_f], rows_be[picked_f], tokens_be[picked_f], alternatives
        )
        to_f = jnp.where(want_b[picked_f], picked_f, B)  # a row that does not want: dropped
        return jax.tree.map(lambda zero, x: zero.at[to_f].set(x, mode="drop"), skip(), values)

    wanting = jnp.sum(want_b)
    branch = jnp.where(wanting == 0, 0, jnp.where(wanting <= few, 1, 2))
    if few >= B:  # one row: nothing to pick
        return jax.lax.cond(wanting > 0, all_rows, skip)
    return jax.lax.switch(branch, (skip, some_rows, all_rows))


def window(buffers: Logprobs, first_b, width: int) -> Logprobs:
    """Each row's positions first_b[b] .. first_b[b] + width - 1 ([B, W, ...], W = width;
    positions past S read as S - 1's): what the host reads after a round, not the whole
    buffers."""
    S = buffers.token.shape[1]
    at_bw = jnp.minimum(jnp.asarray(first_b)[:, None] + jnp.arange(width)[None], S - 1)

    def take(x):
        return jnp.take_along_axis(x, at_bw.reshape(at_bw.shape + (1,) * (x.ndim - 2)), axis=1)

    return jax.tree.map(take, buffers)


def write(buffers: Logprobs, rows_be, at_be, values) -> Logprobs:
    """`values` (of_tokens) written at positions at_be [B, E] of rows rows_be (a position
    past S is dropped, as decode_state.emit drops an inactive row's tokens)."""
    token_be, ids_beo, top_beo = values
    return Logprobs(
        token=buffers.token.at[rows_be, at_be].set(token_be, mode="drop"),
        top_ids=buffers.top_ids.at[rows_be, at_be].set(ids_beo, mode="drop"),
        top=buffers.top.at[rows_be, at_be].set(top_beo, mode="drop"),
    )
