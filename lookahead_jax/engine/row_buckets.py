"""How many rows a decode round runs: the engine's B slots live in a state of R rows, R a
row bucket (1, 2, 4, ... below B, then B), so that a round costs what its live rows cost
— a lone request on a 16-slot server steps one row, not sixteen, and 3 live rows pay
for 4.

The live rows sit in the state's first rows (the scheduler gathers them there when the
state shrinks: slot_state.take_rows, one copy of the rows kept); an admission that needs
more rows than R pads the state to a larger bucket first. Each R is one loop program
(and a compile, seconds on a CPU), so which buckets a run uses is a choice:

    False    always B rows (as before row buckets)
    True     always the smallest bucket that holds the live rows (compiling as needed;
             what a server does after warming every bucket)
    "auto"   the smallest bucket holding them whose loop is compiled already; a smaller
             one once the padding rows run beside them have cost as much as a loop's
             compile (ski rental, as prefill_shapes.py does for prefills): at most twice
             the better choice in hindsight

Worked example ("auto", B = 16; loops compile in 4 s; 16 is compiled): 3 rows are left
after the queue emptied, rounds take 0.8 s. Bucket 4 would hold them: each round at 16
wastes 12/16 of its time, 0.6 s, spent on 4. After the seventh round (4.2 s > 4 s) the
next round compiles 4 and runs there; a round of 1 live row later runs at 4 (compiled)
until its own waste passes 4 s.
"""

from __future__ import annotations

from collections.abc import Callable

# a compile's cost before one was measured in this run: a loop's here, a prefill's in
# prefill_shapes.py (CPU, SmolLM2: loops 4-6 s, prefills 3-5 s)
DEFAULT_COMPILE_S = 5.0


def buckets(batch: int) -> list[int]:
    """The row counts a state of `batch` slots may have: powers of two below it, then it."""
    out = [1]
    while out[-1] * 2 < batch:
        out.append(out[-1] * 2)
    return out if out[-1] == batch else [*out, batch]


def smallest(batch: int, n: int) -> int:
    """The smallest row bucket that holds n rows (n <= batch)."""
    return next(r for r in buckets(batch) if r >= n)


class RowBuckets:
    """The rule above, for one run's B slots, with what it has spent."""

    def __init__(self, batch: int, mode: bool | str = "auto"):
        self.batch, self.mode = batch, mode  # (mode checked by the Engine)
        self.spent_s: dict[int, float] = {}  # bucket -> padding seconds run for it elsewhere

    def choose(self, n: int, compiled: Callable[[int], bool], compile_s: list[float]) -> int:
        """The rows to hold n live rows at; compiled(R): whether R's loop is ready;
        compile_s: the loop compiles this run waited for, seconds."""
        best = smallest(self.batch, max(n, 1))
        if self.mode is False:
            return self.batch
        if self.mode is True or compiled(best):
            return best
        ready = [r for r in buckets(self.batch) if r >= best and compiled(r)]
        if not ready:
            return best  # something compiles anyway: the smallest
        cost = sum(compile_s) / len(compile_s) if compile_s else DEFAULT_COMPILE_S
        return best if self.spent_s.get(best, 0.0) > cost else ready[0]

    def ran(self, n: int, rows: int, seconds: float) -> None:
        """A round of n live rows ran at `rows` rows for `seconds`: its padding rows'
        share is spent on the bucket that would have held them."""
        best = smallest(self.batch, max(n, 1))
        if rows > best:
            self.spent_s[best] = self.spent_s.get(best, 0.0) + seconds * (rows - best) / rows
