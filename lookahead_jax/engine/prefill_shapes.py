"""Which shape a prefill runs at, and which requests of an admission share one: runs
cut to pad least, each at its own shape, or a larger one already compiled, padded, until
the padding spent for want of its own has cost a compile (ski rental).

A prefill is one program per shape: (rows n, prompt side P) from scratch, (rows n,
suffix side T) after cached blocks (device_slots.py; its prompt side is the state's),
or (rows n, the pass's tokens Tr) of several prompts packed (a "ragged" prefill, whose
rows cost nothing: it runs Tr positions, `positions`; or a "shared" one, packed after
cached blocks its rows share, priced alike); sides are inputs.prefill_side's
(quarter octaves above 64). Traffic meets many such
pairs (how many requests an admission brings, how long each prompt is, how much of it
was cached), and each pair's first prefill compiles, seconds on a CPU, inside some
request's time to first token. A pair of the same kind already compiled, n' >= n and
side' >= side, runs the same rows padded (padding rows are done at once; prompts and
suffixes padded past their ends are not read) at the price of its extra positions,
n' side' - n side, at this run's prefill rate. The rule (`choose`): a compiled pair runs
as it is; else it pads to the smallest larger one compiled while the padding spent for
want of it stays below what compiling it costs (the mean of this engine's prefill
compiles; 5 s before one was measured), then compiles — at most twice the better of the
two in hindsight; the engine's prefills compile it in the background (`compile_soon`),
padded to the larger one until it is ready, so that no request's time to first token
holds a compile it did not need; with no larger one compiled it compiles its side's
power of two (one program for the octave, which the octave's other sides then pad to;
a ragged pass its own side: padding a pass of packed prompts to its power of two ran 2,048
positions for 1,323 tokens, and its sides vary with every admission anyway).
Where one run's padding alone would cost more than a compile ("dear": sixteen prompts
of ~600 tokens in [16, 1024]), its own shape compiles now instead of either (not a
ragged pass's: its side is met once, and its compile costs more than the mean).

Worked example: compiles take 3 s, prefills run 1,000 positions/s, (8, 64) is compiled.
Admissions of 2 prompts of side 32 run at (8, 64): 512 - 64 = 448 extra positions,
0.45 s spent for want of (2, 32) each time. The seventh brings it to 3.1 s >= 3 s: it
compiles (2, 32) instead, and the later ones run at it.

A suffix whose shape would compile now (no larger suffix shape compiled, or its padding
paid) may run instead as a prompt prefill of its rows from scratch, at a prompt shape
compiled (`instead`), while its own compiles in the background: when that costs fewer
extra positions (the cached blocks computed again, the prompt shape's padding) than the
compile. A server's chat prompts share the template's system prompt, so after the first
request every prompt is a suffix, of any length: each new suffix octave compiled in the
foreground held 4-6 s of some request's time to first token (a 2-core Intel Xeon).

Which requests of an admission share a prefill (`groups`): a prefill of n prompts runs
prefill_rows(n) rows (a power of two) at its longest prompt's side, so grouping by side
alone pads rows: 10 prompts of side 128 and 6 of side 64 ran [16, 128] and [8, 64], 2,560
positions for 16 prompts, where one [16, 128] runs all of them in 2,048. The requests,
longest first, are cut into runs that cost least as `choose` will run them (positions,
a call's fixed cost, a compile where one is due), and the padding that cut spends beside
the cut that would run every run at its own shape is what is spent for want of those
shapes (the only place a prompt's or suffix's padding is counted; a ragged pass's is
counted where it runs padded, `choose`: its admission is not cut, and where it would
have run fewer positions than the cut, or the passes, that ran instead, `ragged_pays`).

Whether an admission runs as one ragged pass or cut (`ragged_pays`): where the pass
costs less, priced as the cut is (positions, a call's cost, a compile in the
foreground). Several prompts from scratch; or rows with cached blocks, from scratch, their
blocks computed again, against their suffixes' prefills: a chat template's system prompt
is one cached block, so every chat after a server's first is a suffix, and sixteen
MT-bench chats ran as [16, 128], 2,048 positions for 1,202 prompt tokens (a 2-core Intel
Xeon). A pass costs only its tokens, so a server's warm-up compiles one of every row's
chat-sized prompt (continuous.py), which a burst of up to that many tokens may pad to
rather than compile (where that costs no more than its cut); a burst of more may run in
several passes packed to fit a compiled one, where their padding costs less than
compiling its own (the planner's `_passes`, priced here as `passes`).
"""

