"""`auto`'s choice for each online decode round: the lookahead layout, or plain steps over
the same state (decoding.run_loop's `plain`), whichever the rows live now would decode
faster at the round's row bucket R.

A round's speed is what its rows accept over what its steps cost, and the two are
measured apart, because they move for different reasons:

* cost: seconds per step at (R, mode), over the last WINDOW rounds of each. It belongs to
  the programs and the machine: a lookahead step of T tokens at R rows computes R * T
  positions, so on a 2-core CPU with T = 12 it costs ~1.2x a plain step at R = 1 and
  ~11x at R = 16, where the arithmetic, not the weights, sets a step's time.
* acceptance: each live row's own tokens per lookahead step, over its lookahead rounds
  (the earlier ones decayed: a request's text grows more repetitive as it goes), drawn
  toward what the last KIND_ROWS rows of its kind accepted (greedy or sampled: sampling
  accepts far less; each row once) by PRIOR_STEPS steps' weight — a new row counts as
  its kind, a row after a few rounds as itself; before any lookahead round, as autotune
  expects of the layout (`prior`).

A round runs lookahead when its rows' summed acceptance, times the bucket's calibration
(below), over lookahead's step cost beats their count over plain's by MARGIN; so a greedy
row that repeats its prompt runs lookahead at R = 1 while a server full of sampled chats
runs plain, and a row's choice changes as its own acceptance does, not the average of
whoever came before.

Calibration: per R, the tokens lookahead rounds emitted over what the rows' figures
predicted for them (the opening probes left out; decayed by CAL_DECAY every CAL_STEPS
steps, so a one-step probe weighs a quarter of a 4-step round; from CAL_PRIOR predicted
tokens a row at 1.0).
A row's figure follows its recent rounds, and a greedy row's acceptance comes in bursts
(a recalled span accepts 12 tokens a step, the next sentence 1): rounds chosen because
the figures were high may come as a burst ends, and a new row's kind figure may not be
its own; the calibration corrects whatever the figures get wrong at R, measured. Over
one run of benchmarks/cpu/load_levels_suffixes (a 2-core Intel Xeon, greedy and sampled
code chats) it ended at 0.87 at one row, 1.00-1.05 at 2 to 16 rows.

The mode not chosen runs again now and then to keep its figures fresh: after 4 rounds,
then 8, 16 up to 32 while the choice holds, back to 4 when it flips; lookahead, where
plain is chosen, no sooner than every (cost ratio - 1) / EXPLORE_SHARE rounds, so that
its steps' extra cost over plain ones stays under EXPLORE_SHARE of the time, and where
its step costs PROBE_RATIO times a plain one or more, by a one-step probe (its step's
cost and what the rows accept in it, at a quarter of a round's cost): a server under
16 chats at R = 16, a lookahead step 2.7x a plain one, re-measured it with 4-step
rounds every 4-8 rounds, a third of its time; then every 34, ~4 %; with one step every
34 now, ~1 %. Below PROBE_RATIO a whole round costs little more and measures the rows
better (their figures lean less on their kind's). Lookahead is
*hopeless* at R when its step there costs PROBE_RATIO times a plain one or more and its cost
ratio is above the best acceptance any row showed in the last WINDOW lookahead rounds,
HOPELESS_AFTER of them at least (even rows like that one could not pay for its steps):
then it is re-measured only every HOPELESS_INTERVAL rounds (by a probe of one step too).
The one-step re-measures count among those rounds: after one step a row's figure leans
on its kind's, so a bucket where plain is chosen may turn hopeless sooner than 4-step
rounds would have made it (its re-probes still end the spell).
A new R starts with three one-step lookahead probes (the first unmeasured: a program's
first run may carry one-time costs), then plain rounds (the first unmeasured too). The
opening probes measure the step's cost only: what they accept is not counted, since a
request's first steps accept little (its guess pools start empty). (On a server's first
MT-bench chats at R = 1 they read 1.0 token a step at 1.67x plain's cost, which once
made lookahead hopeless there before any of its rounds had run.) A hopeless bucket's
re-probe counts both: rows that start accepting well end the spell.

Below PROBE_RATIO lookahead is never hopeless: a wrong round costs less than twice a plain
one, and a request's first rounds accept little (its guess pools start empty). Before
this rule four such rounds at a server's start shut lookahead out at one row, re-probed
by one step every 128 rounds: 20 greedy code chats one at a time on a 16-slot engine
(SmolLM2, 64 tokens each, a 2-core AMD EPYC, Zen 4) ran 617 plain rounds and 11
lookahead, 51.5 tokens/s against plain's 54.1, where lookahead alone (tokens=8) ran 71.7.

Once the rows chose lookahead at R, plain takes over only where it wins by STAY more
(its rate with MARGIN / STAY): lookahead's guess sources learn only in its own steps
(a plain round leaves its window and n-gram pool as they were), so after a plain spell
the rows accept less than their figures say, and choosing afresh on every dip kept
about half the rounds plain: the same chats read 55.4 tokens/s choosing afresh, 72.8
with STAY, where plain read 51.1-54.1 (1.42x in one process; lookahead steps there cost
1.1x plain ones).

Worked example (T = 12, a 2-core CPU): at R = 16 plain steps take 70 ms and lookahead
steps 780 ms, 11x; the best row lately accepted 2.25 tokens a step: hopeless, so plain
runs, and a one-step lookahead probe (0.8 s) every 128 rounds (of 4 steps: ~36 s) costs
~2 %. Load falls to one greedy row (R = 1): plain 30 ms, lookahead 36 ms (1.2x); the row
is new and recent greedy rows accepted 2.25 tokens a step: 2.25 / 36 > 1.03 / 30,
lookahead runs; its round then reads 1 token a step (none of its guesses land: a prose
answer), and after it the row's figure is 1.31 (its own 1.0, drawn toward its kind's,
now 1.63: the mean of the earlier row's 2.25 and its own), times R = 1's calibration,
now 0.89 (the round emitted 4 tokens where 9 were predicted), 1.16: under the
break-even 1.03 * 36 / 30 = 1.24, but lookahead ran, so plain must win by STAY more
(1.24 / 1.1 = 1.12): lookahead runs again, reads 1 token a step again, and the figure
falls to 1.08 (the row's 1.23 times 0.87): plain runs, and lookahead is tried again after
4 rounds. Tokens are the same whichever mode runs (every guess is verified).

Calibrated: at R = 16, plain 70 ms and lookahead 230 ms a step (3.3x; break-even
1.03 * 230 / 70 = 3.38 tokens a step), sixteen rows whose long records say 3.5 tokens a
step run lookahead, and emit 2.75 a step for 4 steps. Their own figures barely move
(3.46: a long record), but the bucket's calibration becomes (176 + 64) / (224 + 64) =
0.83 (176 tokens emitted, 224 predicted, 64 the prior's), and 0.83 * 3.46 = 2.88 < 3.38:
plain runs, and lookahead is re-measured by a one-step probe (3.3x >= PROBE_RATIO) after
(3.3 - 1) / EXPLORE_SHARE = 46 rounds, which keeps the calibration fresh for ~1 % of
the time.
"""

