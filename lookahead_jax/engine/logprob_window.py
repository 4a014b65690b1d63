"""Logprobs read back after a round (scheduler.py): from one window of positions a row,
what each slot's request has not read yet — its prompt's, when asked and not read; its
new tokens' since the last round and the position after them (an EOS's)."""

from __future__ import annotations

import numpy as np

from lookahead_jax.decoding import logprobs
from lookahead_jax.distributed import multihost
from lookahead_jax.engine import inputs, slot_state
from lookahead_jax.engine.requests import TokenLogprob


class LogprobWindow:
    """Row b's logprobs at positions first_b[b] .. (`read`)."""

    def __init__(self, first_b, arrays):
        self.first_b = first_b
        self.token_bw, self.top_ids_bwo, self.top_bwo = arrays

    @classmethod
    def read(cls, device, active, prompt_len_b, n_out_b) -> LogprobWindow | None:
        """The window the slots' requests (`active`, a scheduler's Active or None a slot)
        need, read from `device` (DeviceSlots); None when no request asks."""
        first_b = np.zeros((device.rows,), np.int32)
        end_b = np.zeros((device.rows,), np.int32)
        for s, a in enumerate(active):
            if a is None:
                continue
            r, start = a.request, int(prompt_len_b[s])
            if r.logprobs is not None:
                first_b[s], end_b[s] = start + len(a.logprobs), start + n_out_b[s] + 1
            if r.prompt_logprobs is not None and a.prompt_logprobs is None:
                first_b[s], end_b[s] = 1, max(end_b[s], start)
        width = int((end_b - first_b).max(initial=0))
        if width <= 0:
            return None
        width = inputs.bucket(width, minimum=8)  # few window programs
        return cls(first_b, _window(device.state, first_b, width))

    def at(self, slot: int, start: int, end: int, k: int) -> list[TokenLogprob]:
        """The TokenLogprobs at positions start .. end - 1 of `slot`, k alternatives each."""
        at = slice(start - self.first_b[slot], end - self.first_b[slot])
        rows = zip(
            self.token_bw[slot, at], self.top_ids_bwo[slot, at], self.top_bwo[slot, at], strict=True
        )
        return [
            TokenLogprob(float(lp), tuple(zip(ids[:k].tolist(), top[:k].tolist(), strict=True)))
            for lp, ids, top in rows
        ]


def _window(state, first_b: np.ndarray, width: int) -> list[np.ndarray]:
    """Each row's logprobs at positions first_b[b] .. + width - 1, every process's rows
    on the host (token [R, W], top_ids and top [R, W, O]; logprobs.window): a round's
    new ones, not the whole [R, S, O] buffers."""
    window = slot_state.program(logprobs.window, None, static_argnums=2)
    kept = window(state.logprobs, first_b, width)
    return [multihost.all_rows(x) for x in (kept.token, kept.top_ids, kept.top)]
