"""The two loops that drive a decode over the same jitted step:

* `on_device` — `decoding.run_loop` (a `lax.while_loop`) in chunks of `steps_per_call`
  steps, returning to the host between chunks (to notice Ctrl-C, or to let the auto
  policy hand a losing lookahead to plain decoding);
* `on_host` — one `decoding.step` per call, reading the new tokens after each one and
  passing them to `stream` (streaming output).

Both take a `watch` object (autotune.AutoRun, or NO_WATCH) whose `check(state)` may
swap in another program and state mid-way. On Ctrl-C both raise KeyboardInterrupt with
`.state`, the last completed state: nothing half-done.
"""

from __future__ import annotations

import jax.numpy as jnp
import numpy as np

from lookahead_jax import multihost
from lookahead_jax.decode_state import DecodeState


class _NoWatch:
    def check(self, state):
        return None


NO_WATCH = _NoWatch()


def on_device(params, exe, state: DecodeState, steps_per_call: int, watch=NO_WATCH):
    try:
        while True:
            state = exe(params, state, jnp.int32(steps_per_call), jnp.bool_(False))
            if multihost.all_true(state.done):
                return state
            if (swapped := watch.check(state)) is not None:
                exe, state = swapped
    except KeyboardInterrupt as e:
        e.state = state
        raise


def on_host(params, exe, state: DecodeState, stream, watch=NO_WATCH):
    """`stream(new)` after the prefill and after every step: each row's new token ids."""
    prompt_len = multihost.local_rows(state.prompt_len)
    sent = np.zeros_like(prompt_len)

    def flush(state):
        n_out = multihost.local_rows(state.n_out)
        if (n_out > sent).any():
            tokens = multihost.local_rows(state.tokens)
            new = [
                tokens[b, prompt_len[b] + sent[b] : prompt_len[b] + n_out[b]].tolist()
                for b in range(len(n_out))
            ]
            sent[:] = n_out
            stream(new)

    try:
        flush(state)
        while not multihost.all_true(state.done):
            state = exe(params, state)
            flush(state)
            if (swapped := watch.check(state)) is not None:
                exe, state = swapped
        return state
    except KeyboardInterrupt as e:
        e.state = state
        raise
