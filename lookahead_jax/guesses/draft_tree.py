"""The draft tree: guesses from every source merged into one fixed-size tree, and its
verification.

Sources propose *nodes*: a token, a parent (another proposal, or the root = the step's
input token), a depth (tokens from the root, the node included) and a score (the
estimated chance that every token on the path from the root to the node is right). A
chain of k guessed tokens is k nodes, each the parent of the next; a tree template is
nodes whose parents fan out.

`merge` turns the `count` proposals of a row into a tree of Z nodes (`count` may exceed Z):

1. order the proposals by score, best first (a node never scores above its parent, and
   ties keep the proposal order, in which a parent always comes first); a row's
   acceptance record (acceptance_record.py) may weigh the scores by source and depth;
2. merge equal paths: a node is a *duplicate* when an earlier node has the same token,
   depth and (merged) parent, i.e. the same path from the root; duplicates take no node;
3. keep the first Z distinct nodes. Every kept node's parent comes earlier, so it is
   kept too: the tree is prefix-closed and node order is parent-before-child.

Example, Z=5, proposals (score order, root = r):

    proposal   path       kept as node   node's parent
    p0         r-a        0              root
    p1         r-a-b      1              0
    p2         r-c        2              root
    p3         r-a        duplicate of p0
    p4         r-a-d      3              0      (p4's parent p3 merged into p0)
    p5         r-a-b-e    4              1
    p6         r-c-f      - (no node left)

Each node sees the root, its ancestors and itself (and the cache): `ancestors[q, u]`
says node u lies on the path to node q (q included). A node at depth d sits at position
p + d, where p is the input's. Empty nodes are padding: they see only the root and
themselves, and no real node sees them.

`verify` applies the one acceptance rule: node q is right iff its token equals the
model's token after its parent (after the root for depth 1); the deepest node whose
whole path is right wins (the first such node on ties), and the step emits that path's
tokens plus the model's token after its last node (the bonus token). "The model's token"
is the greedy argmax or the seeded Gumbel-max sample (sampling.py): the rule is exact
for both.
"""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
from jaxtyping import Array, Bool, Float, Int

ROOT = -1  # parent index of a depth-1 node: the step's input token


@jax.tree_util.register_dataclass
@dataclasses.dataclass
class Proposals:
    """`count` proposed nodes per row, in proposal order (a parent always before its child).

    tokens  [B, count] int32
    parent  [B, count] int32  index of the parent proposal (< own index), or ROOT
    depth   [B, count] int32  1 for the root's children
    score   [B, count] float32  estimated chance that the whole path is right
    valid   [B, count] bool   a node whose parent is invalid is invalid too
    source  [B, count] int32  which source proposed it (its index in the step's sources,
                              LookaheadConfig.source_names; the step sets it)
    """

    tokens: Int[Array, "B Z"]
    parent: Int[Array, "B Z"]
    depth: Int[Array, "B Z"]
    score: Float[Array, "B Z"]
    valid: Bool[Array, "B Z"]
    source: Int[Array, "B Z"]

    @property
    def count(self) -> int:
        return self.tokens.shape[1]


def chains(tokens_bcm, length_bc, score_bcm, source: int = 0) -> Proposals:
    """C chains of up to M tokens each (the root's children are token 0 of each chain).

    tokens [B, C, M], length [B, C] (0..M real tokens), score [B, C, M]: the chance
    that the chain is right up to and including token i.
    """
    B, C, M = tokens_bcm.shape
    idx = jnp.arange(C * M, dtype=jnp.int32).reshape(C, M)
    parent = jnp.where(jnp.arange(M)[None] == 0, ROOT, idx - 1)  # [C, M]
    depth = jnp.broadcast_to(jnp.arange(1, M + 1, dtype=jnp.int32), (C, M))
    valid = jnp.arange(M)[None, None] < length_bc[:, :, None]
    flat = lambda x: jnp.broadcast_to(x, (B, C, M)).reshape(B, C * M)  # noqa: E731
    return Proposals(
        tokens=flat(tokens_bcm).astype(jnp.int32),
        parent=flat(parent),
        depth=flat(depth),
        score=flat(score_bcm).astype(jnp.float32),
        valid=flat(valid),
        source=jnp.full((B, C * M), source, jnp.int32),
    )


