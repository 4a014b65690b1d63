"""The Jacobi window, the paper's own mechanism: M = N-1 levels of W columns of tokens,
fed through every lookahead step at static positions under a static mask
(lookahead_layout.py). Each step appends a new level, the model's token at each of the
newest level's positions (its argmax, or a sampling row's draw), and drops the oldest; the
W n-grams that completes (a column's levels, oldest first, then the new token) feed the
n-gram pool (ngram_pool.py). With `verify_window` its own columns are verified as paths too.

It is not a guess source of guess_source.py's protocol, which proposes draft-tree nodes
each step: its tokens take fixed places in every step, outside the merged tree, and it
moves by what the forward computed at them, not by what was verified. It is credited like
one (SOURCE: "window", after the sources) in the stats and the acceptance record.

Shapes: window [B, M, W] (level m, column w); the step feeds it flattened [B, M*W] in
window order (lookahead_layout.py).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

from lookahead_jax.guesses import draft_tree
from lookahead_jax.guesses.guess_source import WindowNGrams
from lookahead_jax.guesses.lookahead_layout import StepLayout

SOURCE = "window"  # its name in LookaheadConfig.source_names, after the sources'

# A window cell's draw key is the row key folded with this (new-token indices, used for
# sampling noise, never reach it).
_KEY_SALT = 0x7FFFFFFF


def init(rng_b2, prompt_len_b, tokens_bs, m: int, w: int):
    """[B, M, W]: each row's first window, tokens drawn from its prompt (positions below
    prompt_len_b [B], keyed by the row's key rng_b2 [B, 2])."""

    def draw(rng, prompt_len, tokens):
        rng = jax.random.fold_in(rng, _KEY_SALT)
        return tokens[jax.random.randint(rng, (m, w), 0, prompt_len)]

    return jax.vmap(draw)(rng_b2, prompt_len_b, tokens_bs)


def shift(window_bmw, new_level_bw):
    """[B, M, W]: the window after a step, its oldest level dropped and new_level_bw [B, W]
    appended (the caller keeps the old window for rows that did not decode)."""
    return jnp.concatenate([window_bmw[:, 1:], new_level_bw[:, None]], axis=1)


def ngrams(window_bmw, shifted_bmw, input_b, active_b) -> WindowNGrams:
    """The window's W n-grams of this step: each column's oldest level, then its other
    levels and the new level (the shifted window's column); a level-0 token follows the
    one left of it, column 0 the step's input."""
    B, _, w = window_bmw.shape
    # [:, :w]: without a window (W = 0) the input alone would make prev [B, 1]
    prev_bw = jnp.concatenate([input_b[:, None], window_bmw[:, 0, :-1]], axis=1)[:, :w]
    return WindowNGrams(
        keys=window_bmw[:, 0],
        tails=jnp.swapaxes(shifted_bmw, 1, 2),
        prev=prev_bw,
        ok=jnp.broadcast_to(active_b[:, None], (B, w)),
    )


def as_tree(layout: StepLayout, window_flat, source: int) -> draft_tree.DraftTree:
    """The window's own paths as a verifiable tree (verify_window): static shape.

    window_flat [B, M*W]: the window's tokens in window order (its M*W cells);
    source: the window's index in the source names."""
    B, k = window_flat.shape
    bcast = lambda x: jnp.broadcast_to(jnp.asarray(x), (B, *np.shape(x)))  # noqa: E731
    return draft_tree.DraftTree(
        tokens=window_flat,
        parent=bcast(layout.window_parents),
        depth=bcast(layout.window_depths),
        valid=jnp.ones((B, k), bool),
        source=jnp.full((B, k), source, jnp.int32),
        score=jnp.zeros((B, k), jnp.float32),
        ancestors=bcast(layout.window_ancestors),
    )
