"""The n-gram pool: deduplicated inserts, first-in-first-out eviction, capacity, lookups."""

import jax.numpy as jnp
import numpy as np

from lookahead_jax.guesses import ngram_pool


def insert(pool, items, row=0, batch=1):
    """items: list of (key, tail) or (key, tail, prev) inserted in order into `row`."""
    m = pool.tokens.shape[-1]
    keys = np.zeros((batch, len(items)), np.int32)
    tails = np.zeros((batch, len(items), m), np.int32)
    ok = np.zeros((batch, len(items)), bool)
    prev = np.full((batch, len(items)), ngram_pool.EMPTY, np.int32)
    for i, item in enumerate(items):
        keys[row, i], tails[row, i], ok[row, i] = item[0], item[1], True
        if len(item) > 2:
            prev[row, i] = item[2]
    return ngram_pool.insert(
        pool, jnp.asarray(keys), jnp.asarray(tails), jnp.asarray(ok), jnp.asarray(prev)
    )


def entries(pool, key, row=0, prev=ngram_pool.EMPTY, count=None):
    """The stored tails of `key` in lookup order (best first)."""
    b = pool.tokens.shape[0]
    tails, valid, _ = ngram_pool.lookup(
        pool, jnp.full((b,), key), jnp.full((b,), prev), count or pool.capacity
    )
    return [
        tuple(t)
        for t, v in zip(
            np.asarray(tails[row]).tolist(), np.asarray(valid[row]).tolist(), strict=True
        )
        if v
    ]


def test_docstring_example():
    pool = ngram_pool.init_pool(1, 10, capacity=2, ngram_tail=1)
    pool = insert(pool, [(7, [3], 1)])
    assert entries(pool, 7) == [(3,)]
    pool = insert(pool, [(7, [3], 4)])
    assert entries(pool, 7) == [(3,)] and np.asarray(pool.hits)[0, 7].tolist() == [2, 0]
    pool = insert(pool, [(7, [5], 1)])
    assert entries(pool, 7) == [(3,), (5,)]  # 3 was inserted twice
    assert entries(pool, 7, prev=1) == [(5,), (3,)]  # 5 was seen after 1 (3's prev is now 4)
    pool = insert(pool, [(7, [9], 2)])
    assert sorted(entries(pool, 7)) == [(5,), (9,)]  # 3 was the oldest
    assert np.asarray(pool.hits)[0, 7].tolist() == [1, 1]
    assert entries(pool, 3) == []


def test_lookup_prefers_context_then_hits_then_the_newest():
    pool = ngram_pool.init_pool(1, 10, capacity=4, ngram_tail=1)
    pool = insert(pool, [(2, [1], 0), (2, [3], 0), (2, [3], 0), (2, [4], 0), (2, [5], 6)])
    assert entries(pool, 2) == [(3,), (5,), (4,), (1,)]
    assert entries(pool, 2, prev=6, count=2) == [(5,), (3,)]


def test_duplicates_inside_one_batch_of_inserts():
    pool = ngram_pool.init_pool(1, 20, capacity=3, ngram_tail=2)
    pool = insert(pool, [(4, [1, 2]), (4, [1, 2]), (4, [2, 1]), (4, [1, 2]), (5, [1, 2])])
    assert sorted(entries(pool, 4)) == [(1, 2), (2, 1)]
    assert entries(pool, 5) == [(1, 2)]
    assert int(pool.fill[0, 4]) == 2


def test_fifo_eviction_keeps_the_newest_capacity_entries():
    cap = 4
    pool = ngram_pool.init_pool(1, 50, capacity=cap, ngram_tail=3)
    seq = [(9, [i, i + 1, i + 2]) for i in range(11)]
    pool = insert(pool, seq)
    assert sorted(entries(pool, 9)) == sorted(tuple(t) for _, t in seq[-cap:])
    assert int(pool.fill[0, 9]) == cap


def test_rows_are_independent_and_skipped_items_do_nothing():
    pool = ngram_pool.init_pool(2, 10, capacity=2, ngram_tail=1)
    pool = insert(pool, [(1, [2])], row=1, batch=2)
    assert entries(pool, 1, row=1) == [(2,)] and entries(pool, 1, row=0) == []
    keys, tails = jnp.array([[1], [1]]), jnp.array([[[3]], [[4]]])
    pool = ngram_pool.insert(
        pool, keys, tails, jnp.array([[False], [False]]), jnp.zeros((2, 1), jnp.int32)
    )
    assert entries(pool, 1, row=1) == [(2,)] and entries(pool, 1, row=0) == []


def test_zero_capacity_is_a_no_op():
    pool = ngram_pool.init_pool(1, 10, capacity=0, ngram_tail=2)
    pool = insert(pool, [(1, [2, 3])])
    assert pool.tokens.shape == (1, 10, 0, 2) and entries(pool, 1) == []


def test_sequence_ngrams_respects_bounds():
    tokens = jnp.asarray([[10, 11, 12, 13, 14, 0, 0]])
    keys, tails, ok, prev = ngram_pool.sequence_ngrams(
        tokens, jnp.array([-1]), 5, 3, jnp.array([5])
    )
    assert keys.tolist()[0][1:4] == [10, 11, 12]
    assert prev.tolist()[0][1:4] == [ngram_pool.EMPTY, 10, 11]
    assert tails.tolist()[0][1:4] == [[11, 12], [12, 13], [13, 14]]
    assert ok.tolist() == [[False, True, True, True, False]]  # start -1; 3 + 3 > 5
