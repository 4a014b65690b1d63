"""Which shape a prefill runs at: its own, or a larger one already compiled, padded —
whichever has cost less so far (ski rental).

A prefill is one program per shape: (rows n, prompt bucket P) from scratch, (rows n,
suffix bucket T) after cached blocks (device_slots.py; its prompt side is the state's).
Traffic meets many such pairs (how many requests an admission brings, how long each
prompt is, how much of it was cached), and each pair's first prefill compiles, seconds
on a CPU, inside some request's time to first token. A pair of the same kind already
compiled, n' >= n and side' >= side, runs the same rows padded (padding rows are done at
once; prompts and suffixes padded past their ends are not read) at the price of its
extra positions, n' side' - n side, at this run's prefill rate. The rule: pad while the
padding spent on a pair stays within what compiling it costs (the mean of this
engine's prefill compiles), then compile it — at most twice the better of the two in
hindsight.

Worked example: compiles take 3 s, prefills run 1,000 positions/s, (8, 64) is compiled.
A prefill at (2, 32) pads to (8, 64): 512 - 64 = 448 extra positions, 0.45 s, spent on
(2, 32) so far 0.45 s. The seventh would bring it to 3.1 s > 3 s: that one compiles
(2, 32), and the later ones run at it.
"""

from __future__ import annotations


class PaddedShapes:
    """The prefill shapes compiled at the current prompt side, by kind ("prompt":
    (n, P), "suffix": (n, T)), and the padding spent on each pair run at a larger one."""

    def __init__(self):
        self.compiled: set[tuple[str, int, int]] = set()
        self.compile_s: list[float] = []  # each pair's compile, seconds (kept across sides)
        self.spent_s: dict[tuple[str, int, int], float] = {}  # padding seconds so far

    def reset(self) -> None:
        """A new prompt side: the programs compiled so far are for other shapes."""
        self.compiled.clear()
        self.spent_s.clear()

    def choose(self, kind: str, n: int, side: int, positions_per_s: float) -> tuple[int, int]:
        """The (rows, side) to run a prefill of shape (n, side) at; positions_per_s: this
        run's prefill rate (0: none measured yet, so no padding)."""
        key = (kind, n, side)
        if key in self.compiled or not self.compile_s or positions_per_s <= 0:
            return n, side
        larger = [
            (n2 * s2, n2, s2) for k, n2, s2 in self.compiled if k == kind and n2 >= n and s2 >= side
        ]
        if not larger:
            return n, side
        size, n2, s2 = min(larger)
        spent = self.spent_s.get(key, 0.0) + (size - n * side) / positions_per_s
        if spent > sum(self.compile_s) / len(self.compile_s):
            return n, side  # compile it: the padding has cost as much
        self.spent_s[key] = spent
        return n2, s2

    def ran(self, kind: str, n: int, side: int, compile_s: float) -> None:
        """A prefill ran at (n, side), after compile_s seconds compiling it (0: it was;
        > 0 for a pair known here too where programs.py had dropped it, MAX_KEPT)."""
        self.compiled.add((kind, n, side))
        if compile_s > 0:
            self.compile_s.append(compile_s)
