"""Top-k / top-p without a sort keeps the tokens the sort-based filter kept: the old
filter (an ascending sort, top-k's k-th value and top-p's cumulative sum from it) is kept
here as the reference, and the kept sets are compared over many rows of random logits,
heavy ties included, each row with its own k and p; a seeded choice of tokens is the same
with either filter."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from lookahead_jax.decoding import sampling
from lookahead_jax.decoding.sampling import RowSampling, SamplingConfig, choose_tokens


def sorted_top_k_top_p(x, k_b, p_b):
    """The filter as it was before issue 34 (sampling.py at 69c4128): one ascending sort."""
    neg_inf = jnp.asarray(-jnp.inf, x.dtype)
    vocab = x.shape[-1]
    sorted_x = jnp.sort(x, axis=-1)  # ascending
    kth = jnp.take_along_axis(sorted_x, (vocab - k_b)[:, None, None], axis=-1)
    kth = jnp.broadcast_to(kth, (*x.shape[:-1], 1))
    x = jnp.where(x < kth, neg_inf, x)
    sorted_x = jnp.where(sorted_x < kth, neg_inf, sorted_x)  # still ascending
    cum = jnp.cumsum(jax.nn.softmax(sorted_x, axis=-1), axis=-1)
    p = p_b[:, None, None]
    n_drop = jnp.minimum(jnp.sum(cum <= 1.0 - p, axis=-1, keepdims=True), vocab - 1)
    cutoff = jnp.take_along_axis(sorted_x, n_drop, axis=-1)
    return jnp.where((p < 1.0) & (x < cutoff), neg_inf, x)


old_filter = jax.jit(sorted_top_k_top_p)
new_filter = jax.jit(sampling._top_k_top_p)


def random_settings(rng, batch, vocab):
    """k_b, p_b as process_logits passes them: V = top-k off, 1 = top-p off (a third each).
    k is log-uniform (small k often), p half uniform, half close to 1 (where top-p keeps
    the least likely tokens top-k left); p sits on no particular partial sum."""
    k_b = np.exp(rng.uniform(0, np.log(vocab + 1), batch)).astype(np.int32).clip(1, vocab)
    k_b = np.where(rng.random(batch) < 1 / 3, vocab, k_b)
    p_b = np.where(
        rng.random(batch) < 0.5, rng.uniform(1e-3, 1, batch), 1 - 10 ** rng.uniform(-3, 0, batch)
    )
    p_b = np.where(rng.random(batch) < 1 / 3, 1.0, p_b)
    return k_b.astype(np.int32), p_b.astype(np.float32)


def logits_of(kind, rng, shape, dtype):
    if kind == "ties":  # a small integer range: every cut falls in a group of ties
        return rng.integers(-3, 4, shape).astype(dtype)
    if kind == "signed_zeros":  # -0.0 and 0.0 are one value to a sort
        x = (rng.integers(-2, 3, shape) * 0.5).astype(dtype)
        return np.where((x == 0) & (rng.random(shape) < 0.5), -0.0, x).astype(dtype)
    if kind == "masked":  # -inf logits (a padded vocabulary), at least one finite
        x = rng.integers(-3, 4, shape).astype(dtype)
        x = np.where(rng.random(shape) < 0.3, -np.inf, x)
        x[..., 0] = 0.0
        return x.astype(dtype)
    return (rng.standard_normal(shape) * 3).astype(dtype)  # "normal": no ties


@pytest.mark.parametrize("kind", ["ties", "signed_zeros", "masked", "normal"])
@pytest.mark.parametrize("dtype", ["float32", "float64"])
def test_threshold_filter_keeps_what_the_sort_kept(kind, dtype):
    rng = np.random.default_rng(["ties", "signed_zeros", "masked", "normal"].index(kind))
    batch, positions = 512, 3
    with jax.enable_x64(dtype == "float64"):
        for vocab in (1, 40):
            x = logits_of(kind, rng, (batch, positions, vocab), np.dtype(dtype))
            k_b, p_b = random_settings(rng, batch, vocab)
            want = np.asarray(old_filter(x, k_b, p_b))
            got = np.asarray(new_filter(x, k_b, p_b))
            assert got.dtype == want.dtype == np.dtype(dtype)
            # the same array bit for bit: kept tokens unchanged, the rest -inf
            np.testing.assert_array_equal(
                got.view(f"u{got.itemsize}"), want.view(f"u{got.itemsize}")
            )
            if kind != "normal" and vocab > 5:  # the ties are real: some cut falls in a tied group
                kept = got > -np.inf
                least_kept = np.min(np.where(kept, x, np.inf), axis=-1, keepdims=True)
                assert np.sum(kept & (x == least_kept), axis=-1).max() > 1


def test_exact_cuts_and_ties_at_the_cut():
    """Probabilities that are exact in binary, so cumulative sums hit 1 - p exactly: a
    token whose ascending cumulative probability equals 1 - p goes, and a cut inside a
    group of equal logits keeps the whole group, as in HF."""
    l2 = np.float32(np.log(2))
    x = np.asarray(
        [
            [[0.0, -l2, -2 * l2, -2 * l2, -np.inf]],  # 1/2, 1/4, 1/8, 1/8, 0
            [[0.0, 0.0, 0.0, 0.0, -np.inf]],  # 1/4 each
            [[1.0, 1.0, 0.0, 0.0, 0.0]],
        ],
        np.float32,
    )
    q = np.asarray(jax.nn.softmax(x, axis=-1))
    np.testing.assert_array_equal(q[:2, 0], [[0.5, 0.25, 0.125, 0.125, 0], [0.25] * 4 + [0]])
    for k, p in [
        (1, 1.0),
        (2, 1.0),
        (5, 0.25),
        (5, 0.5),
        (5, 0.75),
        (5, 0.875),
        (3, 0.5),
        (2, 0.99),
    ]:
        k_b, p_b = np.full(3, k, np.int32), np.full(3, p, np.float32)
        want = np.asarray(old_filter(x, k_b, p_b))
        np.testing.assert_array_equal(np.asarray(new_filter(x, k_b, p_b)), want, f"k={k} p={p}")

    def kept(k, p):
        return (
            np.asarray(new_filter(x, np.full(3, k, np.int32), np.full(3, p, np.float32))) > -np.inf
        )

    # p = 1/2: the cumulative sums are 1/8, 1/4, 1/2, 1; 1/2 <= 1 - p goes
    np.testing.assert_array_equal(kept(5, 0.5)[0, 0], [1, 0, 0, 0, 0])
    np.testing.assert_array_equal(kept(5, 0.75)[0, 0], [1, 1, 0, 0, 0])
    # p = 7/8: the cut falls between the two 1/8 tokens, and both stay
    np.testing.assert_array_equal(kept(5, 0.875)[0, 0], [1, 1, 1, 1, 0])
    np.testing.assert_array_equal(kept(5, 0.25)[1, 0], [1, 1, 1, 1, 0])
    np.testing.assert_array_equal(kept(1, 1.0)[2, 0], [1, 1, 0, 0, 0])  # k = 1, tied maxima


def test_p_on_a_partial_sum_moves_the_cut_by_at_most_one_value():
    """Where p lies within float rounding of a partial sum of the probabilities, the two
    filters add them in different orders and may cut on either side of that value; then
    the kept sets differ by exactly one group of equal logits, the one next to the cut."""
    rng = np.random.default_rng(5)
    batch, vocab = 2048, 48
    x = (rng.standard_normal((batch, 1, vocab)) * 2).astype(np.float32)
    cum = np.cumsum(np.sort(np.asarray(jax.nn.softmax(x, axis=-1), np.float64), -1), -1)
    p_b = (1 - cum[np.arange(batch), 0, rng.integers(0, vocab - 1, batch)]).astype(np.float32)
    p_b = np.clip(p_b, 1e-6, np.float32(1) - np.finfo(np.float32).epsneg)
    k_b = np.full(batch, vocab, np.int32)
    old = np.asarray(old_filter(x, k_b, p_b)) > -np.inf
    new = np.asarray(new_filter(x, k_b, p_b)) > -np.inf
    differ = np.any(old != new, axis=-1)[:, 0]
    n_old, n_new = old.sum(-1)[differ, 0], new.sum(-1)[differ, 0]
    assert differ.mean() < 0.2  # most rows still agree
    np.testing.assert_array_equal(np.abs(n_old - n_new), 1)  # no ties here: one token


@pytest.mark.parametrize("vocab", [50])
def test_seeded_tokens_equal_with_the_sorted_filter(monkeypatch, vocab):
    """choose_tokens draws the same tokens with the sorted filter: same kept set, same
    Gumbel noise. Rows mix greedy, temperature only, top-k, top-p, and both."""
    rng = np.random.default_rng(vocab)
    configs = [
        SamplingConfig(),
        SamplingConfig(temperature=1.0),
        SamplingConfig(temperature=0.7, top_k=3),
        SamplingConfig(temperature=1.3, top_p=0.8),
        SamplingConfig(temperature=1.0, top_k=5, top_p=0.9),
        SamplingConfig(temperature=2.0, top_k=1),
    ] * 6
    batch, positions = len(configs), 16
    logits = jnp.asarray(rng.integers(-4, 5, (batch, positions, vocab)), jnp.float32)
    rows = RowSampling.of(configs)
    keys = sampling.row_keys(3, batch)
    index = jnp.broadcast_to(jnp.arange(positions, dtype=jnp.int32), (batch, positions))

    def tokens():  # a new function each time: jit traces it anew, with the filter of now
        return np.asarray(jax.jit(lambda *a: choose_tokens(*a))(logits, rows, keys, index))

    new = tokens()
    monkeypatch.setattr(sampling, "_top_k_top_p", sorted_top_k_top_p)
    np.testing.assert_array_equal(new, tokens())
    assert len(np.unique(new[1])) > 1  # a sampling row does sample


def test_engine_keys_hashed_with_numpy_are_jax_fold_in():
    """keys_for hashes the engine's seeds with numpy (no eager JAX op to compile in a
    CLI call): the same bits as jax.random.fold_in(PRNGKey(seed), key), across the
    uint32 range of seeds and keys."""
    keys = np.array([0, 1, 7, 12345, 2**31 - 1, 2**31, 2**32 - 1], np.uint32)
    for seed in (0, 3, 2**31 - 1, 2**31, 2**32 - 1):
        base = jax.random.PRNGKey(seed)
        want = jax.vmap(lambda k, base=base: jax.random.fold_in(base, k))(jnp.asarray(keys))
        got = sampling.keys_for(seed, keys)
        assert isinstance(got, np.ndarray)
        np.testing.assert_array_equal(got, np.asarray(want))


def test_first_max_index_is_argmax():
    """sampling.first_max_index (a max, then the smallest index holding it) gives
    jnp.argmax's index: ties to the first, a NaN as the largest, all -inf, -0.0 == 0.0."""
    nan, inf = np.nan, np.inf
    rows = np.asarray(
        [[1, 3, 3, 2], [nan, 1, nan, 5], [2, 7, nan, 1], [-inf] * 4, [0.0, -0.0, 0.0, 1e-45]],
        np.float32,
    )
    rng = np.random.default_rng(0).standard_normal((3, 5, 257)).astype(np.float32)
    for x in (rows, rng, rng.astype(jnp.bfloat16)):
        want = np.asarray(jnp.argmax(x, axis=-1))
        got = np.asarray(jax.jit(sampling.first_max_index)(x))
        assert got.dtype == np.int32 and (got == want).all(), (got, want)
