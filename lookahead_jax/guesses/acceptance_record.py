"""The per-row acceptance record that adapts how the draft tree is filled.

The tree has a fixed number of nodes Z and the sources propose more nodes than that;
`draft_tree.merge` keeps the best-scored ones. A node's score is a modelled chance that
its path is right, from rates fixed per source (the priors beside each source:
POOL_RATES, SUFFIX_RATES, RECYCLE_RATES) and
what the source knows of the node (a suffix match's length, a recycled token's
probability). Which source pays differs by row and along a row: a row copying code
accepts long suffix matches, a row writing prose accepts short recycled guesses. So each
row keeps, on the device, per source j and tree depth a (1..A):

    expected[b, j, a]  the sum of the prior scores of the nodes it was offered
                       (the tokens the priors said it would get accepted there)
    accepted[b, j, a]  the tokens it really got accepted there (0 or 1 per step: the
                       right path holds one node per depth)

both decayed by DECAY each step the row decodes, so that the record follows the row.
The next step weighs every proposal's score by

    weight[b, j, a] = (accepted + PRIOR_TOKENS) / (expected + PRIOR_TOKENS)

(> 1: the source beat its prior at that depth for this row; < 1: it fell short) before
`merge` orders them. PRIOR_TOKENS keeps a young record near 1, and a source that lost its
nodes sees both sums decay and its weight return to 1, so it is tried again.

Example, one row, recycling at depth 1 (other cells alike; DECAY 0.9, PRIOR_TOKENS 0.5):

    step   offered nodes' scores   one right?   expected   accepted   weight
    1      0.45 + 0.15              yes          0.60       1.00       1.50 / 1.10 = 1.36
    2      0.45 + 0.15              no           1.14       0.90       1.40 / 1.64 = 0.85

Only which candidates fill the tree changes: verification checks every node against the
model's own token as before, so the output is the same with or without the record.
"""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
from jaxtyping import Array, Float

from lookahead_jax.guesses.draft_tree import Acceptance, DraftTree

# Chosen on 12 prompts (one per MT-bench category and code kind), tokens=16, greedy:
# compression 2.457 without the record; DECAY/PRIOR_TOKENS 0.98/2: 2.477, 0.95/1: 2.489,
# 0.9/0.5: 2.507, 0.8/0.25: 2.504 (benchmarks/cpu/adapt.md).
DECAY = 0.9  # per decoding step: the record remembers about the last 10 steps
PRIOR_TOKENS = 0.5  # pseudo-tokens on both sides of the ratio (weight 1 for a new row)


@jax.tree_util.register_dataclass
@dataclasses.dataclass
class AcceptanceRecord:
    """expected [B, J, A], accepted [B, J, A] float32 (J guess sources, A tree depths)."""

    expected: Float[Array, "B J A"]
    accepted: Float[Array, "B J A"]


def init(batch: int, sources: int, depth: int) -> AcceptanceRecord:
    zeros = jnp.zeros((batch, sources, depth), jnp.float32)
    return AcceptanceRecord(zeros, zeros)


def weights(record: AcceptanceRecord):
    """[B, J, A]: the factor each source's proposals at each depth are scored by."""
    return (record.accepted + PRIOR_TOKENS) / (record.expected + PRIOR_TOKENS)


def update(record: AcceptanceRecord, tree: DraftTree, acc: Acceptance, active_b):
    """Decay the record and add one step: the tree that was verified (its nodes' sources,
    depths and prior scores) and which of its nodes' paths were right (`acc.right`:
    the accepted path, or a node holding the same path as a verified window path, which
    verification may have preferred). Rows not active keep theirs."""
    J, A = record.expected.shape[1:]
    source_bzj = jax.nn.one_hot(tree.source, J, dtype=jnp.float32)  # source -1: all zero
    depth_bza = jax.nn.one_hot(tree.depth - 1, A, dtype=jnp.float32)
    score_bz = jnp.where(tree.valid, tree.score, 0.0)
    right_bz = (tree.valid & acc.right).astype(jnp.float32)
    offered = jnp.einsum("bz,bzj,bza->bja", score_bz, source_bzj, depth_bza)
    got = jnp.einsum("bz,bzj,bza->bja", right_bz, source_bzj, depth_bza)
    keep = active_b[:, None, None]
    return AcceptanceRecord(
        expected=jnp.where(keep, DECAY * record.expected + offered, record.expected),
        accepted=jnp.where(keep, DECAY * record.accepted + got, record.accepted),
    )
