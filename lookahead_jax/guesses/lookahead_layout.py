"""Where each token of a lookahead step sits: its index, position and what it may see.

One step feeds T = 1 + M*W + Z tokens (M = N-1 window levels, Z tree nodes):

    index 0                 the input token (newest accepted), position p
    1 + l*W + j             Jacobi window level l (0 = oldest), column j,
                            position p + 1 + l + j
    1 + M*W + q             draft-tree node q (draft_tree.py), position p + depth[q]

Every token also sees the row's whole cache (positions < p). Among the new tokens:

* a window token (l, j) sees the input, level 0 up to column j and its own column on
  levels 1..l: exactly the tokens at positions p .. p+1+l+j, one each, so column j of
  the window is a Jacobi trajectory whose levels are consecutive positions;
* a tree node sees the input, its ancestors and itself (the tree's `ancestors`);
* the window and the tree never see each other.

The input and window part is static, derived from (N, W) alone in numpy at trace time;
the tree part is data (each row's tree differs from step to step).

Example, N=4, W=5 and a 6-node tree holding two chains of 3 tokens, v0 and v1 (T = 22).
Rows are queries, columns keys; `in` is the input, alj window level l column j, vci
chain c token i (tree nodes 0..5); [+k] is the position offset from p; x = may attend.

               in 00 01 02 03 04 10 11 12 13 14 20 21 22 23 24 00 01 02 10 11 12
                  |<-------------- window alj -------------->| |<-- tree vci ->|
    in  [+0]    x  .  .  .  .  .  .  .  .  .  .  .  .  .  .  .  .  .  .  .  .  .
    a00 [+1]    x  x  .  .  .  .  .  .  .  .  .  .  .  .  .  .  .  .  .  .  .  .
    a01 [+2]    x  x  x  .  .  .  .  .  .  .  .  .  .  .  .  .  .  .  .  .  .  .
    a02 [+3]    x  x  x  x  .  .  .  .  .  .  .  .  .  .  .  .  .  .  .  .  .  .
    a03 [+4]    x  x  x  x  x  .  .  .  .  .  .  .  .  .  .  .  .  .  .  .  .  .
    a04 [+5]    x  x  x  x  x  x  .  .  .  .  .  .  .  .  .  .  .  .  .  .  .  .
    a10 [+2]    x  x  .  .  .  .  x  .  .  .  .  .  .  .  .  .  .  .  .  .  .  .
    a11 [+3]    x  x  x  .  .  .  .  x  .  .  .  .  .  .  .  .  .  .  .  .  .  .
    a12 [+4]    x  x  x  x  .  .  .  .  x  .  .  .  .  .  .  .  .  .  .  .  .  .
    a13 [+5]    x  x  x  x  x  .  .  .  .  x  .  .  .  .  .  .  .  .  .  .  .  .
    a14 [+6]    x  x  x  x  x  x  .  .  .  .  x  .  .  .  .  .  .  .  .  .  .  .
    a20 [+3]    x  x  .  .  .  .  x  .  .  .  .  x  .  .  .  .  .  .  .  .  .  .
    a21 [+4]    x  x  x  .  .  .  .  x  .  .  .  .  x  .  .  .  .  .  .  .  .  .
    a22 [+5]    x  x  x  x  .  .  .  .  x  .  .  .  .  x  .  .  .  .  .  .  .  .
    a23 [+6]    x  x  x  x  x  .  .  .  .  x  .  .  .  .  x  .  .  .  .  .  .  .
    a24 [+7]    x  x  x  x  x  x  .  .  .  .  x  .  .  .  .  x  .  .  .  .  .  .
    v00 [+1]    x  .  .  .  .  .  .  .  .  .  .  .  .  .  .  .  x  .  .  .  .  .
    v01 [+2]    x  .  .  .  .  .  .  .  .  .  .  .  .  .  .  .  x  x  .  .  .  .
    v02 [+3]    x  .  .  .  .  .  .  .  .  .  .  .  .  .  .  .  x  x  x  .  .  .
    v10 [+1]    x  .  .  .  .  .  .  .  .  .  .  .  .  .  .  .  .  .  .  x  .  .
    v11 [+2]    x  .  .  .  .  .  .  .  .  .  .  .  .  .  .  .  .  .  .  x  x  .
    v12 [+3]    x  .  .  .  .  .  .  .  .  .  .  .  .  .  .  .  .  .  .  x  x  x

Had v1 started with v0's first token, the tree would have merged them: v1's first token
would share node 0 and its later tokens would hang below it (see draft_tree.py).

(tests/test_lookahead_layout.py holds this matrix verbatim.)
"""

from __future__ import annotations

import dataclasses
import functools

import jax.numpy as jnp
import numpy as np


