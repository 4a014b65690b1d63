"""What the engine's rows accepted, counted as they finish, and `auto`'s watch over it:
each finished row's steps by tokens emitted and, with lookahead, each guess source's
proposed nodes, credited paths and tokens (into the stats); auto's hand-over to plain
decoding when the acceptance seen so far does not pay (autotune.AutoRun judges), and its
record of the run's acceptance for the next choice.
"""

from __future__ import annotations

import numpy as np

from lookahead_jax.decoding import autotune
from lookahead_jax.distributed import multihost
from lookahead_jax.engine.device_slots import DeviceSlots
from lookahead_jax.engine.round_read import RoundRead
from lookahead_jax.guesses import acceptance_record


class RowCounts:
    """The counts of one run's rows (one per set of slots), and auto's policy for it."""

    def __init__(self, device: DeviceSlots, auto: autotune.AutoRun | None, stats):
        self.device, self.auto, self.stats = device, auto, stats
        lookahead = device.spec.lookahead
        self.source_names = () if lookahead is None else lookahead.source_names
        self.hist_done_e = None  # the lookahead phase's accepted-length histogram [E] of
        self.plain_steps = 0  # rows read; after auto's hand-over, their plain steps
        self.weights = None  # (sum of finished rows' record weights [n_sources, A], rows)

    def count(self, slots: list[int], read: RoundRead) -> None:
        """Count the rows `slots` into the stats: their steps by tokens emitted and, with
        lookahead, each source's proposed nodes, accepted paths and tokens. Rows that end
        now; or, at auto's hand-over, the rows in flight (their lookahead phase: the
        plain state that follows starts its counts afresh). `read`: the slots as the
        round left them (round_read.py)."""
        if not slots:
            return
        for s in slots:
            self._add_hist(read.accept_hist_be[s])
        if read.nodes_bj is None:
            return
        counts = (read.nodes_bj, read.paths_bj, read.tokens_bj)
        nodes, paths, tokens = (a[slots].sum(0) for a in counts)
        draft, weights = self.device.state.draft, None
        if draft.record is not None:  # the rows' last weights by depth, averaged
            record = acceptance_record.AcceptanceRecord(
                expected=multihost.all_rows(draft.record.expected)[slots],
                accepted=multihost.all_rows(draft.record.accepted)[slots],
            )
            w_sum = acceptance_record.weights(record).sum(0)  # [n_sources, A]
            total, rows = self.weights or (0.0, 0)
            self.weights = (total + w_sum, rows + len(slots))
            weights = self.weights[0] / self.weights[1]
        self.stats.count_sources(self.source_names, nodes, paths, tokens, weights)

    def _add_hist(self, hist_e) -> None:
        """Count a finished row's accepted-length histogram [E]: into the lookahead
        phase's, or after auto's hand-over to plain decoding, its steps (one column)."""
        if self.auto is not None and self.auto.after_steps is not None:
            self.plain_steps += int(hist_e.sum())
            return
        if self.hist_done_e is None:
            self.hist_done_e = np.zeros_like(hist_e)
        self.hist_done_e += hist_e

    def accepted_hist(self):
        """[E]: the finished rows' steps by tokens emitted, the plain phase's included."""
        if self.auto is None or self.auto.lookahead_hist is None:
            return self.hist_done_e
        hist = self.auto.lookahead_hist.sum(0).copy()
        hist[0] += self.plain_steps
        return hist

    # ------------------------------------------------------------------ auto

    def _lookahead_hist(self, occupied: list[int], live):
        """[1 + len(occupied), E]: the read results' histogram, then each occupied slot's
        (of `live` [B, E])."""
        rows = [self.hist_done_e if self.hist_done_e is not None else np.zeros(live.shape[1])]
        return np.concatenate([np.asarray(rows, live.dtype), live[occupied]], axis=0)

    def watch(self, occupied: list[int], read: RoundRead) -> bool:
        """auto: hand a losing lookahead over to plain decoding, mid-run, for every slot
        (the same state without the guess sources; buffers keep their sizes). The rows
        in flight (`occupied` slots) keep their lookahead phase's counts. `read`: the
        slots after the round. Returns whether it handed over (the state's counts start
        afresh: read it again)."""
        if self.auto is None or not self.auto.watching:
            return False
        hist = self._lookahead_hist(occupied, read.accept_hist_be)
        steps = int(hist.sum()) // self.device.rows  # the lookahead phase's device steps, about
        if not self.auto.gives_up(hist, steps):
            return False
        self.count(occupied, read)  # their lookahead phase, before the state loses it
        self.auto.after_steps, self.auto.lookahead_hist = steps, hist.sum(0, keepdims=True)
        self.device.to_plain()
        self.stats.count_hand_over(steps)
        return True

    def record_acceptance(self, model) -> None:
        """auto: fold this run's lookahead acceptance into the model's running factor."""
        auto = self.auto
        if auto is None or auto.config is None or self.hist_done_e is None:
            return
        hist = auto.lookahead_hist if auto.lookahead_hist is not None else self.hist_done_e[None]
        compression, steps = autotune.hist_compression(hist)  # steps: row-steps, as generate's
        autotune.record_acceptance(model, auto.config, compression, steps, auto.sampling)
