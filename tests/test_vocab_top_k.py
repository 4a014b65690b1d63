"""vocab_top_k.top_k, the vocabulary top-k that logprobs and token recycling read every
step, against jax.lax.top_k."""

import jax
import numpy as np

from lookahead_jax import vocab_top_k


def test_two_stage_top_k_is_lax_top_k():
    """vocab_top_k.top_k (the k best chunks' maxima, then a top-k among them) against
    jax.lax.top_k: random rows, rows whose best values share a chunk, ties."""
    rng = np.random.default_rng(0)
    V = 64 * vocab_top_k.CHUNK
    x = rng.standard_normal((3, 4, V)).astype(np.float32)
    x[1, 0, :40] = 10 + np.arange(40)  # the 20 best in one chunk
    x[2, 0] = 1.0  # all tied: values only
    for k in (0, 1, 5, 20):
        values, ids = jax.jit(vocab_top_k.top_k, static_argnums=1)(x, k)
        want_values, want_ids = jax.lax.top_k(x, k)
        np.testing.assert_array_equal(values, want_values)
        np.testing.assert_array_equal(np.asarray(ids)[:2], np.asarray(want_ids)[:2])
        np.testing.assert_array_equal(np.take_along_axis(x, np.asarray(ids), -1), values)
