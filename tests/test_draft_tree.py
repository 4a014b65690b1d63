"""The draft tree (draft_tree.py) against pure-Python references, with hypothesis:

* merge: a node's parent comes before it; `ancestors` is exactly each node's path; no two
  nodes hold the same path; the kept paths are the best-scored distinct ones (scores
  weighed by source and depth when a weight is given, as the acceptance record does),
  and when the nodes suffice every distinct path is kept;
* verify: the deepest all-right path (the first on ties), its tokens and the bonus, and
  which nodes' paths are right;
* the step's mask built from a merged tree: a tree node sees the input, its ancestors and
  itself, never another branch.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from lookahead_jax.guesses import draft_tree
from lookahead_jax.guesses.draft_tree import ROOT
from lookahead_jax.guesses.lookahead_layout import StepLayout

SETTINGS = settings(deadline=None, max_examples=40, database=None)
MAX_DEPTH = 4
MAX_NODES = 12
TREE_SIZES = (1, 2, 5, 9, 14)  # 14: more nodes than any proposals have


@st.composite
def proposals(draw):
    """A few sources' worth of random forests over a tiny vocabulary (so that equal
    paths are common), as numpy arrays [B, N]: B = 2 rows of N = 12 nodes, the last of
    them invalid padding after a drawn count, and the tree's size from a few; fixed
    shapes, so that the examples share a few compiled programs instead of one each."""
    b, n = 2, MAX_NODES
    proposed = draw(st.integers(1, n))
    vocab = draw(st.integers(1, 3))
    rng = np.random.default_rng(draw(st.integers(0, 2**31 - 1)))
    parent = np.full((b, n), ROOT, np.int32)
    depth = np.ones((b, n), np.int32)
    for row in range(b):
        for i in range(n):
            # a parent among the earlier nodes that are not too deep, or the root
            options = [j for j in range(i) if depth[row, j] < MAX_DEPTH]
            if options and rng.random() < 0.7:
                parent[row, i] = rng.choice(options)
                depth[row, i] = depth[row, parent[row, i]] + 1
    tokens = rng.integers(0, vocab, (b, n)).astype(np.int32)
    # scores from a small set, so that ties are common
    score = rng.choice([0.1, 0.3, 0.5, 0.9], (b, n)).astype(np.float32)
    valid = (rng.random((b, n)) < 0.85) & (np.arange(n) < proposed)[None]
    source = rng.integers(0, 3, (b, n)).astype(np.int32)
    nodes = draw(st.sampled_from(TREE_SIZES))
    weight = None  # or a factor per (source, depth), from a small set so ties stay common
    if draw(st.booleans()):
        weight = rng.choice([0.25, 1.0, 2.0], (b, 3, MAX_DEPTH)).astype(np.float32)
    return (
        dict(tokens=tokens, parent=parent, depth=depth, score=score, valid=valid, source=source),
        nodes,
        weight,
    )


def reference_merge(p: dict, row: int, nodes: int, weight=None):
    """[(path tuple, source, prior score)] in node order, by the rules of the module
    docstring, and the set of distinct paths."""
    n = p["tokens"].shape[1]
    path, ok, prior, key = [], [], [], []
    for i in range(n):
        par = p["parent"][row, i]
        base, base_ok, base_prior, base_key = (
            ((), True, np.inf, np.inf)
            if par == ROOT
            else (path[par], ok[par], prior[par], key[par])
        )
        w = 1.0 if weight is None else weight[row, p["source"][row, i], p["depth"][row, i] - 1]
        path.append(base + (int(p["tokens"][row, i]),))
        ok.append(base_ok and bool(p["valid"][row, i]))
        prior.append(min(base_prior, float(p["score"][row, i])))
        key.append(min(base_key, prior[-1] * float(w)))
    order = sorted((i for i in range(n) if ok[i]), key=lambda i: (-key[i], i))
    kept, seen = [], set()
    for i in order:
        if path[i] in seen:
            continue
        seen.add(path[i])
        if len(kept) < nodes:
            kept.append((path[i], int(p["source"][row, i]), prior[i]))
    return kept, seen


_merge = jax.jit(draft_tree.merge, static_argnums=(1, 2))


def slot_paths(tree, row: int):
    """The token path of every valid node, from the parent pointers."""
    tokens, parent, valid = (np.asarray(x)[row] for x in (tree.tokens, tree.parent, tree.valid))
    out = []
    for q in range(len(tokens)):
        if not valid[q]:
            out.append(None)
            continue
        chain, node = [], q
        while node != ROOT:
            chain.append(int(tokens[node]))
            node = int(parent[node])
        out.append(tuple(reversed(chain)))
    return out


@SETTINGS
@given(proposals())
def test_merge_keeps_the_best_distinct_paths_as_a_prefix_closed_tree(case):
    p, nodes, weight = case
    tree = _merge(
        draft_tree.Proposals(**{k: jnp.asarray(v) for k, v in p.items()}),
        nodes,
        MAX_DEPTH,
        None if weight is None else jnp.asarray(weight),
    )
    parent, depth, valid, source, score, anc = (
        np.asarray(x)
        for x in (tree.parent, tree.depth, tree.valid, tree.source, tree.score, tree.ancestors)
    )
    for row in range(parent.shape[0]):
        want, distinct = reference_merge(p, row, nodes, weight)
        paths = slot_paths(tree, row)
        n_valid = int(valid[row].sum())
        # valid nodes first, in the reference's order, with the representative's source
        # and its prior (unweighted) score
        assert valid[row, :n_valid].all() and not valid[row, n_valid:].any()
        got = [(paths[q], int(source[row, q]), float(score[row, q])) for q in range(n_valid)]
        assert got == want
        if nodes >= len(distinct):  # room for all: every distinct path is kept
            assert {paths[q] for q in range(n_valid)} == distinct
        for q in range(n_valid):
            par = parent[row, q]
            assert par == ROOT or (0 <= par < q and valid[row, par])  # parent first
            assert depth[row, q] == (1 if par == ROOT else depth[row, par] + 1)
            assert depth[row, q] == len(paths[q])
            on_path, node = set(), q
            while node != ROOT:
                on_path.add(node)
                node = int(parent[row, node])
            assert set(np.flatnonzero(anc[row, q]).tolist()) == on_path  # no other branch
        for q in range(n_valid, len(paths)):  # padding: alone, at depth 1
            assert parent[row, q] == ROOT and np.flatnonzero(anc[row, q]).tolist() == [q]


def reference_verify(paths, tokens, parent, after_root, after_node):
    """(accepted, best node or None, the nodes whose whole path is right) per the one rule."""
    best, best_depth, all_right = None, 0, set()
    for q, path in enumerate(paths):
        if path is None:
            continue
        node, right = q, True
        while node != ROOT:
            par = int(parent[node])
            expected = after_root if par == ROOT else after_node[par]
            right &= int(tokens[node]) == int(expected)
            node = par
        if right:
            all_right.add(q)
        if right and len(path) > best_depth:
            best, best_depth = q, len(path)
    return best_depth, best, all_right


_verify = jax.jit(draft_tree.verify, static_argnums=3)


@SETTINGS
@given(proposals(), st.integers(0, 2**31 - 1))
def test_verify_accepts_the_deepest_all_right_path_plus_the_bonus(case, seed):
    p, nodes, _ = case
    tree = _merge(
        draft_tree.Proposals(**{k: jnp.asarray(v) for k, v in p.items()}), nodes, MAX_DEPTH
    )
    rng = np.random.default_rng(seed)
    b, d = tree.tokens.shape
    tokens, parent = np.asarray(tree.tokens), np.asarray(tree.parent)
    # the model's tokens: mostly what the tree guessed, so that deep paths are right
    after_root = np.where(rng.random(b) < 0.7, tokens[:, 0], rng.integers(0, 3, b)).astype(np.int32)
    after_node = rng.integers(0, 3, (b, d)).astype(np.int32)
    for row in range(b):
        for q in range(d):
            children = np.flatnonzero(parent[row] == q)
            if len(children) and rng.random() < 0.7:
                after_node[row, q] = tokens[row, rng.choice(children)]
    acc = _verify(tree, jnp.asarray(after_root), jnp.asarray(after_node), MAX_DEPTH)
    accepted, path, emitted, source = (
        np.asarray(x) for x in (acc.accepted, acc.path, acc.emitted, acc.source)
    )
    for row in range(b):
        paths = slot_paths(tree, row)
        want_a, best, all_right = reference_verify(
            paths, tokens[row], parent[row], after_root[row], after_node[row]
        )
        assert set(np.flatnonzero(np.asarray(acc.right)[row]).tolist()) == all_right
        assert accepted[row] == want_a
        if want_a == 0:
            assert emitted[row, 0] == after_root[row] and source[row] == -1
            continue
        walk = path[row, :want_a].tolist()
        assert walk[-1] == best and [len(paths[q]) for q in walk] == list(range(1, want_a + 1))
        assert emitted[row, :want_a].tolist() == list(paths[best])
        assert emitted[row, want_a] == after_node[row, best]  # the bonus token
        assert source[row] == np.asarray(tree.source)[row, best]


@settings(deadline=None, max_examples=20, database=None)  # a structural check: 20 suffice
@given(proposals(), st.integers(1, 4), st.integers(0, 3))
def test_step_mask_tree_rows_see_the_input_their_ancestors_and_themselves(case, n, w):
    p, nodes, _ = case
    tree = _merge(
        draft_tree.Proposals(**{k: jnp.asarray(v) for k, v in p.items()}), nodes, MAX_DEPTH
    )
    lay = StepLayout(n + 1, w, nodes)
    mask = np.asarray(lay.mask(tree.ancestors))
    offsets = np.asarray(lay.offsets(tree.depth))
    s = lay.tree_start
    for row in range(mask.shape[0]):
        np.testing.assert_array_equal(mask[row, :s], lay.static_mask[:s])  # input and window
        for q in range(nodes):
            seen = set(np.flatnonzero(mask[row, s + q]).tolist())
            want = {0} | {s + u for u in np.flatnonzero(np.asarray(tree.ancestors)[row, q])}
            assert seen == want
            # one token at each position from the input's up to its own
            assert sorted(offsets[row, list(seen)].tolist()) == list(range(offsets[row, s + q] + 1))
