"""host_memory.release hands the heap's free pages back to the system (glibc's
malloc_trim), and the server's runner does it once in each idle spell."""

import os

import pytest

from lookahead_jax.server import host_memory
from lookahead_jax.server.runner import EngineRunner


def resident_bytes() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


@pytest.mark.skipif(
    host_memory._TRIM is None or "malloc" in os.environ.get("LD_PRELOAD", "")
    or "mmap_threshold" in os.environ.get("GLIBC_TUNABLES", ""),
    reason="the C library has no malloc_trim, or another allocator / threshold is set",
)  # fmt: skip
def test_release_returns_the_pages_free_cannot():
    # 256 MB in 64 KB blocks: on the heap (below glibc's mmap threshold), every page touched
    blocks = [bytearray(64 * 1024) for _ in range(4096)]
    del blocks[:-1]  # the last one pins the heap's top: free() alone gives nothing back
    before = resident_bytes()
    assert host_memory.release()
    assert before - resident_bytes() > 128 * 2**20


def test_the_runner_releases_after_a_while_idle_and_again_while_idle(monkeypatch):
    released = []
    monkeypatch.setattr(host_memory, "release", lambda: released.append(True) or True)
    runner = EngineRunner(engine=None, release_after_s=(2.0, 60.0))
    spells = [
        (0.0, 1.0, 2.0, 3.0, 61.0, 62.5, 200.0),  # at 2, at 62.5 (60 more), at 200
        (0.1, 2.5, 3.0),  # a round with work between: a new spell, at 2.5
        (0.0, 0.2),  # too short
    ]
    for spell in spells:
        for idle_s in spell:  # the engine's seconds since its last round with work
            runner._idle(idle_s)
        released.append("|")
    assert released == [True, True, True, "|", True, "|", "|"]
