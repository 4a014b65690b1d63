"""The lookahead step's token layout: positions and attention mask from (N, W, G) alone."""

import itertools

import numpy as np
import pytest

from lookahead_jax.lookahead_layout import StepLayout

# N=4, W=5, G=2, written by hand: the input, window levels a0/a1/a2 (5 columns each),
# candidates v0/v1 (3 tokens each). Row = query, column = key.
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


def test_mask_and_positions_n4_w5_g2_by_hand():
    rows = [line.split()[1:] for line in EXPECTED_N4_W5_G2.strip().splitlines()]
    expected = np.array([[c == "x" for c in row] for row in rows])
    lay = StepLayout(4, 5, 2)
    assert lay.num_tokens == 22
    np.testing.assert_array_equal(lay.mask, expected)
    np.testing.assert_array_equal(lay.offsets, EXPECTED_OFFSETS_N4_W5_G2)
    # logits: the input, the newest level's 5 columns, all 6 candidate tokens
    assert lay.logits_rows.tolist() == [0, 11, 12, 13, 14, 15, *range(16, 22)]


def branch_of(lay: StepLayout, t: int):
    """('in',), ('win', level, col) or ('cand', c, i) for token index t."""
    if t == 0:
        return ("in",)
    if t < lay.verify_start:
        level, col = divmod(t - 1, lay.w)
        return ("win", level, col)
    c, i = divmod(t - lay.verify_start, lay.m)
    return ("cand", c, i)


CONFIGS = [(2, 1, 0), (2, 3, 2), (3, 1, 1), (4, 5, 2), (5, 7, 7), (5, 15, 15), (6, 2, 4)]


@pytest.mark.parametrize("n,w,g", CONFIGS)
def test_each_token_sees_exactly_its_causal_context(n, w, g):
    lay = StepLayout(n, w, g)
    mask, off = lay.mask, lay.offsets
    for t in range(lay.num_tokens):
        seen = np.flatnonzero(mask[t])
        # one token at each position from the input's up to its own: a causal sequence
        assert sorted(off[seen].tolist()) == list(range(off[t] + 1)), branch_of(lay, t)
        assert mask[t, t] and mask[t, 0]
        kind = branch_of(lay, t)
        for u in seen:
            other = branch_of(lay, u)
            if kind[0] == "cand":  # a candidate sees the input and its own earlier tokens
                assert other == ("in",) or (
                    other[0] == "cand" and other[1] == kind[1] and other[2] <= kind[2]
                )
            elif kind[0] == "win":  # a window token never sees a candidate
                assert other[0] in ("in", "win")
                if other[0] == "win" and other[1] > 0:
                    assert other[2] == kind[2] and other[1] <= kind[1]  # its own column
            else:
                assert other == ("in",)


@pytest.mark.parametrize("n,w,g", CONFIGS)
def test_logits_rows_are_the_used_predictions(n, w, g):
    lay = StepLayout(n, w, g)
    rows = lay.logits_rows
    assert len(rows) == 1 + w + g * (n - 1) and len(set(rows.tolist())) == len(rows)
    kinds = [branch_of(lay, int(t)) for t in rows]
    assert kinds[0] == ("in",)
    assert all(k[0] == "win" and k[1] == n - 2 for k in kinds[1 : 1 + w])
    assert all(k[0] == "cand" for k in kinds[1 + w :])


def test_token_counts():
    for n, w, g in itertools.product(range(2, 7), range(1, 6), range(0, 5)):
        assert StepLayout(n, w, g).num_tokens == 1 + (n - 1) * w + g * (n - 1)


def test_window_paths_n4_w5():
    lay = StepLayout(4, 5, 2, verify_window=True)
    node = lambda level, col: level * 5 + col  # noqa: E731
    # level 2, column 3: along level 0 to column 3, then up column 3
    path = lay.window_paths[node(2, 3)]
    depth = lay.window_depths[node(2, 3)]
    assert depth == 6
    assert path[:depth].tolist() == [
        node(0, 0),
        node(0, 1),
        node(0, 2),
        node(0, 3),
        node(1, 3),
        node(2, 3),
    ]
    assert lay.window_parent(0, 0) == -1 and lay.window_parent(0, 2) == node(0, 1)
    assert lay.window_parent(1, 2) == node(0, 2)
    assert lay.max_emit == 4 + 5 - 1
    assert len(lay.logits_rows) == lay.num_tokens  # every token has logits
    assert StepLayout(4, 5, 2).max_emit == 4


@pytest.mark.parametrize("n,w,g", CONFIGS)
def test_each_window_path_is_what_its_last_node_sees(n, w, g):
    """A window node's causal context is exactly the input and its path: the path is a
    guess of the next tokens that the pass verifies like a candidate."""
    lay = StepLayout(n, w, g, verify_window=True)
    for k in range(lay.m * lay.w):
        d = lay.window_depths[k]
        path = lay.window_paths[k][:d]
        seen = set(np.flatnonzero(lay.mask[1 + k]).tolist())
        assert seen == {0, *(1 + path).tolist()}
        assert lay.offsets[1 + path].tolist() == list(range(1, d + 1))  # consecutive
