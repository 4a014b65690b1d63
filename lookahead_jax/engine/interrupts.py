"""Ctrl-C held while the engine's state is being replaced.

A device call donates the state it is given, and the host's view of the slots (which
request sits where, what its listener has) changes with it: a KeyboardInterrupt raised in
the middle of a round would leave deleted buffers, or a slot whose tokens were read but
not delivered. So a round runs with SIGINT held (`held`), and the caller raises it after,
when host and device agree again; what the round finished is still delivered.
"""

from __future__ import annotations

import contextlib
import signal
import threading


class _Held:
    pressed = False


_holding: _Held | None = None  # the outermost held block of the main thread, while it runs


@contextlib.contextmanager
def held():
    """Hold SIGINT for the block; the yielded object's `pressed` says whether it came.
    Only where Python's own SIGINT handler is in place (the main thread); elsewhere (the
    server's engine thread, a handler of the caller's own) the block runs as it is. A
    block inside another (a round inside lj.generate's whole run) yields the outer one's
    object: a Ctrl-C between two rounds is then seen by the next round, not lost."""
    global _holding
    ctrl_c = _Held()
    if threading.current_thread() is threading.main_thread() and _holding is not None:
        yield _holding
        return
    if (
        threading.current_thread() is not threading.main_thread()
        or signal.getsignal(signal.SIGINT) is not signal.default_int_handler
    ):
        yield ctrl_c
        return

    def hold(signum, frame):
        ctrl_c.pressed = True

    signal.signal(signal.SIGINT, hold)
    _holding = ctrl_c
    try:
        yield ctrl_c
    finally:
        _holding = None
        signal.signal(signal.SIGINT, signal.default_int_handler)
