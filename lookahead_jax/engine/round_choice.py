"""`auto`'s choice for each online decode round: the lookahead layout, or plain steps over
the same state (decoding.run_loop's `plain`), whichever the rows live now decode faster
at the round's row bucket.

A lookahead step of T tokens costs more than a plain step, and more so with more rows
(a 16-row step on a CPU is compute-bound), while what it gains is what the live rows
accept — greedy code far more than chat sampled at t = 1. Neither is known at start-up,
and both move with the traffic, so they are measured as the rounds run: per row bucket R
and mode, new tokens a second per live row over its last WINDOW rounds (their tokens
over their row-seconds, so a short round weighs little; the first round of each is left
out: it may carry a program's first-run costs). A round runs the faster mode at its R
(lookahead must win by MARGIN); the other is run again now and then to keep its figure
fresh: after 4 rounds, then 8, 16 up to 32 while the choice holds, back to 4 when it
flips. A bucket starts with two lookahead rounds, then two plain ones. A round's rate
is noisy (a shared CPU's speed moves by 20 % between runs; rows finish mid-round), so a
small difference decides little either way; a large one (lookahead at twice plain's
rate for one greedy row) is seen within a few rounds.

Worked example (R = 16): lookahead rounds measure 5.1 tokens/s a row, plain 7.9: plain
runs, and every 4th, then 8th, 16th ... round is a lookahead one. Load falls to 2 rows
(R = 2): lookahead 31 tokens/s a row, plain 27: lookahead runs there, plain every so
often. Tokens are the same whichever mode runs (every guess is verified).
"""

from __future__ import annotations

import collections

MARGIN = 1.03  # lookahead's rate over plain's needed to run it (as autotune.MARGIN)
WINDOW = 8  # rounds a mode's rate is measured over
FIRST_INTERVAL, MAX_INTERVAL = 4, 32  # rounds between runs of the mode not chosen


class RoundChoice:
    """The rule above: measured rates per (R, mode), and when to re-measure."""

    def __init__(self):
        self.rate: dict[tuple[int, str], float] = {}  # (R, mode) -> tokens/s per live row
        self.rounds: dict[tuple[int, str], int] = {}  # (R, mode) -> rounds run
        self._window: dict[tuple[int, str], collections.deque] = {}  # (tokens, row-seconds)
        self._since: dict[int, int] = {}  # R -> rounds since the mode not chosen ran
        self._interval: dict[int, int] = {}  # R -> rounds between its runs
        # R -> (plain chosen, exploring) at the last choice; None: a first measurement
        self._last: dict[int, tuple[bool, bool] | None] = {}

    def _best_is_plain(self, R: int) -> bool:
        return self.rate[(R, "plain")] * MARGIN > self.rate[(R, "lookahead")]

    def plain(self, R: int) -> bool:
        """Whether the next round at R rows runs plain steps."""
        if (R, "lookahead") not in self.rate or (R, "plain") not in self.rate:
            self._last[R] = None
            return (R, "lookahead") in self.rate
        best = self._best_is_plain(R)
        explore = self._since.get(R, 0) >= self._interval.get(R, FIRST_INTERVAL)
        self._last[R] = (best, explore)
        return best != explore

    def ran(self, R: int, plain: bool, seconds: float, tokens: int, live: int) -> None:
        """A round at R rows ran (plain or not) for `seconds`, its `live` rows emitting
        `tokens` new tokens."""
        key = (R, "plain" if plain else "lookahead")
        self.rounds[key] = self.rounds.get(key, 0) + 1
        if seconds <= 0 or live <= 0 or self.rounds[key] == 1:
            return  # nothing to measure, or a first round
        window = self._window.setdefault(key, collections.deque(maxlen=WINDOW))
        window.append((tokens, seconds * live))
        self.rate[key] = sum(t for t, _ in window) / sum(s for _, s in window)
        last = self._last.get(R)
        if last is None:  # a first measurement
            self._since[R] = 0
            return
        chosen, explored = last
        if not explored:
            self._since[R] = self._since.get(R, 0) + 1
            return
        flipped = self._best_is_plain(R) != chosen
        interval = self._interval.get(R, FIRST_INTERVAL)
        self._interval[R] = FIRST_INTERVAL if flipped else min(2 * interval, MAX_INTERVAL)
        self._since[R] = 0

    def describe(self) -> dict:
        """Per row bucket: each mode's rate (tokens/s per live row) and rounds so far."""
        out: dict[str, dict] = {}
        for (R, mode), rate in sorted(self.rate.items()):
            out.setdefault(str(R), {})[mode] = {
                "tokens_per_s_per_row": round(rate, 2),
                "rounds": self.rounds.get((R, mode), 0),
            }
        return out
