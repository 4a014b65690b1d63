"""The n-gram pool: per batch row, per key token, a ring of up to C distinct (N-1)-grams.

    tokens [B, V, C, M]   M = N-1 follower tokens of each stored n-gram
    head   [B, V]         the ring entry the next insert for that key writes
    fill   [B, V]         entries in use (0..C); entries >= fill are empty
    prev   [B, V, C]      the token before the key when the n-gram was last inserted
                          (EMPTY if unknown): its 2-token context
    hits   [B, V, C]      how often the n-gram was inserted

An n-gram is (key, f_1..f_M), seen after a token `prev`. Inserting one that the key's
ring already holds counts a hit and records the new `prev` (deduplicated); otherwise it
goes to entry `head`, which is the oldest entry once the ring is full (first in, first
out). Example with C=2, M=1, key 7:

    insert (7, 3) after 1: entries [3, -]  hits [1, 0]  head 1 fill 1
    insert (7, 3) after 4: entries [3, -]  hits [2, 0]  (duplicate: a hit; prev now 4)
    insert (7, 5) after 1: entries [3, 5]  hits [2, 1]  head 0 fill 2
    insert (7, 9) after 2: entries [9, 5]  hits [1, 1]  head 1 fill 2   <- 3 was the oldest

`lookup` returns the G best of a key's n-grams (G <= C): those whose 2-token context
matches the row's first, then the most inserted, then the newest. Everything is
fixed-shape; an empty entry is padding that `lookup` marks invalid.
"""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
from jaxtyping import Array, Int

from lookahead_jax.errors import UserInputError
from lookahead_jax.guesses.draft_tree import Proposals, chains
from lookahead_jax.guesses.guess_source import Prompt, Text, Verified, check_int

EMPTY = -1


@jax.tree_util.register_dataclass
@dataclasses.dataclass
class NGramPool:
    tokens: Int[Array, "B V C M"]
    head: Int[Array, "B V"]
    fill: Int[Array, "B V"]
    prev: Int[Array, "B V C"]
    hits: Int[Array, "B V C"]

    @property
    def capacity(self) -> int:
        return self.tokens.shape[2]


def init_pool(batch: int, vocab: int, capacity: int, ngram_tail: int) -> NGramPool:
    return NGramPool(
        tokens=jnp.zeros((batch, vocab, capacity, ngram_tail), jnp.int32),
        head=jnp.zeros((batch, vocab), jnp.int32),
        fill=jnp.zeros((batch, vocab), jnp.int32),
        prev=jnp.full((batch, vocab, capacity), EMPTY, jnp.int32),
        hits=jnp.zeros((batch, vocab, capacity), jnp.int32),
    )


def lookup(pool: NGramPool, key_b, prev_b, count: int):
    """The `count` best stored n-grams for each row's key (whose previous token is
    `prev_b`): tails [B, count, M], valid [B, count] and whether each one's 2-token
    context matches [B, count]. Best: context match, then hits, then the newest."""
    rows = jnp.arange(key_b.shape[0])
    c = pool.capacity
    tails = pool.tokens[rows, key_b]  # [B, C, M]
    entry = jnp.arange(c)[None]
    used = entry < pool.fill[rows, key_b][:, None]
    match = pool.prev[rows, key_b] == prev_b[:, None]
    age = (pool.head[rows, key_b][:, None] - 1 - entry) % c  # 0 = the newest
    hits = pool.hits[rows, key_b]
    score = jnp.where(used, (match * (c + 1) * 1024 + jnp.minimum(hits, 1023)) * (c + 1) - age, -1)
    best, idx = jax.lax.top_k(score, count)
    take = lambda x: jnp.take_along_axis(x, idx, axis=1)  # noqa: E731
    return jnp.take_along_axis(tails, idx[:, :, None], axis=1), best >= 0, take(match)


def _insert_row(tokens_vcm, head_v, fill_v, prev_vc, hits_vc, key, tail_m, prev, ok):
    """Insert one n-gram into one row's pool (a hit if it is already there; a no-op if
    `ok` is False)."""
    c = tokens_vcm.shape[1]
    entries = tokens_vcm[key]  # [C, M]
    used = jnp.arange(c) < fill_v[key]
    same = jnp.all(entries == tail_m[None], axis=-1) & used
    dup = jnp.any(same)
    do = ok & ~dup
    h = head_v[key]
    # a new n-gram goes to the head entry; a duplicate updates its own entry
    at = jnp.where(dup, jnp.argmax(same), h)
    tokens_vcm = tokens_vcm.at[key, h].set(jnp.where(do, tail_m, entries[h]))
    prev_vc = prev_vc.at[key, at].set(jnp.where(ok, prev, prev_vc[key, at]))
    hits_vc = hits_vc.at[key, at].set(
        jnp.where(ok, jnp.where(dup, hits_vc[key, at] + 1, 1), hits_vc[key, at])
    )
    head_v = head_v.at[key].set(jnp.where(do, (h + 1) % c, h))
    fill_v = fill_v.at[key].set(jnp.where(do, jnp.minimum(fill_v[key] + 1, c), fill_v[key]))
    return tokens_vcm, head_v, fill_v, prev_vc, hits_vc