from __future__ import annotations

import collections
import dataclasses
import math

MARGIN = 1.03  # lookahead's expected rate over plain's needed to run it (as autotune.MARGIN)
WINDOW = 8  # rounds a cost is measured over
FIRST_INTERVAL, MAX_INTERVAL = 4, 32  # rounds between runs of the mode not chosen
HOPELESS_INTERVAL = 128  # ... where lookahead cannot pay (then a one-step probe)
HOPELESS_AFTER = 4  # lookahead rounds (not opening probes) seen before it may be judged hopeless
EXPLORE_SHARE = 0.05  # of the time, at most, that re-measuring lookahead costs over plain
PROBE_RATIO = 2.0  # a lookahead step's cost over plain's from which a re-measure is one step
STAY = 1.1  # once the rows chose lookahead at R, how much more plain must win by to take over
ROW_DECAY = 0.7  # a row's earlier lookahead rounds' weight, per newer round
PRIOR_STEPS = 4  # the weight, in steps, of a row's kind's acceptance in its own figure
KIND_ROWS = 16  # the recent rows a kind's acceptance is the mean of
CAL_DECAY, CAL_STEPS = 0.8, 4  # earlier rounds' weight in a calibration, per 4 steps
CAL_PRIOR = 4.0  # predicted tokens a row at calibration 1.0 a bucket starts from


class RowAcceptance:
    """One row's tokens per lookahead step, over its lookahead rounds (decayed)."""

    def __init__(self):
        self.tokens = self.steps = 0.0

    def add(self, tokens: int, steps: int) -> None:
        self.tokens = self.tokens * ROW_DECAY + tokens
        self.steps = self.steps * ROW_DECAY + steps

    @property
    def estimate(self) -> float | None:
        """Tokens per step, None before any lookahead step."""
        return self.tokens / self.steps if self.steps > 0 else None


@dataclasses.dataclass
class RowRound:
    """A live row as a round sees it: its kind, its acceptance so far, and (after the
    round) the tokens it emitted and the steps it ran."""

    greedy: bool
    acceptance: RowAcceptance
    tokens: int = 0
    steps: int = 0


