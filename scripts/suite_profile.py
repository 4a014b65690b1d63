"""Where the test suite's time goes: a pytest plugin that records, per test, its wall time
and the JAX time inside it (compiles, traces, lowerings, persistent-cache hits), and a
summary by file.

The suite is compile-bound; this says which files and tests compile what. Record (every
xdist worker appends to its own JSON-lines file under $SUITE_PROFILE_DIR):

    SUITE_PROFILE_DIR=/tmp/suite PYTHONPATH=scripts PYTEST_ADDOPTS="-p suite_profile" \\
        bash scripts/test.sh

Summarize:

    python scripts/suite_profile.py /tmp/suite

Only the test processes are seen: the compiles of the commands a test starts (the CLI,
the server, the multi-host workers) count in its wall time, not in its compile time.
"""

from __future__ import annotations

import collections
import json
import os
import sys
import time
from pathlib import Path

import pytest

# jax.monitoring duration events -> the column they add to
EVENTS = {
    "/jax/core/compile/backend_compile_duration": "compile_s",
    "/jax/core/compile/jaxpr_trace_duration": "trace_s",
    "/jax/core/compile/jaxpr_to_mlir_module_duration": "lower_s",
}
_now: collections.Counter = collections.Counter()


def _on_duration(event: str, duration: float, **_) -> None:
    if event in EVENTS:
        _now[EVENTS[event]] += duration
        _now["compiles"] += EVENTS[event] == "compile_s"


def _on_event(event: str, **_) -> None:
    if event == "/jax/compilation_cache/cache_hits":
        _now["cache_hits"] += 1


def pytest_configure(config) -> None:
    import jax

    jax.monitoring.register_event_duration_secs_listener(_on_duration)
    jax.monitoring.register_event_listener(_on_event)


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item, nextitem):  # setup, call and teardown of one test
    out = Path(os.environ.get("SUITE_PROFILE_DIR", "suite-profile"))
    worker = os.environ.get("PYTEST_XDIST_WORKER", "main")
    _now.clear()
    t = time.perf_counter()
    yield
    record = {"test": item.nodeid, "worker": worker, "wall_s": time.perf_counter() - t, **_now}
    out.mkdir(parents=True, exist_ok=True)
    with open(out / f"{worker}.jsonl", "a") as f:
        f.write(json.dumps(record) + "\n")


def summarize(directory: Path) -> str:
    records = [
        json.loads(line)
        for f in sorted(directory.glob("*.jsonl"))
        for line in f.read_text().splitlines()
    ]
    by_file: dict[str, collections.Counter] = collections.defaultdict(collections.Counter)
    by_worker: collections.Counter = collections.Counter()
    for r in records:
        by_file[r["test"].split("::")[0]].update(
            {k: r.get(k, 0) for k in ("wall_s", "compile_s", "trace_s", "lower_s", "compiles")}
        )
        by_file[r["test"].split("::")[0]]["tests"] += 1
        by_worker[r["worker"]] += r["wall_s"]
    total = collections.Counter()
    for c in by_file.values():
        total.update(c)
    lines = [
        "| file | tests | wall s | compile s | trace + lower s | compiles |",
        "|---|---|---|---|---|---|",
    ]
    for name, c in sorted(by_file.items(), key=lambda kv: -kv[1]["wall_s"]):
        lines.append(
            f"| {name} | {c['tests']} | {c['wall_s']:.0f} | {c['compile_s']:.0f} | "
            f"{c['trace_s'] + c['lower_s']:.0f} | {c['compiles']} |"
        )
    lines.append(
        f"| **all** | {total['tests']} | {total['wall_s']:.0f} | {total['compile_s']:.0f} | "
        f"{total['trace_s'] + total['lower_s']:.0f} | {total['compiles']} |"
    )
    lines.append("")
    workers = ", ".join(f"{w} {s:.0f}" for w, s in sorted(by_worker.items()))
    lines.append(f"Per worker (s): {workers}")
    slowest = sorted(records, key=lambda r: -r["wall_s"])[:15]
    lines += ["", "| slowest tests | wall s | compile s |", "|---|---|---|"]
    lines += [f"| {r['test']} | {r['wall_s']:.0f} | {r.get('compile_s', 0):.0f} |" for r in slowest]
    return "\n".join(lines)


if __name__ == "__main__":
    print(summarize(Path(sys.argv[1] if len(sys.argv) > 1 else "suite-profile")))