def insert(pool: NGramPool, keys_bi, tails_bim, ok_bi, prev_bi) -> NGramPool:
    """Insert I n-grams per row, in order i = 0..I-1 (later ones are newer).

    keys [B, I], tails [B, I, M], ok [B, I] (False entries are skipped), prev [B, I]:
    the token before each key (EMPTY if none).
    """
    if pool.capacity == 0 or keys_bi.shape[1] == 0:
        return pool
    insert_all_rows = jax.vmap(_insert_row)

    def body(i, carry):
        return insert_all_rows(*carry, keys_bi[:, i], tails_bim[:, i], prev_bi[:, i], ok_bi[:, i])

    carry = (pool.tokens, pool.head, pool.fill, pool.prev, pool.hits)
    return NGramPool(*jax.lax.fori_loop(0, keys_bi.shape[1], body, carry))


def sequence_ngrams(tokens_bs, start_b, count: int, n: int, end_b):
    """The n-grams of a token sequence that start at `start_b + i`, i < count.

    Returns keys [B, count], tails [B, count, n-1], ok [B, count] and prev [B, count]
    (the token before each key, EMPTY at the sequence start); an n-gram is ok when it
    lies inside [0, end_b) (end exclusive).
    """
    offs = start_b[:, None] + jnp.arange(count)[None]  # [B, count]
    idx = offs[:, :, None] + jnp.arange(-1, n)[None, None]  # [B, count, 1 + n]
    s = tokens_bs.shape[1]
    grams = jnp.take_along_axis(tokens_bs, jnp.clip(idx, 0, s - 1).reshape(len(offs), -1), axis=1)
    grams = grams.reshape(idx.shape)
    ok = (offs >= 0) & (offs + n <= end_b[:, None])
    prev = jnp.where(offs >= 1, grams[:, :, 0], EMPTY)
    return grams[:, :, 1], grams[:, :, 2:], ok, prev


# Modelled chance that a pool guess is right when its parent is (without, with the
# 2-token context matching): the merge orders proposals by it (guess_source.py).
POOL_RATES = (0.35, 0.5)


@dataclasses.dataclass(frozen=True)
class PoolSource:
    """The pool as a guess source: the G best (N-1)-grams keyed by each row's input.

    g         n-grams proposed per step (G chains of M = N-1 tokens)
    m         tokens after the key (the window's levels: N-1)
    capacity  n-grams kept per key (C >= G)
    prompt_pool  seed the pool with every n-gram of the prompt (else only the one that
                 ends at the first new token)

    Fed every step with the Jacobi window's n-grams and those of the emitted text that
    end at new tokens.
    """

    g: int
    m: int
    capacity: int
    prompt_pool: bool = True
    name: str = "pool"

    @property
    def nodes(self) -> int:
        return self.g * self.m

    @property
    def depth(self) -> int:
        return self.m

    def init(self, prompt: Prompt) -> NGramPool:
        B, n = prompt.tokens.shape[0], self.m + 1
        pool = init_pool(B, prompt.vocab, self.capacity, self.m)
        if self.prompt_pool:  # every n-gram ending at or before position P (prompt bucket)
            start, count = jnp.zeros((B,), jnp.int32), max(prompt.bucket - n + 2, 0)
        else:
            start, count = prompt.end - n, 1
        keys, tails, ok, prev = sequence_ngrams(prompt.tokens, start, count, n, prompt.end)
        return insert(pool, keys, tails, ok & prompt.active[:, None], prev)

    def propose(self, pool: NGramPool, text: Text) -> Proposals:
        tails_bgm, valid_bg, match_bg = lookup(pool, text.input, text.prev, self.g)
        rate_bg = jnp.asarray(POOL_RATES, jnp.float32)[match_bg.astype(jnp.int32)]
        score_bgm = rate_bg[:, :, None] ** jnp.arange(1, self.m + 1)[None, None]
        return chains(tails_bgm, valid_bg * self.m, score_bgm)

    def feed(self, pool: NGramPool, step: Verified) -> NGramPool:
        w = step.window
        pool = insert(pool, w.keys, w.tails, w.ok, w.prev)
        n = self.m + 1
        keys, tails, ok, prev = sequence_ngrams(
            step.tokens, step.start - n + 1, step.max_emit, n, step.end
        )
        return insert(pool, keys, tails, ok & step.active[:, None], prev)


@dataclasses.dataclass(frozen=True)
class PoolSettings:
    """The pool's knobs in LookaheadConfig (guess_source.SourceSettings); its node count
    is the paper's G, a field of the config itself (the 'N,W,G' spelling).

    pool_capacity  n-grams kept per key (None: G)
    prompt_pool    seed the pool with the prompt's n-grams
    """

    pool_capacity: int | None = None
    prompt_pool: bool = True

    def __post_init__(self):
        check_int("pool_capacity", self.pool_capacity, 1, none_ok=True)

    def check(self, config) -> None:
        if self.pool_capacity is not None and self.pool_capacity < config.g:
            raise UserInputError(
                f"lookahead pool_capacity ({self.pool_capacity}) must be at least G ({config.g})"
            )

    def source(self, config) -> PoolSource | None:
        if not config.g:
            return None
        capacity = self.pool_capacity or config.g
        return PoolSource(config.g, config.m, capacity, self.prompt_pool)

    def describe(self, config) -> dict:
        return {"pool_capacity": self.pool_capacity or config.g, "prompt_pool": self.prompt_pool}
