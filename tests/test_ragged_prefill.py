"""A ragged prefill — several prompts packed one after another in one pass
(decode_state.RaggedPrompts, attention.segment_attention) — against the prefill of the
same prompts right-padded in rows: the same first tokens and K/V, float64; and its
attention against the masked softmax it stands for."""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from lookahead_jax.decoding.decode_state import DecodeSpec, RaggedPrompts, prefill
from lookahead_jax.decoding.sampling import RowSampling, SamplingConfig, row_keys
from lookahead_jax.models.attention import segment_attention
from lookahead_jax.models.llama import LlamaLM
from lookahead_jax.models.llama_params import init_params, split_layers
from tests import tiny


def _masked_softmax(q, k, v, first, window):
    """The reference: token t sees u with first[t] <= u <= t (and t - u < window)."""
    T, Dh = q.shape[1], q.shape[-1]
    t = np.arange(T)
    mask = (t[None, None, :] <= t[None, :, None]) & (t[None, None, :] >= first[:, :, None])
    if window:
        mask &= (t[:, None] - t[None, :] < window)[None]
    s = np.einsum("btkqe,bkue->bktqu", q, k) / np.sqrt(Dh)
    s = np.where(mask[:, None, :, None, :], s, -np.inf)
    p = np.exp(s - s.max(-1, keepdims=True))
    return np.einsum("bktqu,bkue->btkqe", p / p.sum(-1, keepdims=True), v)


def _first(lengths: list[int], tail: int) -> np.ndarray:
    """[1, T]: each token's row's first index; tail tokens their own."""
    starts = np.cumsum([0, *lengths])
    rows = [np.full(n, starts[i]) for i, n in enumerate(lengths)]
    return np.concatenate([*rows, starts[-1] + np.arange(tail)])[None].astype(np.int32)


@pytest.mark.parametrize(
    "lengths, tail, block, window",
    [
        ([3, 6, 2], 1, 4, 0),  # the docstring's example: three steps back
        ([3, 6, 2], 1, 4, 3),  # a window shorter than a row
        ([17, 1, 9, 30], 7, 8, 0),  # a row longer than several blocks, one of one token
        ([5, 5], 0, 128, 0),  # one block holds the pass
    ],
)
def test_segment_attention_is_the_masked_softmax(lengths, tail, block, window):
    rng = np.random.default_rng(len(lengths) + block)
    T, K, Q, Dh = sum(lengths) + tail, 2, 3, 8
    q = rng.normal(size=(1, T, K, Q, Dh))
    k, v = rng.normal(size=(1, K, T, Dh)), rng.normal(size=(1, K, T, Dh))
    first = _first(lengths, tail)
    with jax.enable_x64(True):
        got = segment_attention(
            *(jnp.asarray(x) for x in (q, k, v, first)), window=window, block=block
        )
    np.testing.assert_allclose(np.asarray(got), _masked_softmax(q, k, v, first, window), atol=1e-12)


@pytest.mark.parametrize("windows", [(), (5, 0)])  # (5, 0): a sliding window in layer 0
def test_a_ragged_prefill_fills_what_the_padded_one_does(windows):
    """The same prompts (of 1 to 13 tokens, some rows padding) prefilled right-padded in
    rows [n, P] and packed in one pass of Tr tokens: the same first tokens, lengths and
    K/V at every prompt position, float64."""
    prompts = [[5, 9, 3, 7, 11, 4, 6, 8, 10, 12, 13, 14, 15], [20], [21, 22, 23, 24, 25]]
    n, P, Tr = 4, 16, 24
    cfg = dataclasses.replace(tiny.llama_config(), attention_windows=windows)
    with jax.enable_x64(True):
        params = split_layers(init_params(cfg, jax.random.PRNGKey(3), jnp.float64, scale=0.5))
        spec = DecodeSpec(lm=LlamaLM(cfg), eos_ids=(2,), cache_dtype="float64")
        prompt_np, length_n = np.zeros((n, P), np.int32), np.ones((n,), np.int32)
        ragged = RaggedPrompts(
            np.zeros((1, Tr), np.int32), np.full((1, Tr), n, np.int32),
            np.zeros((1, Tr), np.int32), np.zeros((n,), np.int32),
        )  # fmt: skip
        at = 0
        for i, ids in enumerate(prompts):
            prompt_np[i, : len(ids)], length_n[i] = ids, len(ids)
            ragged.tokens[0, at : at + len(ids)], ragged.row[0, at : at + len(ids)] = ids, i
            ragged.position[0, at : at + len(ids)], ragged.start[i] = np.arange(len(ids)), at
            at += len(ids)
        sampling = RowSampling.of([SamplingConfig()] * n)
        rows = (prompt_np, length_n, np.full((n,), 4, np.int32), row_keys(0, n), sampling)
        run = jax.jit(prefill, static_argnames=("spec", "new_positions"))
        padded = run(params, *rows, spec=spec, new_positions=8)
        packed = run(params, *rows, ragged, spec=spec, new_positions=8)
    np.testing.assert_array_equal(packed.tokens, padded.tokens)
    np.testing.assert_array_equal(packed.cache.lengths, padded.cache.lengths)
    for i, ids in enumerate(prompts):
        pairs = zip(packed.cache.k + packed.cache.v, padded.cache.k + padded.cache.v, strict=True)
        for a, b in pairs:
            np.testing.assert_allclose(a[i, :, : len(ids)], b[i, :, : len(ids)], atol=1e-12)
