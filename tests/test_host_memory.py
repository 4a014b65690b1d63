"""host_memory.release hands the heap's free pages back to the system (glibc's
malloc_trim), and the server's runner does it once in each idle spell."""

import os

import pytest

from lookahead_jax.server import host_memory
from lookahead_jax.server.runner import EngineRunner


def resident_bytes() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


@pytest.mark.skipif(host_memory._TRIM is None, reason="the C library has no malloc_trim")
def test_release_returns_the_pages_free_cannot():
    # 256 MB in 64 KB blocks: on the heap (below glibc's mmap threshold), every page touched
    blocks = [bytearray(64 * 1024) for _ in range(4096)]
    del blocks[:-1]  # the last one pins the heap's top: free() alone gives nothing back
    before = resident_bytes()
    assert host_memory.release()
    assert before - resident_bytes() > 128 * 2**20


def test_the_runner_releases_once_in_each_idle_spell(monkeypatch):
    released = []
    monkeypatch.setattr(host_memory, "release", lambda: released.append(True) or True)
    runner = EngineRunner(engine=None)
    idle = host_memory.IDLE_S
    for idle_s in (0.0, 0.5 * idle, idle, 2 * idle, 0.1, 1.5 * idle, 3 * idle, 0.0, 0.2):
        runner._idle(idle_s)  # the engine's seconds since its last round with work
    assert released == [True, True]