def no_proposals(batch: int) -> Proposals:
    """No guesses at all (a layout without sources)."""
    z = lambda dt: jnp.zeros((batch, 0), dt)  # noqa: E731
    return Proposals(
        z(jnp.int32), z(jnp.int32), z(jnp.int32), z(jnp.float32), z(bool), z(jnp.int32)
    )


def concat(parts: list[Proposals]) -> Proposals:
    """All sources' proposals in one list (parents re-indexed)."""
    out, offset = [], 0
    for p in parts:
        if p.count == 0:
            continue
        parent = jnp.where(p.parent == ROOT, ROOT, p.parent + offset)
        out.append(dataclasses.replace(p, parent=parent))
        offset += p.count
    return jax.tree.map(lambda *xs: jnp.concatenate(xs, axis=1), *out)


@jax.tree_util.register_dataclass
@dataclasses.dataclass
class DraftTree:
    """Z nodes per row in parent-before-child order (see the module docstring).

    tokens     [B, Z] int32   (0 in empty nodes)
    parent     [B, Z] int32   node of the parent (< own node), or ROOT
    depth      [B, Z] int32   1.. (1 in empty nodes: they sit at p + 1)
    valid      [B, Z] bool
    source     [B, Z] int32   the source of the first proposal merged into the node (in
                              merge order: the best score, weighed when weights are given)
    score      [B, Z] float32 that proposal's prior score (0 in empty nodes and window paths)
    ancestors  [B, Z, Z] bool node u is on the path to node q (q itself included)
    """

    tokens: Int[Array, "B Z"]
    parent: Int[Array, "B Z"]
    depth: Int[Array, "B Z"]
    valid: Bool[Array, "B Z"]
    source: Int[Array, "B Z"]
    score: Float[Array, "B Z"]
    ancestors: Bool[Array, "B Z Z"]

    @property
    def nodes(self) -> int:
        return self.tokens.shape[1]


def empty(batch: int) -> DraftTree:
    """A tree of no nodes."""
    z = lambda dt, *shape: jnp.zeros((batch, *shape), dt)  # noqa: E731
    return DraftTree(
        z(jnp.int32, 0),
        z(jnp.int32, 0),
        z(jnp.int32, 0),
        z(bool, 0),
        z(jnp.int32, 0),
        z(jnp.float32, 0),
        z(bool, 0, 0),
    )


def concat_trees(first: DraftTree, second: DraftTree) -> DraftTree:
    """Both trees' nodes side by side (first's, then second's), verified together."""
    B, d1 = first.tokens.shape
    d2 = second.tokens.shape[1]
    cat = lambda a, b: jnp.concatenate([a, b], axis=1)  # noqa: E731
    parent2 = jnp.where(second.parent == ROOT, ROOT, second.parent + d1)
    anc = jnp.zeros((B, d1 + d2, d1 + d2), bool)
    anc = anc.at[:, :d1, :d1].set(first.ancestors).at[:, d1:, d1:].set(second.ancestors)
    return DraftTree(
        tokens=cat(first.tokens, second.tokens),
        parent=cat(first.parent, parent2),
        depth=cat(first.depth, second.depth),
        valid=cat(first.valid, second.valid),
        source=cat(first.source, second.source),
        score=cat(first.score, second.score),
        ancestors=anc,
    )


def _gather_rows(x, idx):
    """x[b, idx[b, j]] (x and idx [B, any width]) with ROOT (-1) indices clipped to 0
    (callers mask them)."""
    return jnp.take_along_axis(x, jnp.maximum(idx, 0), axis=1)


def _propagate_down(parent, score, valid, max_depth: int):
    """Scores made non-increasing and validity inherited along every path ([B, count])."""

    def body(_, sv):
        score, valid = sv
        has_parent = parent != ROOT
        parent_score = jnp.where(has_parent, _gather_rows(score, parent), jnp.inf)
        parent_valid = jnp.where(has_parent, _gather_rows(valid, parent), True)
        return jnp.minimum(score, parent_score), valid & parent_valid

    return jax.lax.fori_loop(0, max_depth, body, (score, valid))


