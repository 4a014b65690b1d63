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

Which requests of an admission share a prefill (`groups`): a prefill of n prompts runs
prefill_rows(n) rows (a power of two) at its longest prompt's side, so grouping by side
alone pads rows: 10 prompts of side 128 and 6 of side 64 ran [16, 128] and [8, 64], 2,560
positions for 16 prompts, where one [16, 128] runs all of them in 2,048. The requests,
longest first, are cut into runs that minimize the positions run, a call's fixed cost
and each shape's compile (in positions, at this run's rate: a shape not compiled yet is
worth compiling only where it saves more padding than its compile costs; with nothing
measured yet, as few new shapes as can be).
"""

from __future__ import annotations

from collections.abc import Callable

from lookahead_jax.engine import inputs
from lookahead_jax.engine.slot_state import prefill_rows

CALL_POSITIONS = 16  # a prefill call's own cost beside its positions (the insert, a dispatch)
UNMEASURED = 1e9  # a compile's cost in positions before one was measured: above any padding


class PaddedShapes:
    """The prefill shapes compiled for the state's current programs (`at`), by kind
    ("prompt": (n, P), "suffix": (n, T)), and the padding spent on each pair for want of
    it. An engine keeps one across its runs (and a server for its life), so that the
    padding a traffic pattern keeps spending adds up to a compile."""

    def __init__(self):
        self._at: dict = {}  # program key -> (compiled, spent_s)
        self.compiled: set[tuple[str, int, int]]  # (kind, rows, side) at the current key
        self.spent_s: dict[tuple[str, int, int], float]  # padding seconds so far, there
        self.compile_s: list[float] = []  # each pair's compile, seconds (kept across keys)
        self.at(None)

    def at(self, key) -> None:
        """The state's programs are those of `key` now (a prompt side, room for new
        tokens, a decode spec): the shapes compiled and the padding spent there (kept
        for when it comes back)."""
        self.compiled, self.spent_s = self._at.setdefault(key, (set(), {}))

    def choose(
        self,
        kind: str,
        n: int,
        side: int,
        positions_per_s: float,
        ready: Callable[[int, int], bool] = lambda rows, side: False,
    ) -> tuple[int, int]:
        """The (rows, side) to run a prefill of shape (n, side) at: its own when compiled
        (or `ready`: programs.py has it); else a larger one compiled, padded, while the
        padding spent for want of its own stays within a compile (then its own); with
        none larger, or nothing measured yet (positions_per_s 0), its side's power of two
        (inputs.bucket) is compiled: one program for the octave, which later prefills of
        sides below it run at until theirs have paid for their own."""
        key = (kind, n, side)
        if key in self.compiled or ready(n, side):
            return n, side
        larger = [
            (n2 * s2, n2, s2) for k, n2, s2 in self.compiled if k == kind and n2 >= n and s2 >= side
        ]
        if not larger or not self.compile_s or positions_per_s <= 0:
            return n, inputs.bucket(side)
        size, n2, s2 = min(larger)
        spent = self.spent_s.get(key, 0.0) + (size - n * side) / positions_per_s
        if spent > sum(self.compile_s) / len(self.compile_s):
            return n, side  # compile it: the padding has cost as much
        self.spent_s[key] = spent
        return n2, s2

    def groups(
        self,
        kind: str,
        sides: list[int],
        batch: int,
        positions_per_s: float,
        ready: Callable[[int, int], bool] = lambda rows, side: False,
    ) -> list[list[int]]:
        """The requests of one admission cut into prefills: lists of indices into `sides`
        (each request's side: inputs.prefill_side; each list ascending), each list to run
        as one prefill at its longest side. ready(rows, side): whether a shape's program
        is compiled already (programs.py keeps them across runs; this object knows those
        it ran). A run is costed as `choose` will run it: at its own shape when compiled,
        else at a larger one compiled, padded, or at its side's power of two, compiled (its
        cost: what is left of a compile after the padding spent for want of it); the
        padding this cut spends, beside the cut that would compile every shape it wants,
        is spent on those shapes, which are compiled once it has paid for them."""
        order = sorted(range(len(sides)), key=lambda i: -sides[i])
        rate = positions_per_s
        compile_s = sum(self.compile_s) / len(self.compile_s) if self.compile_s else 0.0
        measured = compile_s > 0 and rate > 0

        known: dict[tuple[int, int], bool] = {}  # (rows, side) -> compiled (ready is slow)

        def compiled(rows: int, side: int) -> bool:
            if (rows, side) not in known:
                known[(rows, side)] = (kind, rows, side) in self.compiled or ready(rows, side)
            return known[(rows, side)]

        def cost(n: int, side: int, buy: bool) -> tuple[float, int, tuple | None]:
            """(cost in positions, positions run, the shape compiled for it or None), as
            `choose` would run it (buy) or with every compile free (not buy)."""
            rows = prefill_rows(n, batch)
            key, own = (kind, rows, side), rows * side + CALL_POSITIONS
            if compiled(rows, side):
                return own, own, None
            padded = min(
                (
                    n2 * s2 + CALL_POSITIONS
                    for k, n2, s2 in self.compiled
                    if k == kind and n2 >= rows and s2 >= side
                ),
                default=float("inf"),
            )
            if not buy:
                return (own, own, key) if own < padded else (padded, padded, None)
            if measured and padded < float("inf") and self.spent_s.get(key, 0.0) >= compile_s:
                return own, own, key  # (choose compiles it: its padding has paid)
            coarse = inputs.bucket(side)  # what choose compiles with nothing larger
            rest = UNMEASURED
            if compiled(rows, coarse):
                rest = 0.0
            elif measured:
                rest = max(compile_s - self.spent_s.get((kind, rows, coarse), 0.0), 0.0) * rate
            fresh = rows * coarse + CALL_POSITIONS
            if padded <= fresh + rest:
                return padded, padded, None
            return fresh + rest, fresh, (kind, rows, coarse)

        # Runs of a power of two requests (or of the batch), but the last: a run padded
        # with rows could take the next (shorter) requests at no cost, leaving the runs
        # after it no larger (what they ran at still holds them). So the cut looks at
        # O(N log N) runs, not all O(N^2) (an lj.generate of thousands of rows).
        N = len(order)
        lengths = sorted({1 << k for k in range(N.bit_length())} | {min(batch, N)})

        def cut(buy: bool) -> tuple[list[list[int]], int, list]:
            """(runs, positions they run, shapes they compile): the least cost."""
            best: list[tuple[float, int, list]] = [(0.0, 0, [])]
            starts = [0]
            for i in range(1, N + 1):
                options = []
                for j in {i - n for n in lengths if n <= i} | (set(range(i)) if i == N else set()):
                    c, ran, want = cost(i - j, sides[order[j]], buy)
                    b = best[j]
                    options.append((b[0] + c, b[1] + ran, b[2] + [want] * (want is not None), j))
                c, ran, wanted, j = min(options, key=lambda o: (o[0], o[3]))
                best.append((c, ran, wanted))
                starts.append(j)
            runs, i = [], N
            while i > 0:
                runs.append(sorted(order[starts[i] : i]))  # in slot order
                i = starts[i]
            return runs[::-1], best[-1][1], best[-1][2]

        runs, ran, _ = cut(buy=True)
        if measured:  # the padding spent for want of the shapes the free cut compiles
            _, ran_free, wanted = cut(buy=False)
            for key in wanted if ran > ran_free else []:
                share = (ran - ran_free) / rate / len(wanted)
                self.spent_s[key] = self.spent_s.get(key, 0.0) + share
        return runs

    def ran(self, kind: str, n: int, side: int, compile_s: float) -> None:
        """A prefill ran at (n, side), after compile_s seconds compiling it (0: it was;
        > 0 for a pair known here too where programs.py had dropped it, MAX_KEPT)."""
        self.compiled.add((kind, n, side))
        if compile_s > 0:
            self.compile_s.append(compile_s)
