"""Servers in subprocesses (`start_server`; `running`: several, in order, `halves`), a streamed chat
load at a fixed concurrency (`drive`: per request its time to first token, inter-token
latency per token, not per chunk, tokens/s; `summarize`: medians, 90th percentiles, the
pass's tokens/s), and what a pass cost a server (`metered`: its /metrics' growth)."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator

import numpy as np


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start_server(
    ckpt, batch: int, mode: str, max_tokens: int, *extra: str, log=None, name="m", cwd=None,
    shared_guesses: bool = True,
):  # fmt: skip
    """(process, url) of `python -m lookahead_jax.serve` up and healthy: ckpt None for the
    bundled model; mode "plain", "auto" or a --lookahead value; extra: more of its flags;
    log: a file name for its stderr, in the temporary directory (None: this process's);
    name: the model's name in requests; cwd: a source tree to run it from (an earlier
    version's lookahead_jax: `python -m` finds the package there first); shared_guesses
    False: `--no-shared-guesses` (a load that asks its prompts again measures recall with
    them on: load_levels.py)."""
    import httpx

    port = free_port()
    flags = ["--no-lookahead"] if mode == "plain" else ["--lookahead", mode]
    cmd = [sys.executable, "-m", "lookahead_jax.serve", "--port", str(port),
           "--batch", str(batch), "--max-new-tokens", str(max_tokens), "--model-name", name,
           "--log-level", "warning", *flags, *extra]  # fmt: skip
    cmd += [] if shared_guesses else ["--no-shared-guesses"]
    if ckpt is not None:
        cmd += ["--ckpt", str(ckpt)]
    if log is not None:
        log = os.path.join(tempfile.gettempdir(), log)
    stderr = None if log is None else open(log, "w")  # noqa: SIM115 (the server's, until it ends)
    proc = subprocess.Popen(cmd, env=dict(os.environ, HF_HUB_OFFLINE="1"), stderr=stderr, cwd=cwd)
    url = f"http://127.0.0.1:{port}"
    deadline = time.time() + 1800  # auto may measure its cost curve first
    while time.time() < deadline:
        if proc.poll() is not None:
            raise SystemExit(
                f"the server exited with {proc.returncode}" + (f": see {log}" if log else "")
            )
        try:
            if httpx.get(f"{url}/health", timeout=1).status_code == 200:
                return proc, url
        except httpx.HTTPError:
            time.sleep(0.5)
    proc.kill()
    raise SystemExit("the server did not come up")


def halves(order: list, repeats: int) -> list[tuple[list, range]]:
    """`repeats` passes in two halves, the servers started in `order`, then reversed."""
    n = (repeats + 1) // 2
    return [(o, r) for o, r in ((order, range(n)), (order[::-1], range(n, repeats))) if r]


@contextlib.contextmanager
def running(starts: list[tuple[tuple, dict]]) -> Iterator[list[tuple[subprocess.Popen, str]]]:
    """[(process, url)] of servers started in this order (`start_server(*args, **kwargs)`
    each), stopped on leaving (killed after 120 s). The first of two plain servers read
    0.94x the second: load_aiperf and load_levels start each first as often (`halves`)."""
    procs: list[tuple[subprocess.Popen, str]] = []
    try:
        for args, kwargs in starts:
            procs.append(start_server(*args, **kwargs))
        yield procs
    finally:
        for proc, _ in procs:
            proc.send_signal(signal.SIGTERM)
        for proc, _ in procs:
            with contextlib.suppress(subprocess.TimeoutExpired):
                proc.wait(timeout=120)
            proc.kill()  # (a no-op once it exited)


async def one(
    client, url: str, prompt: str | list[dict], max_tokens: int, temperature: float = 0.0, seed=None
) -> dict:
    """One streamed chat completion of `prompt` (the user turn, or the messages)."""
    messages = [{"role": "user", "content": prompt}] if isinstance(prompt, str) else prompt
    body = {"model": "m", "messages": messages,
            "max_tokens": max_tokens, "temperature": temperature, "stream": True,
            "stream_options": {"include_usage": True}}  # fmt: skip
    if seed is not None:
        body["seed"] = seed
    t0 = time.perf_counter()
    first = last = None
    tokens, text = 0, []
    async with client.stream("POST", f"{url}/v1/chat/completions", json=body) as r:
        r.raise_for_status()
        async for line in r.aiter_lines():
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            chunk = json.loads(line[6:])
            if chunk.get("usage"):
                tokens = chunk["usage"]["completion_tokens"]
            for choice in chunk.get("choices", []):
                if choice["delta"].get("content"):
                    first = first or time.perf_counter()
                    last = time.perf_counter()
                    text.append(choice["delta"]["content"])
    end = last or time.perf_counter()
    return {
        "ttft_s": (first or end) - t0,
        "itl_s": (end - first) / (tokens - 1) if first and tokens > 1 else None,
        "tokens": tokens,
        "tokens_per_s": tokens / (end - t0) if end > t0 else 0.0,
        "text": "".join(text),
    }


async def drive(
    url: str, prompts: list, concurrency: int, max_tokens: int, temperatures=None
) -> dict:
    """Every prompt once, `concurrency` at a time; temperatures: each prompt's (default
    greedy), a sampled one seeded by its index."""
    import httpx

    gate = asyncio.Semaphore(concurrency)
    temperatures = temperatures or [0.0] * len(prompts)
    async with httpx.AsyncClient(timeout=None) as client:

        async def bounded(i, p):
            async with gate:
                t = temperatures[i]
                return await one(client, url, p, max_tokens, t, i if t > 0 else None)

        t0 = time.perf_counter()
        rows = await asyncio.gather(*(bounded(i, p) for i, p in enumerate(prompts)))
        wall = time.perf_counter() - t0
    return {"wall_s": wall, "requests": rows}


def summarize(run: dict) -> dict:
    rows = run["requests"]

    def pct(xs, q):  # (None: a request of one token has no inter-token latency)
        xs = [x for x in xs if x is not None]
        return float(np.percentile(xs, q)) if xs else float("nan")

    tokens = sum(r["tokens"] for r in rows)
    return {
        "requests": len(rows),
        "tokens": tokens,
        "wall_s": run["wall_s"],
        "total_tokens_per_s": tokens / run["wall_s"],
        "ttft_s": {
            "median": pct([r["ttft_s"] for r in rows], 50),
            "p90": pct([r["ttft_s"] for r in rows], 90),
        },  # fmt: skip
        "itl_ms": {
            "median": 1000 * pct([r["itl_s"] for r in rows], 50),
            "p90": 1000 * pct([r["itl_s"] for r in rows], 90),
        },  # fmt: skip
        "request_tokens_per_s": {
            "median": pct([r["tokens_per_s"] for r in rows], 50),
            "p10": pct([r["tokens_per_s"] for r in rows], 10),
        },  # fmt: skip
    }


# /metrics a pass's time is read from (their growth over it): compiling, the engine's
# prefills (inserts and chunks with them) and decode rounds, positions prefilled, rounds
SPENT = (
    "lookahead_compile_seconds ",
    "lookahead_prefill_seconds ",
    "lookahead_decode_seconds ",
    "lookahead_prefill_positions ",
    "lookahead_rounds{",
)
SPENT_NAMES = ("compile_s", "prefill_s", "decode_s", "prefill_positions", "rounds")


def metered(url: str, run, *args) -> tuple:
    """(run(*args), what grew in the server's SPENT /metrics meanwhile: spent_between)."""
    before = server_metrics(url, *SPENT)
    out = run(*args)
    return out, spent_between(before, server_metrics(url, *SPENT))


def spent_between(before: dict, after: dict) -> dict:
    """What grew between two reads of SPENT, by name (the rounds summed over buckets)."""

    def grew(prefix: str) -> float:
        keys = [k for k in after if k.startswith(prefix.strip())]
        return sum(after[k] - before.get(k, 0.0) for k in keys)

    return {name: round(grew(p), 2) for name, p in zip(SPENT_NAMES, SPENT, strict=True)}


def server_metrics(url: str, *prefixes: str) -> dict:
    """{labels: value} of the server's /metrics lines that start with `prefixes`."""
    import httpx

    text = httpx.get(f"{url}/metrics", timeout=10).text
    rows = {}
    for line in text.splitlines():
        if line.startswith(prefixes):
            labels, value = line.rsplit(" ", 1)
            rows[labels] = float(value)
    return rows
