"""Handing the heap's free memory back to the system, for a process that runs for long.

glibc's malloc keeps what the process frees: a warmed `--batch 16` server (SmolLM2-135M,
float32, auto; AMD EPYC Zen 4) held 6.0 GB resident with 0.8 GB of live arrays, the rest
freed compile and prefill temporaries, and `malloc_trim(0)` (~0.1-0.2 s) brought it to
3.2 GB; under a closed loop of 64 chats it grew again to ~6.7 GB a minute, and a trim
after that brought it to 3.6-4.0 GB. glibc's own knobs (GLIBC_TUNABLES) did worse:
`arena_max=2` kept 6.5-7.8 GB; a fixed `mmap_threshold` of 1 MB kept 4.0-4.6 GB and of
8 MB 4.6-5.1 GB, but both decoded 7-8 % slower (171-176 tokens/s against 184-191: big
buffers mapped afresh each call). So the server trims after its warm-up and once each
time it has been idle for `IDLE_S` (runner.py), never between the rounds of a load.

`release` does nothing where the C library has no `malloc_trim` (musl, macOS).
"""

from __future__ import annotations

import ctypes

IDLE_S = 2.0  # seconds without work before a trim: a client's next request comes sooner


def _malloc_trim():
    try:
        return getattr(ctypes.CDLL(None), "malloc_trim", None)  # the process's C library
    except OSError:  # no dynamic C library to load (a static build)
        return None


_TRIM = _malloc_trim()


def release() -> bool:
    """Return the heap's free pages to the system (glibc's `malloc_trim(0)`); whether the C
    library can (False: nothing done)."""
    if _TRIM is None:
        return False
    _TRIM(0)
    return True
