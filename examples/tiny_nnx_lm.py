"""Bring your own model: a tiny Flax NNX causal LM written against the seam's call
(lookahead_jax/models/seam.py), decoded with lookahead through lj.from_nnx, and checked with the
public exactness harness. Run it:

    python examples/tiny_nnx_lm.py

The module's __call__ is the seam's `apply`:

    (tokens [B, T], positions [B, T], mask [B|1, T, T], cache: KVCache | None,
     logits_rows [B, R] | None) -> logits [B, R, V], new_k, new_v (L arrays [B, K, T, Dh])

The cache holds one buffer per layer, cache.k[l] and cache.v[l] of [B, K, S, Dh]; the new
tokens' K/V come back in the same layout.

It attends to the row's cache slots below cache.lengths[b] and to the new tokens the mask
allows, and never writes the cache (the decoder commits the entries it keeps).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
from flax import nnx

import lookahead_jax as lj
from lookahead_jax.models.kv_cache import KVCache

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
        q = heads(q)
        k, v = jnp.swapaxes(heads(k), 1, 2), jnp.swapaxes(heads(v), 1, 2)  # [B, K, T, Dh]
        scores = jnp.einsum("bthe,bhue->bhtu", q, k)
        scores = jnp.where(mask_btu[:, None], scores, -1e30)
        if cache_k is not None:  # the row's cache slots below its length, then the new tokens
            old = jnp.einsum("bthe,bhse->bhts", q, cache_k)
            seen = jnp.arange(cache_k.shape[2])[None] < cache_len[:, None]
            old = jnp.where(seen[:, None, None], old, -1e30)
            p = jax.nn.softmax(jnp.concatenate([old, scores], -1), -1)
            n = cache_k.shape[2]
            o = jnp.einsum("bhts,bhse->bthe", p[..., :n], cache_v)
            o = o + jnp.einsum("bhtu,bhue->bthe", p[..., n:], v)
        else:
            o = jnp.einsum("bhtu,bhue->bthe", jax.nn.softmax(scores, -1), v)
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
        return self.head(x), tuple(ks), tuple(vs)


def tiny_model(dtype=jnp.float32) -> lj.Model:
    """TinyLM with seeded random weights in `dtype` (float64 needs jax.enable_x64)."""
    graphdef, state = nnx.split(TinyLM(nnx.Rngs(0)))
    state = jax.tree.map(lambda x: x.astype(dtype), state)
    return lj.from_nnx(nnx.merge(graphdef, state), max_context=256, eos_ids=(0,))


def main() -> None:
    prompts = [[5, 6, 7, 5, 6, 7, 5], [11, 12, 13, 14, 15, 11, 12, 13]]
    out = lj.generate(
        tiny_model(), prompts, max_new_tokens=24, lookahead=lj.LookaheadConfig.for_tokens(8)
    )
    print("tokens:", out.token_ids)
    print("forward passes per row:", out.steps)
    with jax.enable_x64(True):  # float64 params: any difference from plain is a real one
        model64 = tiny_model(jnp.float64)
        gap = lj.testing.pass_agreement(model64, prompts[1])
        print(f"largest logit gap, one pass vs token by token: {gap:.1e}")
        lj.testing.assert_lookahead_matches_plain(model64, prompts, max_new_tokens=16)
    print("lookahead == plain greedy, token for token")


if __name__ == "__main__":
    main()
