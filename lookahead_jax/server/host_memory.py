"""Handing the heap's free memory back to the system, for a process that runs for long.

glibc's malloc keeps what the process frees. An engine with a `--batch 16` server's
settings (SmolLM2-135M float32, auto; AMD EPYC Zen 4) held 5.2-6.0 GB resident after its
warm-up, 0.8 GB of it live arrays, the rest freed compile and prefill temporaries;
`malloc_trim(0)` (0.1-0.2 s) brought it to 3.2 GB. Under a closed loop of 64 chats it grew
again to ~6.7 GB in a minute, and a trim after that brought it to 3.6-4.0 GB. glibc's own
knobs (GLIBC_TUNABLES) did worse: `arena_max=2` kept 6.5-7.8 GB; a fixed `mmap_threshold`
of 1 MB kept 4.0-4.6 GB and of 8 MB 4.6-5.1 GB, but both decoded 6-9 % slower (171-176
tokens/s against 187-189: big buffers mapped afresh each call). A trim before a burst of
32 chats did not slow it (5.32 s against 5.41 s, medians of 5). So the server trims after
its warm-up and when it has been idle for `IDLE_S`, again every `AGAIN_S` while idle
(background compiles may finish meanwhile) (runner.py), never between the rounds of a
load; a request arriving during a trim waits for it (~0.1-0.2 s on a heap this size).
Figures: benchmarks/cpu/host_memory_epyc_zen4_s85.md.

`release` does nothing where the C library has no `malloc_trim` (musl, macOS).
"""

from __future__ import annotations

import ctypes

IDLE_S = 2.0  # seconds without work before a trim: a client's next request comes sooner
AGAIN_S = 60.0  # and again after this many more while idle


def _malloc_trim():
    try:
        return getattr(ctypes.CDLL(None), "malloc_trim", None)  # the process's C library
    except (OSError, TypeError):  # no dynamic C library to load (a static build; Windows)
        return None


_TRIM = _malloc_trim()


def release() -> bool:
    """Return the heap's free pages to the system (glibc's `malloc_trim(0)`); whether the C
    library can (False: nothing done)."""
    if _TRIM is None:
        return False
    _TRIM(0)
    return True