from __future__ import annotations

from collections.abc import Callable

from lookahead_jax.engine import inputs
from lookahead_jax.engine.row_buckets import DEFAULT_COMPILE_S
from lookahead_jax.engine.slot_state import prefill_rows

CALL_POSITIONS = 16  # a prefill call's own cost beside its positions (the insert, a dispatch)
# the free cut's tie-breaker: a shape not compiled costs this many positions more there,
# so that of two cuts of about the same positions the one wanting fewer new shapes is
# the reference (fifteen rows as [8]+[4]+[2]+[1], 1,024 positions, wanted four shapes
# where [16] runs 1,040: four compiles, each paid by a quarter of the padding)
NEW_SHAPE_POSITIONS = 64
UNMEASURED = 1e9  # a compile's cost in positions before a rate was measured: above any padding
# `plan`'s outcomes that run at a shape compiled (its own, or a larger one), and those that
# compile the prefill's shape in the foreground, inside its admission
RUNS_COMPILED = ("compiled", "padded", "soon")
COMPILES_NOW = ("paid", "dear", "octave")
RAGGED = "ragged"  # the kind of a ragged pass (prefill_args.RAGGED)
SHARED = "shared"  # a ragged pass after cached blocks its rows share (prefill_args.shared)
# the kinds whose rows are packed in one pass: it runs its tokens, whatever its rows
PACKED = (RAGGED, SHARED)


