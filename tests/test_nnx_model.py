"""Bring your own model: the small Flax NNX causal LM of examples/tiny_nnx_lm.py, written
against the seam's call signature, decoded with lookahead through lj.from_nnx — greedy
lookahead equals its own plain greedy (float64, batched), and the public harness checks
it."""

from __future__ import annotations

import sys
from pathlib import Path

import jax
import jax.numpy as jnp
import pytest
from flax import nnx

import lookahead_jax as lj

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "examples"))
from tiny_nnx_lm import VOCAB, tiny_model  # noqa: E402


@pytest.fixture(scope="module")
def model64():
    with jax.enable_x64(True):  # float64 params: no rounding, so any difference is a real one
        yield tiny_model(jnp.float64)


PROMPTS = [
    [5, 6, 7, 5, 6, 7, 5],
    [9, 3],
    [11, 12, 13, 14, 15, 11, 12, 13],
    [1],
    [20, 21, 20, 21, 20],
]


def test_nnx_lookahead_equals_its_own_plain_greedy(model64):
    with jax.enable_x64(True):
        assert lj.testing.pass_agreement(model64, PROMPTS[2]) < 1e-9
        accepted = lj.testing.assert_lookahead_matches_plain(
            model64,
            PROMPTS,
            # window and pool: tokens=16 holds both (the adapter does not see the layout)
            configs=(lj.LookaheadConfig.for_tokens(16),),
            max_new_tokens=20,
            batch_sizes=(5,),  # other batch sizes: the Llama matrix
        )
    assert all(a > 0 for a in accepted.values()), accepted  # guesses did land


def test_guesses_past_the_last_position_do_not_poison_the_pass(model64):
    """Near the end of the context, tree guesses sit past the model's last position. The
    tiny model's position table has exactly max_context rows, and an out-of-range lookup
    gives NaN, which would spread through the attention to the tokens that are kept."""
    prompt = [[(7 * i) % (VOCAB - 1) + 1 for i in range(250)]]  # 250 + 6 = max_context
    with jax.enable_x64(True):
        plain = lj.generate(model64, prompt, max_new_tokens=6, lookahead=None).token_ids
        la = lj.generate(
            model64, prompt, max_new_tokens=6, lookahead=lj.LookaheadConfig.for_tokens(8)
        )
    assert la.token_ids == plain and len(plain[0]) > 1


def test_harness_catches_a_model_that_mixes_the_tokens_of_a_pass(model64):
    """A model whose output for a token depends on the other tokens of its pass breaks
    exactness: pass_agreement measures it and the harness fails."""

    class Leaky:
        def __init__(self, inner):
            self.inner = inner

        def __getattr__(self, name):
            return getattr(self.inner, name)

        def __hash__(self):
            return hash(("leaky", self.inner))

        def apply(self, params, tokens_bt, *rest):
            logits, k, v = self.inner.apply(params, tokens_bt, *rest)
            T = tokens_bt.shape[1]  # a pass of several tokens favours token T % V
            return logits + 30.0 * (T > 1) * jax.nn.one_hot(T % VOCAB, VOCAB), k, v

    leaky = lj.Model(lm=Leaky(model64.lm), params=model64.params, eos_ids=(0,))
    with jax.enable_x64(True):
        assert lj.testing.pass_agreement(leaky, PROMPTS[2]) > 1.0
        with pytest.raises(AssertionError, match="lookahead != plain"):
            lj.testing.assert_lookahead_matches_plain(
                leaky, PROMPTS[:2], configs=(lj.LookaheadConfig.for_tokens(8),), max_new_tokens=8
            )


def test_from_nnx_refuses_what_it_cannot_use():
    with pytest.raises(ValueError, match="lj.Model"):
        lj.generate(object(), [[1, 2]], lookahead=None)
    with pytest.raises(ValueError, match="nnx.Module"):
        lj.from_nnx(object(), max_context=16)

    class NoShape(nnx.Module):
        def __init__(self):
            self.vocab_size = 4

    with pytest.raises(ValueError, match="cache_shape"):
        lj.from_nnx(NoShape(), max_context=16)