@dataclasses.dataclass(frozen=True)
class StepLayout:
    n: int  # window levels + 1 (the pool's n-gram size)
    w: int  # window columns (0: no window)
    nodes: int  # draft-tree nodes Z
    verify_window: bool = False  # logits for every window token (see window_parents)

    @property
    def m(self) -> int:
        """Window levels; follower tokens of a pool n-gram."""
        return self.n - 1

    @property
    def window_tokens(self) -> int:
        return self.m * self.w

    @property
    def num_tokens(self) -> int:
        return 1 + self.window_tokens + self.nodes

    @property
    def tree_start(self) -> int:
        return 1 + self.window_tokens

    def window_index(self, level: int, col: int) -> int:
        return 1 + level * self.w + col

    @functools.cached_property
    def static_offsets(self) -> np.ndarray:
        """Position minus the input's position of the input and window tokens [1 + M*W]."""
        off = np.zeros(self.tree_start, np.int32)
        for lvl in range(self.m):
            for j in range(self.w):
                off[self.window_index(lvl, j)] = 1 + lvl + j
        return off

    @functools.cached_property
    def static_mask(self) -> np.ndarray:
        """[T, T] bool: the input and window rows in full; tree rows see only the input."""
        t = self.num_tokens
        mask = np.zeros((t, t), bool)
        mask[:, 0] = True  # everything sees the input token
        for lvl in range(self.m):
            for j in range(self.w):
                q = self.window_index(lvl, j)
                mask[q, [self.window_index(0, jj) for jj in range(j + 1)]] = True
                mask[q, [self.window_index(ll, j) for ll in range(1, lvl + 1)]] = True
        return mask

    def offsets(self, tree_depth_bz):
        """[B, T]: each token's position minus the input's (a tree node's is its depth)."""
        B = tree_depth_bz.shape[0]
        static = jnp.broadcast_to(jnp.asarray(self.static_offsets), (B, self.tree_start))
        return jnp.concatenate([static, tree_depth_bz.astype(jnp.int32)], axis=1)

    def mask(self, tree_ancestors_bzz):
        """[B, T, T] bool: the static part plus each row's tree (ancestors and self)."""
        B = tree_ancestors_bzz.shape[0]
        s = self.tree_start
        mask = jnp.broadcast_to(jnp.asarray(self.static_mask), (B, *self.static_mask.shape))
        return mask.at[:, s:, s:].set(tree_ancestors_bzz)

    @functools.cached_property
    def logits_rows(self) -> np.ndarray:
        """The tokens whose predictions are used: input, window, tree.

        Index 0 is the input, then the window tokens that need logits — the newest
        level's W (or, with verify_window, all (N-1)*W in window order) — then the Z
        tree nodes.
        """
        if self.verify_window:
            window = list(range(1, self.tree_start))
        else:
            window = [self.window_index(self.m - 1, j) for j in range(self.w)]
        tree = list(range(self.tree_start, self.num_tokens))
        return np.asarray([0, *window, *tree], np.int32)

    @functools.cached_property
    def parent_of_rows(self) -> np.ndarray:
        """For each logits row of the input and window: the step index of the token it
        follows (its window parent; the input for level 0, column 0 and for the input)."""
        out = []
        for t in self.logits_rows[: 1 + self.window_rows]:
            if t == 0:
                out.append(0)
                continue
            parent = self.window_parents[t - 1]
            out.append(0 if parent < 0 else 1 + parent)
        return np.asarray(out, np.int32)

    @property
    def window_rows(self) -> int:
        """How many window tokens have logits rows (they follow the input's row)."""
        return self.window_tokens if self.verify_window else self.w

    # ------------------------------------------------------------ window paths
    # The window's attention makes it a tree rooted at the input: level 0 is a chain
    # (column j's parent is column j-1, column 0's the input) and level l of column j
    # hangs below level l-1 of column j. Every root-to-node path is a causal chain of
    # consecutive positions, so each one is a guess of the next tokens that this very
    # pass verifies, like a tree node (verify_window).

    def window_parent(self, level: int, col: int) -> int:
        """Window node index (level*W + col) of the parent, or -1 for the input."""
        if level > 0:
            return (level - 1) * self.w + col
        return col - 1 if col > 0 else -1

    @functools.cached_property
    def window_parents(self) -> np.ndarray:
        """[(N-1)*W]: window_parent of every window node, in window order."""
        return np.asarray(
            [self.window_parent(*divmod(k, self.w)) for k in range(self.window_tokens)], np.int32
        )

    @functools.cached_property
    def window_depths(self) -> np.ndarray:
        """[(N-1)*W]: tokens on the path from the input to each window node (itself
        included): level + col + 1."""
        return np.asarray([lvl + j + 1 for lvl in range(self.m) for j in range(self.w)], np.int32)

    @functools.cached_property
    def window_ancestors(self) -> np.ndarray:
        """[(N-1)*W, (N-1)*W] bool: window node u is on the path to node k (k included)."""
        k_nodes = self.window_tokens
        anc = np.zeros((k_nodes, k_nodes), bool)
        for k in range(k_nodes):
            node = k
            while node >= 0:
                anc[k, node] = True
                node = self.window_parents[node]
        return anc
