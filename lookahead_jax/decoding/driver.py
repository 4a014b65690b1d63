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

import signal
import threading

import jax.numpy as jnp
import numpy as np

from lookahead_jax.decoding.decode_state import DecodeState
from lookahead_jax.distributed import multihost


class _NoWatch:
    def check(self, state):
        return None


NO_WATCH = _NoWatch()


def uninterrupted(exe, *args):
    """exe(*args) with Ctrl-C held until it returns. A step donates its input state, so
    an interrupt raised in the middle of the call would leave the caller holding deleted
    buffers and nothing to return; held, it is raised after, with the new state in hand
    (KeyboardInterrupt with `.state`). Only where Python's own SIGINT handler is in place
    (the main thread); elsewhere the call runs as it is."""
    if (
        threading.current_thread() is not threading.main_thread()
        or signal.getsignal(signal.SIGINT) is not signal.default_int_handler
    ):
        return exe(*args)
    held = []
    signal.signal(signal.SIGINT, lambda signum, frame: held.append(signum))
    try:
        out = exe(*args)
    finally:
        signal.signal(signal.SIGINT, signal.default_int_handler)
    if held:
        e = KeyboardInterrupt()
        e.state = out
        raise e
    return out


def on_device(params, exe, state: DecodeState, steps_per_call: int, watch=NO_WATCH):
    try:
        while True:
            state = uninterrupted(exe, params, state, jnp.int32(steps_per_call), jnp.bool_(False))
            if multihost.all_true(state.done):
                return state
            if (swapped := watch.check(state)) is not None:
                exe, state = swapped
    except KeyboardInterrupt as e:
        if getattr(e, "state", None) is None:  # else: the state of a step that completed
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
            state = uninterrupted(exe, params, state)
            flush(state)
            if (swapped := watch.check(state)) is not None:
                exe, state = swapped
        return state
    except KeyboardInterrupt as e:
        if getattr(e, "state", None) is None:
            e.state = state
        else:  # a step completed under the held Ctrl-C: stream its tokens too
            flush(e.state)
        raise