class PaddedShapes:
    """The prefill shapes compiled for the state's current programs (`at`), by kind
    ("prompt": (n, P), "suffix": (n, T), "ragged" and "shared": (n, Tr)), and the padding
    spent on each pair for want of it. An engine keeps one across its runs (and a server
    for its life), so that the padding a traffic pattern keeps spending adds up to a
    compile."""

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
        compile_soon: Callable[[int, int], None] | None = None,
    ) -> tuple[int, int]:
        """The (rows, side) to run a prefill of shape (n, side) at (the rule above): its own
        when compiled (or `ready`: programs.py has it) or once the padding spent for want
        of it (`groups`) has cost a compile; else the smallest larger one compiled; else
        its side's power of two. positions_per_s: this run's prefill rate (0: none yet).
        compile_soon(rows, side): where given, a shape paid for while a larger one is
        compiled is compiled in the background (the larger one runs until it is ready),
        not inside some request's time to first token."""
        shape, how = self.plan(kind, n, side, positions_per_s, ready, compile_soon is not None)
        if how == "soon":  # beside the decode rounds, the prefills padded meanwhile
            compile_soon(n, side)
        if kind in PACKED and how in ("padded", "soon") and positions_per_s > 0:
            # (a prompt's padding is counted where its admission is cut: `groups`)
            extra = self.positions(kind, *shape) - side
            self._spend((kind, n, side), extra / positions_per_s)
        return shape

    def plan(self, kind, n, side, rate, ready, background) -> tuple[tuple[int, int], str]:
        """How `choose` runs a prefill of shape (n, side): the shape, and why —
        "compiled" (its own); "paid" (its own, compiled now: its padding paid for it);
        "soon" (paid, but a larger compiled one runs while its own compiles in the
        background); "dear" (its own, compiled now: this run's padding alone would cost
        more than a compile); "padded" (the smallest larger one compiled); "octave" (its
        side's power of two, compiled now; a ragged pass's own side)."""
        key = (kind, n, side)
        if self._known(key, ready):
            return (n, side), "compiled"
        self._known((kind, n, inputs.bucket(side)), ready)  # (a larger one, if compiled)
        larger = self._larger(kind, n, side)
        paid = self._paid(key, rate)
        if paid and (larger is None or not background):
            return (n, side), "paid"
        octave = side if kind in PACKED else inputs.bucket(side)
        over = larger if larger is not None else (n, octave)
        if self._dear(kind, over, self.positions(kind, n, side), rate):  # (not "soon")
            return (n, side), "dear"
        if paid:
            return larger, "soon"
        if larger is not None:
            return larger, "padded"
        return over, "octave"

    @staticmethod
    def positions(kind: str, rows: int, side: int) -> int:
        """The positions a prefill of (rows, side) runs: rows x side, or a ragged pass's
        side (its rows are packed in it)."""
        return side if kind in PACKED else rows * side

    def _dear(self, kind: str, shape: tuple[int, int], positions: int, rate: float) -> bool:
        """Whether one run at `shape` of a prefill of `positions` would spend more on its
        padding than a compile costs (at a measured rate): then its own shape compiles now,
        whatever padding was spent before. (16 chats of ~600 tokens padded to a compiled
        [16, 1024] ran 48-53 s a burst, where [16, 640] ran 19.4 s; 2-core Intel Xeon.)
        Never a ragged pass: its side is its admission's tokens, met once, and its compile
        costs more than the engine's mean (a 4-row pass of 448 tokens compiled for 8.4 s
        where padding it to the warmed 2,048 was priced 3.2 s against a 2.9 s mean, in a
        server-like run under 4 concurrent chats; 2-core Intel Xeon)."""
        if rate <= 0 or kind in PACKED:
            return False
        return (self.positions(kind, *shape) - positions) / rate >= self._compile_seconds()

    def instead(
        self,
        n: int,
        suffix_side: int,
        scratch: tuple[str, int],
        positions_per_s: float,
        ready_suffix: Callable[[int, int], bool],
        ready_prompt: Callable[[int, int], bool],
    ) -> tuple[int, int] | None:
        """The suffix shape to compile in the background when a suffix prefill of (n,
        suffix_side) would compile now and its rows run instead from scratch (`scratch`:
        the kind, "prompt" or "ragged", and side they would run at) at a shape compiled:
        that costs fewer extra positions than a compile (before one was measured:
        always); None: as `plan` says."""
        shape, how = self.plan("suffix", n, suffix_side, positions_per_s, ready_suffix, True)
        if how not in COMPILES_NOW:
            return None
        kind, side = scratch
        (rows, side), prompt_how = self.plan(kind, n, side, positions_per_s, ready_prompt, True)
        if prompt_how not in RUNS_COMPILED:
            return None
        extra = self.positions(kind, rows, side) - n * suffix_side
        # (a measured compile only: with the default a first burst compiled inside it)
        compile_positions = self._compile_positions(positions_per_s, measured=True)
        if compile_positions is not None and extra >= compile_positions:
            return None
        return shape

    def _compile_seconds(self) -> float:
        """A prefill compile's cost: this engine's mean, or before one was measured
        DEFAULT_COMPILE_S (a server's warm-up compiles are not measured, as they may be
        waits for background compiles; without a default its padding could never pay
        for a shape: sixteen chats behind a cached system prompt ran as fifteen one-row
        suffix prefills, pass after pass, never one sixteen-row one)."""
        return sum(self.compile_s) / len(self.compile_s) if self.compile_s else DEFAULT_COMPILE_S

    def _compile_positions(self, positions_per_s: float, measured: bool = False) -> float | None:
        """A compile's cost in positions at this rate, or None before a rate was measured
        (with `measured`: also before a compile was, rather than DEFAULT_COMPILE_S)."""
        if positions_per_s <= 0 or (measured and not self.compile_s):
            return None
        return self._compile_seconds() * positions_per_s

    def _spend(self, key: tuple[str, int, int], seconds: float) -> None:
        """Add `seconds` to what was spent for want of the shape `key`."""
        self.spent_s[key] = self.spent_s.get(key, 0.0) + seconds

    def _paid(self, key: tuple[str, int, int], positions_per_s: float) -> bool:
        """Whether the padding spent for want of `key` has cost a compile."""
        if positions_per_s <= 0:
            return False
        return self.spent_s.get(key, 0.0) >= self._compile_seconds()

    def shapes(self, kind: str) -> list[tuple[int, int]]:
        """The compiled (rows, side) of this kind, fewest positions first."""
        shapes = [(n, s) for k, n, s in self.compiled if k == kind]
        return sorted(shapes, key=lambda shape: self.positions(kind, *shape))

    def _larger(self, kind: str, n: int, side: int) -> tuple[int, int] | None:
        """The smallest compiled (rows, side) of this kind that holds (n, side), or None."""
        larger = [(self.positions(k, n2, s2), n2, s2) for k, n2, s2 in self.compiled if k == kind]
        larger = [x for x in larger if x[1] >= n and x[2] >= side]
        return min(larger)[1:] if larger else None

    def ragged_pays(
        self,
        n: int,
        side: int,
        cut: tuple[float, int],
        positions_per_s: float,
        ready: Callable[[int, int], bool],
        compile_soon: Callable[[int, int], None] | None,
        charge: bool = False,
        passes: tuple[float, int] | None = None,
        kind: str = RAGGED,
    ) -> bool:
        """Whether prompts run packed in one ragged pass of (n rows, `side` tokens), or in
        `passes`, rather than as they are cut otherwise, `cut` = (what those prefills
        cost, the positions they run: `cost`): where the pass costs no more as `choose`
        would run it (its own
        shape compiled, a larger one padded, a compile priced as `_cost` prices one; a
        tie goes to the pass, whose rows are never padded). `passes`: (cost, positions
        run) of the prompts in several passes of compiled shapes instead, where the
        planner found that cheaper than one (prefill_planning's `_passes`). Where what
        runs (the cut, or those passes) runs more positions than the pass's own shape
        would, those positions are spent for want of it (with `charge`: once an
        admission), and once that has paid a compile it compiles in the background
        (compile_soon; none: only a compiled pass runs). Not the cut's compile prices:
        before a compile was measured those are a placeholder. The cut's own padding is
        spent for want of its shapes too (`groups`): whichever pays first compiles.

        Worked example (100 positions a second, a compile 1 s; the warmed pass (16, 2048)):
        sixteen chats of 1,300 tokens in all, whose cut would compile [16, 128] (2,064
        positions and a compile: 2,164) run in the warmed pass (2,064); two short prompts
        whose compiled [2, 64] runs 144 positions do not, and the 144 - 112 = 32
        positions a pass (2, 96) would have run fewer go towards compiling it; sixteen
        chats of 3,072 tokens, whose own pass would compile, run as two passes of the
        warmed one (`passes` = (4,128, 4,128)) where their cut costs more, and the
        4,128 - 3,088 = 1,040 positions beyond their own pass go towards compiling it.
        `kind`: SHARED for a pass after cached blocks its rows share, priced alike."""
        rate, background = positions_per_s, compile_soon is not None
        if passes is None:
            cost, ran = self.pass_cost(n, side, rate, ready, background, kind)
        else:
            cost, ran = passes
        pays = cost <= cut[0]
        if pays and passes is None:  # (one pass: `choose` spends its padding)
            return True
        own = self.positions(kind, n, side) + CALL_POSITIONS
        extra = (ran if pays else cut[1]) - own
        if charge and background and rate > 0 and extra > 0:
            key = (kind, n, side)
            self._spend(key, extra / rate)
            if self._paid(key, rate):
                compile_soon(n, side)
        return pays

    def pass_cost(
        self, n, side, positions_per_s, ready, background, kind: str = RAGGED
    ) -> tuple[float, int]:
        """What a ragged pass (of `kind`: RAGGED or SHARED) of (n rows, `side` tokens)
        costs in positions as `choose` would run it (`_cost`), and the positions it runs."""
        return self._cost(kind, n, side, False, ready, positions_per_s, background)[:2]

    def cost(
        self,
        kind: str,
        sides: list[int],
        batch: int,
        positions_per_s: float,
        ready: Callable[[int, int], bool],
        background: bool,
    ) -> tuple[float, int]:
        """What prefills of these sides cost in positions (a call's own, a compile due in
        the foreground: `_cost`), and the positions they run (a call's own included), cut
        as `groups` cuts them (charging nothing)."""
        rate = positions_per_s
        runs = self.runs(kind, sides, batch, rate, ready, background)
        costs = [self._cost(kind, n, side, False, ready, rate, background) for n, side in runs]
        return sum(c[0] for c in costs), sum(c[1] for c in costs)

    def runs(self, kind, sides, batch, positions_per_s, ready, background) -> list[tuple]:
        """The (rows, side) of each prefill `groups` cuts these sides into (charging
        nothing), before `choose` says at which shape each runs."""
        cut = self.groups(kind, sides, batch, positions_per_s, ready, background, charge=False)
        return [(prefill_rows(len(run), batch), max(sides[i] for i in run)) for run in cut]

    def groups(
        self,
        kind: str,
        sides: list[int],
        batch: int,
        positions_per_s: float,
        ready: Callable[[int, int], bool] = lambda rows, side: False,
        background: bool = False,
        charge: bool = True,
    ) -> list[list[int]]:
        """The requests of one admission cut into prefills: lists of indices into `sides`
        (one side a request: inputs.prefill_side), each list ascending, each to run as one
        prefill at its longest side (`choose` says at which shape). ready(rows, side):
        whether a shape's program is compiled already (programs.py keeps them across
        runs; this object knows those it ran); background: as `choose`'s compile_soon
        is given. The padding the cut spends beside the cut with every compile free is
        spent for want of that cut's new shapes (with `charge`; without, a plan only)."""
        order = sorted(range(len(sides)), key=lambda i: -sides[i])
        rate = positions_per_s
        # rows, side, whether compiles are free -> (cost, positions run, a shape wanted)
        costs: dict[tuple[int, int, bool], tuple[float, int, tuple | None]] = {}

        def cost(n: int, side: int, free: bool) -> tuple[float, int, tuple | None]:
            rows = prefill_rows(n, batch)
            if (rows, side, free) not in costs:
                costs[(rows, side, free)] = self._cost(
                    kind, rows, side, free, ready, rate, background
                )
            return costs[(rows, side, free)]

        # Runs of a power of two requests (or of the batch), but the last: a run padded
        # with rows could take the next (shorter) requests at no cost, leaving the runs
        # after it no larger (what they ran at still holds them). So the cut looks at
        # O(N log N) runs, not all O(N^2) (an lj.generate of thousands of rows).
        N = len(order)
        lengths = sorted({1 << k for k in range(N.bit_length())} | {min(batch, N)})

        def cut(free: bool) -> tuple[list[list[int]], int, list]:
            """(runs, positions they run, the shapes they want): the least cost."""
            best: list[tuple[float, int, list]] = [(0.0, 0, [])]
            starts = [0]
            for i in range(1, N + 1):
                options = []
                for j in {i - n for n in lengths if n <= i} | (set(range(i)) if i == N else set()):
                    c, ran, want = cost(i - j, sides[order[j]], free)
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

        runs, ran, _ = cut(free=False)
        if charge and self._compile_positions(rate) is not None:  # (a rate) the padding spent
            _, ran_free, wanted = cut(free=True)
            for key in set(wanted) if ran > ran_free else ():  # for want of these
                share = (ran - ran_free) / rate / len(set(wanted))
                self._spend(key, share)
        return runs

    def _cost(
        self, kind, rows, side, free, ready, rate, background
    ) -> tuple[float, int, tuple | None]:
        """A run of `rows` rows at `side` as `choose` will run it (free: with every
        compile free, at its own shape; background: whether choose compiles a paid shape
        in the background): (cost in positions, positions run, the shape it wants
        compiled, or None)."""
        own = self.positions(kind, rows, side) + CALL_POSITIONS
        (n, side_run), how = self.plan(kind, rows, side, rate, ready, background)
        if how == "compiled":
            return own, own, None
        if how == "paid":
            return own, own, (kind, rows, side)  # (compiled at its run)
        if free:  # wanted (a compile, were it free: one more shape is still one more)
            return own + NEW_SHAPE_POSITIONS, own, (kind, rows, side)
        if how == "dear":  # (compiled at its run, in the foreground: not paid for)
            return own + self._compile_seconds() * rate, own, (kind, rows, side)
        ran = self.positions(kind, n, side_run) + CALL_POSITIONS
        if how == "octave":  # a compile too, in the foreground: priced only once measured
            # (before, UNMEASURED: padding to a compiled shape is preferred; the default
            # compile cost only lets padding pay, `_paid`)
            compile_positions = self._compile_positions(rate, measured=True)
            return ran + (UNMEASURED if compile_positions is None else compile_positions), ran, None
        return ran, ran, None  # padded (its own compiling in the background, if "soon")

    def _known(self, key: tuple[str, int, int], ready: Callable[[int, int], bool]) -> bool:
        """Whether the shape `key` is compiled: run here, or `ready` (compiled by another
        engine of the process: then kept in `compiled`, a larger shape to pad to)."""
        if key not in self.compiled and ready(*key[1:]):
            self.compiled.add(key)
        return key in self.compiled

    def ran(self, kind: str, n: int, side: int, compile_s: float) -> None:
        """A prefill ran at (n, side), after compile_s seconds compiling it (0: it was;
        > 0 for a pair known here too where programs.py had dropped it, MAX_KEPT)."""
        self.compiled.add((kind, n, side))
        if compile_s > 0:
            self.compile_s.append(compile_s)
