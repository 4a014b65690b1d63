"""Bring your own model: a small Flax NNX causal LM, written here against the seam's call
signature, decoded with lookahead through lj.from_nnx — greedy lookahead equals its own
plain greedy (float64, batched), and the public harness checks it."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import pytest
from flax import nnx

import lookahead_jax as lj
from lookahead_jax.kv_cache import KVCache

VOCAB, DIM, HEADS, LAYERS = 40, 32, 2, 2


class Block(nnx.Module):
    def __init__(self, rngs: nnx.Rngs):
        init = nnx.initializers.normal(0.3)
        self.qkv = nnx.Linear(DIM, 3 * DIM, kernel_init=init, rngs=rngs)
        self.out = nnx.Linear(DIM, DIM, kernel_init=init, rngs=rngs)
        self.mlp = nnx.Linear(DIM, DIM, kernel_init=init, rngs=rngs)
        self.norm = nnx.LayerNorm(DIM, rngs=rngs)

    def __call__(self, x_btd, mask_btu, cache_k, cache_v, cache_len):
        B, T, _ = x_btd.shape
        q, k, v = jnp.split(self.qkv(self.norm(x_btd)), 3, axis=-1)
        heads = lambda a: a.reshape(B, -1, HEADS, DIM // HEADS)  # noqa: E731
        q, k, v = heads(q), heads(k), heads(v)
        scores = jnp.einsum("bthe,buhe->bhtu", q, k)
        scores = jnp.where(mask_btu[:, None], scores, -1e30)
        if cache_k is not None:  # the row's cache slots below its length, then the new tokens
            old = jnp.einsum("bthe,bshe->bhts", q, cache_k)
            seen = jnp.arange(cache_k.shape[1])[None] < cache_len[:, None]
            old = jnp.where(seen[:, None, None], old, -1e30)
            p = jax.nn.softmax(jnp.concatenate([old, scores], -1), -1)
            n = cache_k.shape[1]
            o = jnp.einsum("bhts,bshe->bthe", p[..., :n], cache_v)
            o = o + jnp.einsum("bhtu,buhe->bthe", p[..., n:], v)
        else:
            o = jnp.einsum("bhtu,buhe->bthe", jax.nn.softmax(scores, -1), v)
        x_btd = x_btd + self.out(o.reshape(B, T, DIM))
        return x_btd + jnp.tanh(self.mlp(x_btd)), k, v


class TinyLM(nnx.Module):
    """A causal LM with learned absolute positions; its __call__ is the seam's `apply`."""

    num_layers, num_kv_heads, head_dim, vocab_size = LAYERS, HEADS, DIM // HEADS, VOCAB

    def __init__(self, rngs: nnx.Rngs):
        self.embed = nnx.Embed(VOCAB, DIM, embedding_init=nnx.initializers.normal(1.0), rngs=rngs)
        self.pos = nnx.Embed(256, DIM, embedding_init=nnx.initializers.normal(0.5), rngs=rngs)
        self.blocks = nnx.List([Block(rngs) for _ in range(LAYERS)])
        self.head = nnx.Linear(DIM, VOCAB, kernel_init=nnx.initializers.normal(1.0), rngs=rngs)

    def __call__(self, tokens_bt, positions_bt, mask_btu, cache: KVCache | None, logits_rows_br):
        x = self.embed(tokens_bt) + self.pos(positions_bt)
        ks, vs = [], []
        for i, block in enumerate(self.blocks):
            ck = None if cache is None else cache.k[i]
            cv = None if cache is None else cache.v[i]
            x, k, v = block(x, mask_btu, ck, cv, None if cache is None else cache.lengths)
            ks.append(k)
            vs.append(v)
        if logits_rows_br is not None:
            x = jnp.take_along_axis(x, logits_rows_br[:, :, None], axis=1)
        return self.head(x), jnp.stack(ks), jnp.stack(vs)


@pytest.fixture(scope="module")
def model64():
    with jax.enable_x64(True):
        module = TinyLM(nnx.Rngs(0))
        # float64 params: no rounding, so any difference is a real one
        graphdef, state = nnx.split(module)
        state = jax.tree.map(lambda x: x.astype(jnp.float64), state)
        yield lj.from_nnx(nnx.merge(graphdef, state), max_context=256, eos_ids=(0,))


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
            configs=(lj.LookaheadConfig.for_budget(16), lj.LookaheadConfig(3, 2, 2)),
            max_new_tokens=20,
            batch_sizes=(5, 2),
        )
    assert all(a > 0 for a in accepted.values()), accepted  # guesses did land


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
                leaky, PROMPTS[:2], configs=(lj.LookaheadConfig.for_budget(8),), max_new_tokens=8
            )


def test_from_nnx_refuses_what_it_cannot_use():
    with pytest.raises(ValueError, match="nnx.Module"):
        lj.from_nnx(object(), max_context=16)

    class NoShape(nnx.Module):
        def __init__(self):
            self.vocab_size = 4

    with pytest.raises(ValueError, match="cache_shape"):
        lj.from_nnx(NoShape(), max_context=16)
