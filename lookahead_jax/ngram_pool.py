"""The n-gram pool: per batch row, per key token, a ring of up to G distinct (N-1)-grams.

    tokens [B, V, G, M]   M = N-1 follower tokens of each stored n-gram
    head   [B, V]         the ring slot the next insert for that key writes
    fill   [B, V]         slots in use (0..G); slots >= fill are empty

An n-gram is (key, f_1..f_M). Inserting one that the key's ring already holds
is a no-op (deduplicated); otherwise it goes to slot `head`, which is the oldest
entry once the ring is full (first in, first out). Example with G=2, M=1, key 7:

    insert (7, 3): slots [3, -]  head 1 fill 1
    insert (7, 3): unchanged (duplicate)
    insert (7, 5): slots [3, 5]  head 0 fill 2
    insert (7, 9): slots [9, 5]  head 1 fill 2   <- 3 was the oldest

Everything is fixed-shape; an empty slot is padding that `lookup` marks invalid.
"""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp


@jax.tree_util.register_dataclass
@dataclasses.dataclass
class NGramPool:
    tokens: jax.Array  # [B, V, G, M] int32
    head: jax.Array  # [B, V] int32
    fill: jax.Array  # [B, V] int32

    @property
    def capacity(self) -> int:
        return self.tokens.shape[2]


def init_pool(batch: int, vocab: int, capacity: int, ngram_tail: int) -> NGramPool:
    return NGramPool(
        tokens=jnp.zeros((batch, vocab, capacity, ngram_tail), jnp.int32),
        head=jnp.zeros((batch, vocab), jnp.int32),
        fill=jnp.zeros((batch, vocab), jnp.int32),
    )


def lookup(pool: NGramPool, key_b):
    """The stored n-grams for each row's key: tails [B, G, M] and valid [B, G]."""
    rows = jnp.arange(key_b.shape[0])
    tails = pool.tokens[rows, key_b]
    valid = jnp.arange(pool.capacity)[None, :] < pool.fill[rows, key_b][:, None]
    return tails, valid


def _insert_row(tokens_vgm, head_v, fill_v, key, tail_m, ok):
    """Insert one n-gram into one row's pool (no-op if `ok` is False or a duplicate)."""
    g = tokens_vgm.shape[1]
    slots = tokens_vgm[key]  # [G, M]
    used = jnp.arange(g) < fill_v[key]
    dup = jnp.any(jnp.all(slots == tail_m[None], axis=-1) & used)
    do = ok & ~dup
    h = head_v[key]
    tokens_vgm = tokens_vgm.at[key, h].set(jnp.where(do, tail_m, slots[h]))
    head_v = head_v.at[key].set(jnp.where(do, (h + 1) % g, h))
    fill_v = fill_v.at[key].set(jnp.where(do, jnp.minimum(fill_v[key] + 1, g), fill_v[key]))
    return tokens_vgm, head_v, fill_v


def insert(pool: NGramPool, keys_bi, tails_bim, ok_bi) -> NGramPool:
    """Insert I n-grams per row, in order i = 0..I-1 (later ones are newer).

    keys [B, I], tails [B, I, M], ok [B, I] (False entries are skipped).
    """
    if pool.capacity == 0 or keys_bi.shape[1] == 0:
        return pool
    insert_all_rows = jax.vmap(_insert_row)

    def body(i, carry):
        tokens, head, fill = carry
        return insert_all_rows(tokens, head, fill, keys_bi[:, i], tails_bim[:, i], ok_bi[:, i])

    tokens, head, fill = jax.lax.fori_loop(
        0, keys_bi.shape[1], body, (pool.tokens, pool.head, pool.fill)
    )
    return NGramPool(tokens=tokens, head=head, fill=fill)


def sequence_ngrams(tokens_bs, start_b, count: int, n: int, end_b):
    """The n-grams of a token sequence that start at `start_b + i`, i < count.

    Returns keys [B, count], tails [B, count, n-1], ok [B, count]; an n-gram is
    ok when it lies inside [0, end_b) (end exclusive).
    """
    offs = start_b[:, None] + jnp.arange(count)[None]  # [B, count]
    idx = offs[:, :, None] + jnp.arange(n)[None, None]  # [B, count, n]
    s = tokens_bs.shape[1]
    grams = jnp.take_along_axis(tokens_bs, jnp.clip(idx, 0, s - 1).reshape(len(offs), -1), axis=1)
    grams = grams.reshape(idx.shape)
    ok = (offs >= 0) & (offs + n <= end_b[:, None])
    return grams[:, :, 0], grams[:, :, 1:], ok