class RoundChoice:
    """The rule above: measured costs per (R, mode), acceptance per row and per kind, and
    when to re-measure. `prior`: tokens per lookahead step expected before any measured."""

    def __init__(self, prior: float):
        self.prior = prior
        self.rounds: dict[tuple[int, str], int] = {}  # (R, mode) -> rounds run
        # (R, mode) -> its last WINDOW timed rounds: (seconds, steps, tokens, row-seconds)
        self._timed: dict[tuple[int, str], collections.deque] = {}
        # greedy? -> the last KIND_ROWS rows of that kind to run lookahead, each once
        self._kind: dict[bool, dict[RowAcceptance, None]] = {True: {}, False: {}}
        self._best: collections.deque = collections.deque(maxlen=WINDOW)  # a round's best row
        self._since: dict[int, int] = {}  # R -> rounds since the mode not chosen ran
        self._interval: dict[int, int] = {}  # R -> rounds between its runs
        # R -> (plain chosen, exploring) at the last choice; None: still measuring
        self._last: dict[int, tuple[bool, bool] | None] = {}
        # R -> [tokens emitted, tokens predicted] by its lookahead rounds, decayed
        self._calibrated: dict[int, list[float]] = {}

    def step_s(self, R: int, mode: str) -> float | None:
        """Seconds per step at R rows in `mode` ("plain" or "lookahead"), None unmeasured."""
        window = self._timed.get((R, mode))
        if not window:
            return None
        return sum(r[0] for r in window) / sum(r[1] for r in window)

    def kind_acceptance(self, greedy: bool) -> float:
        """Tokens per lookahead step of the recent rows of this kind, each row's own
        figure weighing once (not each round's: rows that accept well run lookahead more
        rounds, and would lift the figure a new row starts from); else the prior."""
        rows = [r.estimate for r in self._kind[greedy]]
        return sum(rows) / len(rows) if rows else self.prior

    def row_acceptance(self, row: RowRound) -> float:
        """A row's expected tokens per lookahead step: its own, drawn toward its kind's by
        PRIOR_STEPS steps' weight (one probe step is a noisy figure; a few rounds are not)."""
        own = row.acceptance
        kind = self.kind_acceptance(row.greedy)
        return (own.tokens + PRIOR_STEPS * kind) / (own.steps + PRIOR_STEPS)

    def calibration(self, R: int) -> float:
        """What lookahead rounds at R emitted over what their rows' figures predicted
        (decayed; from CAL_PRIOR predicted tokens a row at 1.0)."""
        emitted, predicted = self._calibrated.get(R, (0.0, 0.0))
        return (emitted + CAL_PRIOR * R) / (predicted + CAL_PRIOR * R)

    def _expected(self, R: int, rows: list[RowRound]) -> float:
        """Tokens a lookahead step at R is expected to emit for these rows, calibrated."""
        return self.calibration(R) * sum(self.row_acceptance(r) for r in rows)

    def hopeless(self, R: int) -> bool:
        """Whether lookahead's step at R costs PROBE_RATIO times plain's or more, and more
        than the best row seen lately accepted a step (both costs measured, lookahead's by
        two rounds at least: one noisy probe must not shut it out for HOPELESS_INTERVAL
        rounds; and HOPELESS_AFTER lookahead rounds run, at any R: a request's first round
        accepts little, its guess pools empty)."""
        ratio = self.cost_ratio(R)
        if ratio is None or ratio < PROBE_RATIO or len(self._timed[(R, "lookahead")]) < 2:
            return False
        if len(self._best) < HOPELESS_AFTER:  # too few seen (opening probes: none)
            return False
        return ratio > max(max(self._best), 1.0)

    def cost_ratio(self, R: int) -> float | None:
        """A lookahead step's cost over a plain one's at R, None until both are measured."""
        la, pl = self.step_s(R, "lookahead"), self.step_s(R, "plain")
        return None if la is None or pl is None else la / pl

    def _plain_wins(self, R: int, rows: list[RowRound], margin: float = MARGIN) -> bool:
        """Whether plain steps would emit these rows' tokens faster at R (both costs
        measured): their number over plain's step cost, with `margin`, against their
        summed acceptance over lookahead's."""
        la, pl = self.step_s(R, "lookahead"), self.step_s(R, "plain")
        return len(rows) / pl * margin >= self._expected(R, rows) / la

    @staticmethod
    def _margin(last: tuple[bool, bool] | None) -> float:
        """The margin plain must win by after the choice `last` (R's (plain chosen,
        exploring), None while measuring): MARGIN, or MARGIN / STAY more where the rows
        chose lookahead (whether or not that round explored plain steps)."""
        return MARGIN / STAY if last is not None and not last[0] else MARGIN

    def choose(self, R: int, rows: list[RowRound]) -> tuple[bool, bool]:
        """(plain, probe) for the next round at R rows with these live rows: whether it
        runs plain steps, and whether it is a lookahead probe of one step."""
        if len(self._timed.get((R, "lookahead"), ())) < 2:  # probes first
            self._last[R] = None
            return False, True
        if self.step_s(R, "plain") is None:
            self._last[R] = None
            return True, False
        last = self._last.get(R)
        plain_wins = self._plain_wins(R, rows, self._margin(last))
        if last is not None and last[0] != plain_wins:  # the rows now choose the other mode
            self._since[R], self._interval[R] = 0, FIRST_INTERVAL
        hopeless, ratio = self.hopeless(R), self.cost_ratio(R)
        interval = HOPELESS_INTERVAL if hopeless else self._interval.get(R, FIRST_INTERVAL)
        if plain_wins and not hopeless:  # (a hopeless bucket's probes are one step)
            interval = max(interval, math.ceil((ratio - 1) / EXPLORE_SHARE))
        explore = self._since.get(R, 0) >= interval
        self._last[R] = (plain_wins, explore)
        plain = plain_wins != explore
        one_step = hopeless or (plain_wins and ratio >= PROBE_RATIO)
        return plain, not plain and one_step

    def ran(
        self, R: int, plain: bool, seconds: float, rows: list[RowRound], probe: bool = False
    ) -> None:
        """A round at R rows ran (plain or not) for `seconds`; `rows`: its live rows, with
        the tokens each emitted and the steps each ran; `probe`: a one-step lookahead
        probe (`choose` said so): an opening probe measures the step's cost only, a
        hopeless bucket's re-probe its rows' acceptance too (else nothing could end it)."""
        key = (R, "plain" if plain else "lookahead")
        self.rounds[key] = self.rounds.get(key, 0) + 1
        opening = probe and self._last.get(R) is None
        if not plain and not opening:  # every other round's acceptance counts, a first one's too
            self._calibrate(R, [r for r in rows if r.steps > 0])
            for r in rows:
                if r.steps > 0:
                    r.acceptance.add(r.tokens, r.steps)
            for r in rows:
                if r.steps > 0:
                    kind = self._kind[r.greedy]
                    kind.pop(r.acceptance, None)
                    kind[r.acceptance] = None  # (the newest last)
                    if len(kind) > KIND_ROWS:
                        del kind[next(iter(kind))]
            measured = [self.row_acceptance(r) for r in rows if r.steps > 0]
            if measured:
                self._best.append(max(measured))
        steps = max((r.steps for r in rows), default=0)
        if seconds <= 0 or steps <= 0 or self.rounds[key] == 1:
            return  # nothing to time, or a program's first run
        timed = (seconds, steps, sum(r.tokens for r in rows), seconds * len(rows))
        self._timed.setdefault(key, collections.deque(maxlen=WINDOW)).append(timed)
        last = self._last.get(R)
        if last is None:  # still measuring
            self._since[R] = 0
            return
        chosen, explored = last
        if not explored:
            self._since[R] = self._since.get(R, 0) + 1
            return
        flipped = bool(rows) and self._plain_wins(R, rows, self._margin(last)) != chosen
        interval = self._interval.get(R, FIRST_INTERVAL)
        self._interval[R] = FIRST_INTERVAL if flipped else min(2 * interval, MAX_INTERVAL)
        self._since[R] = 0

    def _calibrate(self, R: int, ran: list[RowRound]) -> None:
        """Fold a lookahead round's rows into R's calibration: the tokens they emitted,
        and what their figures predicted (before this round's own are added: as the
        choice saw them), the earlier rounds decayed by CAL_DECAY per CAL_STEPS steps."""
        if not ran:
            return
        decay = CAL_DECAY ** (max(r.steps for r in ran) / CAL_STEPS)
        calibrated = self._calibrated.setdefault(R, [0.0, 0.0])
        calibrated[0] = calibrated[0] * decay + sum(r.tokens for r in ran)
        calibrated[1] = calibrated[1] * decay + sum(self.row_acceptance(r) * r.steps for r in ran)

    def describe(self) -> dict:
        """Per row bucket and mode: rounds, milliseconds a step, tokens/s per live row;
        for lookahead, whether it is hopeless there."""
        out: dict[str, dict] = {}
        for (R, mode), n in sorted(self.rounds.items()):
            seen: dict = {"rounds": n}
            step = self.step_s(R, mode)
            if step is not None:
                tokens, row_s = (sum(r[i] for r in self._timed[(R, mode)]) for i in (2, 3))
                seen["step_ms"] = round(1e3 * step, 2)
                seen["tokens_per_s_per_row"] = round(tokens / row_s, 2) if row_s else 0.0
            if mode == "lookahead":
                seen["hopeless"] = self.hopeless(R)
                seen["calibration"] = round(self.calibration(R), 3)
            out.setdefault(str(R), {})[mode] = seen
        return out
