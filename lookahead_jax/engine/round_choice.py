"""`auto`'s choice for each online decode round: the lookahead layout, or plain steps over
the same state (decoding.run_loop's `plain`), whichever the rows live now decode faster
at the round's row bucket.

A lookahead step of T tokens costs more than a plain step, and more so with more rows
(a 16-row step on a CPU is compute-bound), while what it gains is what the live rows
accept — greedy code far more than chat sampled at t = 1. Neither is known at start-up,
and both move with the traffic, so they are measured as the rounds run: per row bucket R
and mode, new tokens a second per live row (an average over rounds, recent ones
weighted most). A round runs the faster mode at its R (lookahead must win by MARGIN);
the other is run again now and then to keep its figure fresh: after 4 rounds, then 8,
16, ... up to 64 while the choice holds, back to 4 when it flips. A bucket starts with a
lookahead round, then a plain one.

Worked example (R = 16): lookahead rounds measure 5.1 tokens/s a row, plain 7.9: plain
runs, and every 4th, then 8th, 16th ... round is a lookahead one. Load falls to 2 rows
(R = 2): lookahead 31 tokens/s a row, plain 27: lookahead runs there, plain every so
often. Tokens are the same whichever mode runs (every guess is verified).
"""

from __future__ import annotations

MARGIN = 1.03  # lookahead's rate over plain's needed to run it (as autotune.MARGIN)
WEIGHT = 0.3  # of a new round's rate in a mode's average
FIRST_INTERVAL, MAX_INTERVAL = 4, 64  # rounds between runs of the mode not chosen


class RoundChoice:
    """The rule above: measured rates per (R, mode), and when to re-measure."""

    def __init__(self):
        self.rate: dict[tuple[int, str], float] = {}  # (R, mode) -> tokens/s per live row
        self.rounds: dict[tuple[int, str], int] = {}  # (R, mode) -> rounds run
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
        if seconds <= 0 or live <= 0:
            return
        rate = tokens / seconds / live
        old = self.rate.get(key)
        self.rate[key] = rate if old is None else (1 - WEIGHT) * old + WEIGHT * rate
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
