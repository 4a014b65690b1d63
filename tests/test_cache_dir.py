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
