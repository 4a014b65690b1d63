"""The engine's thread and the bridge between it and asyncio (JetStream's shape: the
engine runs in a thread of its own, requests and results cross by queues).

The HTTP handlers run on the event loop and call `submit` / `cancel`; the engine thread
runs `Engine.serve`: rounds while there is work, woken by a submission while idle (and
after a while idle, the heap's free memory handed back: host_memory.py). Each
request's updates (engine/requests.py's Update: new tokens, and the Result at the
end) reach the handler through an asyncio.Queue of its own, put there with
`call_soon_threadsafe`.

Faults: a failing device call ends the requests in flight with finish "error" (their
handlers answer 500, or end their streams with an error) and the engine starts afresh;
after MAX_FAILURES failures in a row the runner gives up and calls `on_fatal` (the
server then exits non-zero). `shutdown` ends every open stream with an error and
stops the thread.
"""

from __future__ import annotations

import asyncio
import dataclasses
import itertools
import logging
import threading

from lookahead_jax.engine.continuous import Engine
from lookahead_jax.engine.requests import Request, Update
from lookahead_jax.server import host_memory

log = logging.getLogger("lookahead_jax.server")

MAX_FAILURES = 3  # failing rounds in a row before the server gives up


class ShuttingDown(Exception):
    """A request submitted once `end_streams` began (one whose grammar was compiling on a
    worker thread meanwhile): the server answers 503."""


class Closed:
    """Put on a request's queue when the server shuts down before it finished."""

    message = "the server is shutting down"


class EngineRunner:
    def __init__(
        self, engine: Engine, max_queue: int | None = None, on_fatal=None,
        release_after_s: tuple[float, float] = (host_memory.IDLE_S, host_memory.AGAIN_S),
    ):  # fmt: skip
        """release_after_s: (idle seconds before the heap's free memory is handed back,
        seconds between hand-backs while still idle) (host_memory.py)."""
        self.engine, self.max_queue, self.on_fatal = engine, max_queue, on_fatal
        self.release_after_s = release_after_s
        self.fatal: str | None = None
        self.stopping = False
        self._stop = threading.Event()
        self._open: dict = {}  # request id -> (loop, queue) of the requests not finished
        self._lock = threading.Lock()
        self._failures = 0
        self._released_at: float | None = None  # (_idle: idle seconds at the last, this spell)
        self._ids = itertools.count()
        self._thread = threading.Thread(target=self._serve, name="lookahead-engine", daemon=True)

    def start(self) -> None:
        self._thread.start()

    # ------------------------------------------------------------------ the engine thread

    def _serve(self) -> None:
        try:
            self.engine.serve(self._stop, on_error=self._failed, on_idle=self._idle)
        except Exception as e:  # a bug outside a round: nothing can go on
            self._give_up(f"the engine stopped: {type(e).__name__}: {e}")

    def _idle(self, idle_s: float) -> None:
        """The heap's free memory back to the system once an idle spell has lasted
        release_after_s[0], and every release_after_s[1] more of it (host_memory.py)."""
        first, again = self.release_after_s
        last = self._released_at
        if idle_s < first:
            self._released_at = None
        elif last is None or idle_s - last >= again:
            self._released_at = idle_s
            released = host_memory.release()
            log.debug("idle %.1f s: free heap memory handed back: %s", idle_s, released)

    def _failed(self, error: Exception) -> bool:
        self._failures += 1
        log.error("a decoding round failed (%d in a row): %s", self._failures, error)
        if self._failures < MAX_FAILURES:
            return True
        self._give_up(f"{self._failures} decoding rounds failed in a row; last: {error}")
        return False

    def _give_up(self, message: str) -> None:
        if self.fatal is not None:
            return
        self.fatal = message
        log.error("giving up: %s", message)
        self.end_streams()  # nothing will answer them now
        if self.on_fatal is not None:
            self.on_fatal(message)

    # ------------------------------------------------------------------ the event loop

    def full(self, new: int = 1) -> bool:
        """Whether `new` more requests would have some wait beyond `max_queue` (requests
        waiting beyond the free slots)."""
        if self.max_queue is None:
            return False
        free = self.engine.batch - self.engine.slots_in_use
        return self.engine.queued + new > self.max_queue + free

    def submit(self, request: Request, stream: bool, updates: asyncio.Queue, loop=None) -> str:
        """Queue `request` under a fresh id, its updates to arrive on `updates` of `loop`
        (default: the running one: called on the event loop; from another thread, name
        it; several requests may share one queue: an update names its request); returns
        the id. stream: its tokens as they come (else only its result). Raises
        UserInputError for bad input."""
        loop = loop or asyncio.get_running_loop()

        def listener(update: Update) -> None:
            if update.result is not None:
                self._failures = 0 if update.result.finish != "error" else self._failures
                with self._lock:
                    self._open.pop(update.id, None)
            _put(loop, updates, update)

        rid = f"req-{next(self._ids)}"
        with self._lock:  # open before the engine can finish it
            if self.stopping:  # (end_streams sets it before it takes the lock)
                raise ShuttingDown("the server is shutting down")
            self._open[rid] = (loop, updates)
        try:
            self.engine.submit(dataclasses.replace(request, id=rid), listener, stream=stream)
        except Exception:
            with self._lock:
                self._open.pop(rid, None)
            raise  # a UserInputError names the request in a slot the server fills (app.py)
        return rid

    def cancel(self, request_id) -> None:
        with self._lock:
            self._open.pop(request_id, None)
        self.engine.cancel(request_id)

    def end_streams(self) -> None:
        """Refuse new requests; end every open request with `Closed` (its handler answers
        with an error) and cancel it in the engine."""
        self.stopping = True
        with self._lock:
            open_, self._open = self._open, {}
        for rid, (loop, updates) in open_.items():
            _put(loop, updates, Closed())
            self.engine.cancel(rid)

    def shutdown(self) -> None:
        """`end_streams`, then stop the engine's thread."""
        self.end_streams()
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(timeout=30)


def _put(loop: asyncio.AbstractEventLoop, updates: asyncio.Queue, item) -> None:
    """Hand `item` to a handler's queue on its event loop, from any thread. A loop that
    has closed (the server shut down while a round was finishing) has no handler left to
    tell: the item is dropped, not raised into the engine's round as a failure."""
    try:
        loop.call_soon_threadsafe(updates.put_nowait, item)
    except RuntimeError:
        if not loop.is_closed():
            raise
