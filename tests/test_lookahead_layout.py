"""The lookahead step's token layout: positions and attention mask from (N, W) and a
draft tree."""

import itertools

import jax.numpy as jnp
import numpy as np
import pytest

from lookahead_jax.guesses import draft_tree
from lookahead_jax.guesses.lookahead_layout import StepLayout

# N=4, W=5 and a 6-node tree of two chains, written by hand: the input, window levels
# a0/a1/a2 (5 columns each), chains v0/v1 (3 tokens each). Row = query, column = key.
EXPECTED_N4_W5_G2 = """
in  x . . . . . . . . . . . . . . . . . . . . .
a00 x x . . . . . . . . . . . . . . . . . . . .
a01 x x x . . . . . . . . . . . . . . . . . . .
a02 x x x x . . . . . . . . . . . . . . . . . .
a03 x x x x x . . . . . . . . . . . . . . . . .
a04 x x x x x x . . . . . . . . . . . . . . . .
a10 x x . . . . x . . . . . . . . . . . . . . .
a11 x x x . . . . x . . . . . . . . . . . . . .
a12 x x x x . . . . x . . . . . . . . . . . . .
a13 x x x x x . . . . x . . . . . . . . . . . .
a14 x x x x x x . . . . x . . . . . . . . . . .
a20 x x . . . . x . . . . x . . . . . . . . . .
a21 x x x . . . . x . . . . x . . . . . . . . .
a22 x x x x . . . . x . . . . x . . . . . . . .
a23 x x x x x . . . . x . . . . x . . . . . . .
a24 x x x x x x . . . . x . . . . x . . . . . .
v00 x . . . . . . . . . . . . . . . x . . . . .
v01 x . . . . . . . . . . . . . . . x x . . . .
v02 x . . . . . . . . . . . . . . . x x x . . .
v10 x . . . . . . . . . . . . . . . . . . x . .
v11 x . . . . . . . . . . . . . . . . . . x x .
v12 x . . . . . . . . . . . . . . . . . . x x x
"""
EXPECTED_OFFSETS_N4_W5_G2 = [0, 1, 2, 3, 4, 5, 2, 3, 4, 5, 6, 3, 4, 5, 6, 7, 1, 2, 3, 1, 2, 3]


def two_chains(tokens):
    """A merged tree holding chains of 3 tokens each (one row)."""
    c = len(tokens)
    prop = draft_tree.chains(
        jnp.asarray([tokens]), jnp.full((1, c), 3), jnp.full((1, c, 3), 0.5), source=0
    )
    return draft_tree.merge(prop, 3 * c, 3)


def test_mask_and_positions_n4_w5_two_chains_by_hand():
    rows = [line.split()[1:] for line in EXPECTED_N4_W5_G2.strip().splitlines()]
    expected = np.array([[c == "x" for c in row] for row in rows])
    lay = StepLayout(4, 5, 6)
    assert lay.num_tokens == 22
    tree = two_chains([[7, 8, 9], [10, 11, 12]])
    np.testing.assert_array_equal(np.asarray(lay.mask(tree.ancestors))[0], expected)
    np.testing.assert_array_equal(np.asarray(lay.offsets(tree.depth))[0], EXPECTED_OFFSETS_N4_W5_G2)
    # logits: the input, the newest level's 5 columns, all 6 tree nodes
    assert lay.logits_rows.tolist() == [0, 11, 12, 13, 14, 15, *range(16, 22)]


def test_chains_sharing_a_prefix_share_nodes():
    """v1 = (7, 8, 12) shares v0's first two tokens: it takes one node, below v0's second."""
    tree = two_chains([[7, 8, 9], [7, 8, 12]])
    assert np.asarray(tree.valid)[0].tolist() == [True, True, True, True, False, False]
    assert np.asarray(tree.tokens)[0, :4].tolist() == [7, 8, 9, 12]
    assert np.asarray(tree.parent)[0, :4].tolist() == [-1, 0, 1, 1]


def window_kind(lay: StepLayout, t: int):
    """('in',) or ('win', level, col) for an input/window token index t."""
    if t == 0:
        return ("in",)
    return ("win", *divmod(t - 1, lay.w))


CONFIGS = [(2, 1, 0), (2, 3, 2), (3, 1, 1), (4, 5, 2), (5, 7, 7), (5, 15, 15), (6, 2, 4), (3, 0, 5)]


@pytest.mark.parametrize("n,w,nodes", CONFIGS)
def test_each_window_token_sees_exactly_its_causal_context(n, w, nodes):
    lay = StepLayout(n, w, nodes)
    mask, off = lay.static_mask, lay.static_offsets
    for t in range(lay.tree_start):
        seen = np.flatnonzero(mask[t])
        # never a tree node, and one token at each position from the input's to its own
        assert seen.max() < lay.tree_start
        assert sorted(off[seen].tolist()) == list(range(off[t] + 1)), window_kind(lay, t)
        assert mask[t, t] and mask[t, 0]
        kind = window_kind(lay, t)
        for u in seen:
            other = window_kind(lay, u)
            if kind[0] == "win" and other[0] == "win" and other[1] > 0:
                assert other[2] == kind[2] and other[1] <= kind[1]  # its own column
    for t in range(lay.tree_start, lay.num_tokens):  # tree rows: the input, then data
        assert np.flatnonzero(mask[t]).tolist() == [0]


@pytest.mark.parametrize("n,w,nodes", CONFIGS)
def test_logits_rows_are_the_used_predictions(n, w, nodes):
    lay = StepLayout(n, w, nodes)
    rows = lay.logits_rows
    assert len(rows) == 1 + w + nodes and len(set(rows.tolist())) == len(rows)
    assert rows[0] == 0
    assert all(window_kind(lay, int(t)) == ("win", n - 2, j) for j, t in enumerate(rows[1 : 1 + w]))
    assert rows[1 + w :].tolist() == list(range(lay.tree_start, lay.num_tokens))


def test_token_counts():
    for n, w, d in itertools.product(range(2, 7), range(0, 6), range(0, 9)):
        assert StepLayout(n, w, d).num_tokens == 1 + (n - 1) * w + d


def test_window_paths_n4_w5():
    lay = StepLayout(4, 5, 6, verify_window=True)
    node = lambda level, col: level * 5 + col  # noqa: E731
    # level 2, column 3: along level 0 to column 3, then up column 3
    path = np.flatnonzero(lay.window_ancestors[node(2, 3)]).tolist()
    assert lay.window_depths[node(2, 3)] == 6
    assert path == [node(0, 0), node(0, 1), node(0, 2), node(0, 3), node(1, 3), node(2, 3)]
    assert lay.window_parent(0, 0) == -1 and lay.window_parent(0, 2) == node(0, 1)
    assert lay.window_parent(1, 2) == node(0, 2)
    assert len(lay.logits_rows) == lay.num_tokens  # every token has logits


@pytest.mark.parametrize("n,w,nodes", CONFIGS)
def test_each_window_path_is_what_its_last_node_sees(n, w, nodes):
    """A window node's causal context is exactly the input and its path: the path is a
    guess of the next tokens that the pass verifies like a tree node."""
    lay = StepLayout(n, w, nodes, verify_window=True)
    for k in range(lay.window_tokens):
        path = np.flatnonzero(lay.window_ancestors[k])
        seen = set(np.flatnonzero(lay.static_mask[1 + k]).tolist())
        assert seen == {0, *(1 + path).tolist()}
        assert sorted(lay.static_offsets[1 + path].tolist()) == list(
            range(1, lay.window_depths[k] + 1)
        )