def ancestors_of(parent_bz, max_depth: int):
    """[B, Z, Z] bool: node u is on the path from the root to node q (q included).

    Needs parent < own index (or ROOT); `max_depth` bounds the path length."""
    B, Z = parent_bz.shape
    eye = jnp.broadcast_to(jnp.eye(Z, dtype=bool), (B, Z, Z))

    def body(_, anc):
        up = jnp.take_along_axis(anc, jnp.maximum(parent_bz, 0)[:, :, None], axis=1)
        return eye | (up & (parent_bz != ROOT)[:, :, None])

    return jax.lax.fori_loop(0, max_depth, body, eye)


def merge(p: Proposals, nodes: int, max_depth: int, weight_bja=None) -> DraftTree:
    """Merge equal paths and keep the best `nodes` distinct nodes (module docstring).

    max_depth: the deepest proposal (a static bound, e.g. the longest chain).
    weight_bja: None, or [B, J, A] factors (acceptance_record.weights): a node of source
    j at depth d is ordered by its score x weight[j, d - 1] (then made non-increasing
    along its path) instead of its score. The tree keeps the unweighted score."""
    B, count = p.tokens.shape
    prior, valid = _propagate_down(p.parent, p.score, p.valid, max_depth)
    key = prior
    if weight_bja is not None:
        J, A = weight_bja.shape[1:]
        cell = jnp.clip(p.source, 0, J - 1) * A + jnp.clip(p.depth - 1, 0, A - 1)
        w = jnp.take_along_axis(weight_bja.reshape(B, J * A), cell, axis=1)
        key, _ = _propagate_down(p.parent, prior * w, valid, max_depth)
    # 1. best first; invalid nodes last; ties keep proposal order (stable sort), so a
    #    parent (key >= its child's, earlier index) always precedes its child
    order = jnp.argsort(jnp.where(valid, -key, jnp.inf), axis=1, stable=True)  # [B, count]
    rank = jnp.argsort(order, axis=1)  # inverse permutation
    sort = lambda x: jnp.take_along_axis(x, order, axis=1)  # noqa: E731
    tokens, depth, source, score = sort(p.tokens), sort(p.depth), sort(p.source), sort(prior)
    valid = sort(valid)
    parent = sort(p.parent)
    parent = jnp.where(parent == ROOT, ROOT, _gather_rows(rank, parent))  # sorted indices

    # 2. same_path[u, v]: nodes u and v are the same path from the root; built depth
    #    by depth (a node's path is its parent's path plus its token)
    same_node = (
        valid[:, :, None]
        & valid[:, None, :]
        & (tokens[:, :, None] == tokens[:, None, :])
        & (depth[:, :, None] == depth[:, None, :])
    )
    is_root_child = parent == ROOT
    both_root = is_root_child[:, :, None] & is_root_child[:, None, :]
    pu = jnp.maximum(parent, 0)

    def body(_, same):
        # same[parent[u], parent[v]]
        # of_parent [B, count, count]: same[pu, v']
        of_parent = jnp.take_along_axis(same, pu[:, :, None], axis=1)
        parents_same = jnp.take_along_axis(of_parent, pu[:, None, :], axis=2)  # same[pu, pv]
        not_root = ~is_root_child[:, :, None] & ~is_root_child[:, None, :]
        return same_node & (both_root | (parents_same & not_root))

    same = jax.lax.fori_loop(0, max_depth, body, same_node & both_root)
    first = jnp.argmax(same, axis=2)  # [B, count] the earliest node with u's path (u if none)
    distinct = valid & (first == jnp.arange(count)[None])

    # 3. the first `nodes` distinct nodes; a duplicate's children hang below its original
    n_distinct = jnp.cumsum(distinct, axis=1)
    keep = distinct & (n_distinct <= nodes)
    node = jnp.where(keep, n_distinct - 1, nodes)  # `nodes` = dropped (out of range)
    rep_parent = jnp.where(parent == ROOT, ROOT, _gather_rows(first, parent))
    parent_node = jnp.where(rep_parent == ROOT, ROOT, _gather_rows(node, rep_parent))

    def scatter(values, fill):
        out = jnp.full((B, nodes), fill, values.dtype)
        return jax.vmap(lambda o, s, v: o.at[s].set(v, mode="drop"))(out, node, values)

    tree_parent = scatter(parent_node, ROOT)
    return DraftTree(
        tokens=scatter(tokens, 0),
        parent=tree_parent,
        depth=scatter(depth, 1),
        valid=scatter(keep, False),
        source=scatter(source, -1),
        score=scatter(score, 0.0),
        ancestors=ancestors_of(tree_parent, max_depth),
    )


