"""The cache directory is shared by concurrent processes (two CLI runs, pytest workers):
its writes are atomic and the default model's one-time conversion is serialized."""

import threading
import time

from lookahead_jax.cache_dir import exclusive, write_atomic


def test_concurrent_atomic_writes_never_collide(tmp_path):
    path = tmp_path / "sub" / "factor.json"
    errors = []

    def writer(k):
        try:
            for i in range(200):
                write_atomic(path, f'{{"writer": {k}, "i": {i}}}')
        except Exception as e:  # the failure this test is for
            errors.append(e)

    threads = [threading.Thread(target=writer, args=(k,)) for k in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == []
    assert path.read_text().endswith('"i": 199}')
    assert [p.name for p in path.parent.iterdir()] == ["factor.json"]  # no temp files left


def test_exclusive_makes_the_second_holder_wait(tmp_path):
    lock = tmp_path / "model.lock"
    order = []
    held = threading.Event()

    def first():
        with exclusive(lock):
            held.set()
            time.sleep(0.3)
            order.append("first done")

    t = threading.Thread(target=first)
    t.start()
    held.wait()
    with exclusive(lock):
        order.append("second in")
    t.join()
    assert order == ["first done", "second in"]


_COMPILE_CACHE_PROBE = """
import os, jax
from lookahead_jax import cache_dir
os.environ["LOOKAHEAD_JAX_NO_COMPILE_CACHE"] = "1"
cache_dir.enable_compilation_cache()
print(jax.config.jax_compilation_cache_dir)
del os.environ["LOOKAHEAD_JAX_NO_COMPILE_CACHE"]
cache_dir.enable_compilation_cache()
print(jax.config.jax_compilation_cache_dir)
print(jax.config.jax_compilation_cache_max_size)
print(jax.config.jax_persistent_cache_min_compile_time_secs)
jax.config.update("jax_compilation_cache_dir", None)
os.environ["LOOKAHEAD_JAX_COMPILE_CACHE"] = os.environ["LOOKAHEAD_JAX_CACHE"] + "/chosen"
cache_dir.enable_compilation_cache()
print(jax.config.jax_compilation_cache_dir)
"""


def test_compilation_cache_is_locked_between_processes_and_can_be_turned_off(tmp_path):
    """In a fresh process (JAX's config is global): LOOKAHEAD_JAX_NO_COMPILE_CACHE=1 leaves
    the cache off; otherwise it lives under the cache root (or in
    $LOOKAHEAD_JAX_COMPILE_CACHE) with a size cap, which is what turns on JAX's file lock
    between processes, and stores only slow compiles."""
    import os
    import subprocess
    import sys

    from lookahead_jax.cache_dir import COMPILE_CACHE_MAX_BYTES, COMPILE_CACHE_MIN_SECONDS

    env = {
        k: v
        for k, v in os.environ.items()
        if not k.startswith("JAX_COMPILATION_CACHE") and k != "LOOKAHEAD_JAX_COMPILE_CACHE"
    }
    env["LOOKAHEAD_JAX_CACHE"] = str(tmp_path)
    out = subprocess.run(
        [sys.executable, "-c", _COMPILE_CACHE_PROBE],
        env=env,
        capture_output=True,
        text=True,
        check=True,
    ).stdout.split()
    assert out == [
        "None",
        str(tmp_path / "compiled"),
        str(COMPILE_CACHE_MAX_BYTES),
        str(COMPILE_CACHE_MIN_SECONDS),
        str(tmp_path / "chosen"),
    ]
    assert COMPILE_CACHE_MAX_BYTES > 0  # -1 would mean no eviction and no lock
