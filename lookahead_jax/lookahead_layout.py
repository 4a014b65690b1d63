"""Where each token of a lookahead step sits: its index, position and what it may see.

All of it is derived from (N, W, G) alone, in numpy, at trace time. One step's
T = 1 + (N-1)*W + G*(N-1) tokens are laid out as

    index 0                      the input token (newest accepted), position p
    1 + l*W + j                  window level l (0 = oldest), column j,
                                 position p + 1 + l + j
    1 + (N-1)*W + c*(N-1) + i    verification candidate c, token i,
                                 position p + 1 + i

Every token also sees the row's whole cache (positions < p). Among the new
tokens, a window token (l, j) sees the input, level 0 up to column j and its own
column on levels 1..l: exactly the tokens at positions p .. p+1+l+j, one each,
so column j of the window is a Jacobi trajectory whose levels are consecutive
positions. A candidate token (c, i) sees the input and tokens 0..i of candidate
c. Branches never see each other.

Example, N=4, W=5, G=2 (T = 22). Rows are queries, columns keys; `in` is the
input, aLj window level L column j, vCi candidate C token i; [+k] is the
position offset from p; x = may attend.

               in 00 01 02 03 04 10 11 12 13 14 20 21 22 23 24 00 01 02 10 11 12
                  |<-------------- window aLj -------------->| |<-- cand vCi ->|
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

(tests/test_lookahead_layout.py holds this matrix verbatim.)
"""

from __future__ import annotations

import dataclasses
import functools

import numpy as np


@dataclasses.dataclass(frozen=True)
class StepLayout:
    n: int
    w: int
    g: int
    verify_window: bool = False  # logits for every window token (see window_paths)

    @property
    def m(self) -> int:
        """Follower tokens of an n-gram, tokens per candidate."""
        return self.n - 1

    @property
    def num_tokens(self) -> int:
        return 1 + self.m * self.w + self.g * self.m

    @property
    def verify_start(self) -> int:
        return 1 + self.m * self.w

    def window_index(self, level: int, col: int) -> int:
        return 1 + level * self.w + col

    def verify_index(self, cand: int, i: int) -> int:
        return self.verify_start + cand * self.m + i

    @functools.cached_property
    def offsets(self) -> np.ndarray:
        """Position of each token minus the input's position [T]."""
        off = np.zeros(self.num_tokens, np.int32)
        for lvl in range(self.m):
            for j in range(self.w):
                off[self.window_index(lvl, j)] = 1 + lvl + j
        for c in range(self.g):
            for i in range(self.m):
                off[self.verify_index(c, i)] = 1 + i
        return off

    @functools.cached_property
    def mask(self) -> np.ndarray:
        """[T, T] bool: query token t may attend to new token u."""
        t = self.num_tokens
        mask = np.zeros((t, t), bool)
        mask[:, 0] = True  # everything sees the input token
        for lvl in range(self.m):
            for j in range(self.w):
                q = self.window_index(lvl, j)
                mask[q, [self.window_index(0, jj) for jj in range(j + 1)]] = True
                mask[q, [self.window_index(ll, j) for ll in range(1, lvl + 1)]] = True
        for c in range(self.g):
            for i in range(self.m):
                q = self.verify_index(c, i)
                mask[q, [self.verify_index(c, ii) for ii in range(i + 1)]] = True
        return mask

    @functools.cached_property
    def logits_rows(self) -> np.ndarray:
        """The tokens whose predictions are used: input, window, candidates.

        Index 0 is the input, then the window tokens that need logits — the newest
        level's W (or, with verify_window, all (N-1)*W in window order) — then the
        G*M candidate tokens.
        """
        if self.verify_window:
            window = list(range(1, self.verify_start))
        else:
            window = [self.window_index(self.m - 1, j) for j in range(self.w)]
        verify = list(range(self.verify_start, self.num_tokens))
        return np.asarray([0, *window, *verify], np.int32)

    @property
    def window_rows(self) -> int:
        """How many window tokens have logits rows (they follow the input's row)."""
        return self.m * self.w if self.verify_window else self.w

    # ------------------------------------------------------------ window paths
    # The window's attention makes it a tree rooted at the input: level 0 is a chain
    # (column j's parent is column j-1, column 0's the input) and level l of column j
    # hangs below level l-1 of column j. Every root-to-node path is a causal chain of
    # consecutive positions, so each one is a guess of the next tokens that this very
    # pass verifies, exactly like a candidate (verify_window).

    def window_parent(self, level: int, col: int) -> int:
        """Window node index (level*W + col) of the parent, or -1 for the input."""
        if level > 0:
            return (level - 1) * self.w + col
        return col - 1 if col > 0 else -1

    @functools.cached_property
    def window_depths(self) -> np.ndarray:
        """[(N-1)*W]: tokens on the path from the input to each window node (itself
        included): level + col + 1."""
        return np.asarray([lvl + j + 1 for lvl in range(self.m) for j in range(self.w)], np.int32)

    @functools.cached_property
    def window_paths(self) -> np.ndarray:
        """[(N-1)*W, max depth]: window node indices along each node's path, root first,
        padded by repeating the node itself."""
        nodes = self.m * self.w
        paths = np.zeros((nodes, max(self.window_depths)), np.int32)
        for k in range(nodes):
            path, node = [], k
            while node >= 0:
                path.append(node)
                node = self.window_parent(*divmod(node, self.w))
            path = path[::-1]
            paths[k] = path + [k] * (paths.shape[1] - len(path))
        return paths

    @property
    def max_emit(self) -> int:
        """Most tokens one step emits: N (a full candidate and the bonus), or with
        verify_window W+N-1 (the longest window path and the bonus)."""
        return self.n + self.w - 1 if self.verify_window else self.n