@jax.tree_util.register_dataclass
@dataclasses.dataclass
class Acceptance:
    """The verified outcome of one step, per row.

    accepted  [B] int32     guessed tokens accepted (0..max depth)
    path      [B, A] int32  nodes of the accepted path, depth 1 first (A = max depth;
                            entries >= accepted are meaningless)
    emitted   [B, E] int32  the step's tokens (E = A + 1): the accepted ones, then the bonus
    source    [B] int32     source of the accepted path's last node (-1 if none)
    right     [B, Z] bool   nodes whose whole path is right (the accepted path's nodes, and
                            any other node holding the same path)
    """

    accepted: Int[Array, " B"]
    path: Int[Array, "B A"]
    emitted: Int[Array, "B E"]
    source: Int[Array, " B"]
    right: Bool[Array, "B Z"]


def is_right(tokens, expected):
    """A guess is right iff it equals the model's token at its position. The one
    acceptance rule: exact for greedy decoding and, because the model's token is the
    seeded Gumbel-max choice (sampling.py), for sampling too."""
    return tokens == expected


def verify(tree: DraftTree, after_root_b, after_node_bz, max_depth: int) -> Acceptance:
    """The deepest right path, plus the model's token after it (module docstring).

    after_root [B]     the model's token after the input
    after_node [B, Z]  the model's token after each node
    """
    B, Z = tree.tokens.shape
    if Z == 0 or max_depth == 0:
        zeros = jnp.zeros((B,), jnp.int32)
        emitted = jnp.zeros((B, max_depth + 1), jnp.int32).at[:, 0].set(after_root_b)
        path = jnp.zeros((B, max_depth), jnp.int32)
        return Acceptance(zeros, path, emitted, zeros - 1, jnp.zeros((B, Z), bool))
    expected = jnp.where(
        tree.parent == ROOT, after_root_b[:, None], _gather_rows(after_node_bz, tree.parent)
    )
    right = tree.valid & is_right(tree.tokens, expected)  # [B, Z]
    path_right = tree.valid & ~jnp.any(tree.ancestors & ~right[:, None, :], axis=2)
    reach = jnp.where(path_right, tree.depth, 0)
    best = jnp.argmax(reach, axis=1)  # first deepest
    accepted = jnp.take_along_axis(reach, best[:, None], axis=1)[:, 0]
    on_path = jnp.take_along_axis(tree.ancestors, best[:, None, None], axis=1)[:, 0]  # [B, Z]
    levels = jnp.arange(1, max_depth + 1)[None, :, None]
    at_level = on_path[:, None, :] & (tree.depth[:, None, :] == levels)  # [B, A, Z]
    path = jnp.argmax(at_level, axis=2).astype(jnp.int32)  # [B, A]
    path_tokens = jnp.take_along_axis(tree.tokens, path, axis=1)
    bonus = jnp.where(
        accepted > 0, jnp.take_along_axis(after_node_bz, best[:, None], axis=1)[:, 0], after_root_b
    )
    i = jnp.arange(max_depth + 1)[None]
    padded = jnp.pad(path_tokens, ((0, 0), (0, 1)))
    emitted = jnp.where(
        i < accepted[:, None], padded, jnp.where(i == accepted[:, None], bonus[:, None], 0)
    )
    source = jnp.where(
        accepted > 0, jnp.take_along_axis(tree.source, best[:, None], axis=1)[:, 0], -1
    )
    return Acceptance(
        accepted=accepted.astype(jnp.int32),
        path=path,
        emitted=emitted.astype(jnp.int32),
        source=source.astype(jnp.int32),
        right=path_right,
    )
