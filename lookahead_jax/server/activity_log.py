"""The server's periodic log line: every `every_s` seconds in which requests finished,
what the engine did since the last line — the requests and their tokens (counted as a
request finishes), the slots busy and the queue, tokens a step (exactly 1.00 for plain
decoding: engine/stats.py), guesses accepted, and auto's rounds by row bucket and mode —
as vLLM's and llama.cpp's servers log their speculative acceptance while they serve:

    12:00:10 last 10 s: 3 requests done with 412 tokens, 2 decoding, 0 waiting; 1.85
    tokens a step, 180 guesses accepted; auto rounds: 1 row 12 lookahead / 3 plain

(one line). Read from the engine's online stats (what /metrics reads) on a thread of its
own; a quiet interval writes nothing; the last interval's line is written at shutdown.
"""

from __future__ import annotations

import sys
import threading
import time

DEFAULT_EVERY_S = 10.0

_COUNTS = ("prompts", "new_tokens", "step_tokens", "row_steps", "accepted_tokens")


class ActivityLog:
    """The line for the interval since the last one (`line`), and a thread that writes it
    every `every_s` seconds (`start` / `stop`)."""

    def __init__(self, engine, every_s: float = DEFAULT_EVERY_S, write=None):
        self.engine, self.every_s = engine, every_s
        self.write = write or (lambda text: print(text, file=sys.stderr, flush=True))
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="lookahead-log", daemon=True)
        self._stats = None  # the stats object the snapshot was read from
        self._then = self._snapshot(time.perf_counter())

    def _snapshot(self, now: float) -> dict:
        stats = self._stats = self.engine.online_stats  # (warm_up replaces it)
        # read twice until both agree: a request's counts are four additions on the
        # engine's thread, and a read between them would mix two requests' figures
        counts, again = None, {name: getattr(stats, name) for name in _COUNTS}
        while counts != again:
            counts, again = again, {name: getattr(stats, name) for name in _COUNTS}
        rounds = {
            (int(rows), mode): seen["rounds"]
            for rows, modes in dict(stats.per_round).items()
            for mode, seen in dict(modes).items()
        }
        return {"at": now, "rounds": rounds, **counts}

    def line(self, now: float | None = None) -> str | None:
        """What was decoded since the last line (None: no request finished since; the next
        line then covers this interval too)."""
        now = time.perf_counter() if now is None else now
        before = self._then if self.engine.online_stats is self._stats else None
        after = self._snapshot(now)
        if before is None:  # new stats (warm_up ran): count from them
            before = {**{name: 0 for name in _COUNTS}, "rounds": {}}
            before["at"] = now - self.every_s
        d = {name: after[name] - before[name] for name in _COUNTS}
        if d["new_tokens"] == 0 and d["prompts"] == 0:
            self._then = before
            return None
        self._then = after
        seconds = now - before["at"]
        n = d["prompts"]
        words = [
            f"{n} request{'s' * (n != 1)} done with {d['new_tokens']} tokens, "
            f"{self.engine.slots_in_use} decoding, {self.engine.queued} waiting"
        ]
        if d["row_steps"]:  # (counted as requests finish)
            per_step = f"{d['step_tokens'] / d['row_steps']:.2f} tokens a step"
            words.append(f"{per_step}, {d['accepted_tokens']} guesses accepted")
        rounds = {
            key: n - before["rounds"].get(key, 0)
            for key, n in after["rounds"].items()
            if n > before["rounds"].get(key, 0)
        }
        if rounds:
            buckets = sorted({rows for rows, _ in rounds})
            words.append(
                "auto rounds: "
                + ", ".join(
                    f"{rows} row{'s' * (rows > 1)} "
                    + " / ".join(f"{rounds[(rows, m)]} {m}" for m in _MODES if (rows, m) in rounds)
                    for rows in buckets
                )
            )
        return f"{time.strftime('%H:%M:%S')} last {seconds:.0f} s: " + "; ".join(words)

    def _run(self) -> None:
        stopping = False
        while not stopping:
            stopping = self._stop.wait(self.every_s)  # (set: the last interval's line)
            text = self.line()  # (per_round is replaced whole, never grown while read)
            if text is not None:
                self.write(text)

    def start(self) -> None:
        if self.every_s > 0:
            self._thread.start()

    def stop(self) -> None:
        """Write the last interval's line (if anything finished in it) and stop."""
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(timeout=5)


_MODES = ("lookahead", "plain")
