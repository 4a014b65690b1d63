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


@contextlib.contextmanager
def held():
    """Hold SIGINT for the block; the yielded object's `pressed` says whether it came.
    Only where Python's own SIGINT handler is in place (the main thread); elsewhere (the
    server's engine thread, a handler of the caller's own) the block runs as it is. A
    block inside another (each round of lj.generate's run, held whole) yields the outer
    one's object, which its handler carries: a Ctrl-C between two rounds is then seen
    by the next round, not raised in the gap."""
    ctrl_c = _Held()
    if threading.current_thread() is not threading.main_thread():
        yield ctrl_c
        return
    current = signal.getsignal(signal.SIGINT)
    if isinstance(getattr(current, "ctrl_c", None), _Held):  # nested in a held block
        yield current.ctrl_c
        return
    if current is not signal.default_int_handler:
        yield ctrl_c
        return

    def hold(signum, frame):
        ctrl_c.pressed = True

    hold.ctrl_c = ctrl_c
    signal.signal(signal.SIGINT, hold)
    try:
        yield ctrl_c
    finally:
        signal.signal(signal.SIGINT, signal.default_int_handler)
