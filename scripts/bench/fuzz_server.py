"""The HTTP server against schemathesis (issue 47): requests generated from the OpenAPI
schema the server serves, every endpoint, checked for server errors (5xx); then
--streams streamed requests at concurrency 16 of which every tenth client disconnects
after its first chunk (the server's memory after the first tenth and at the end); then
the slots and the queue must be empty and the server must still answer exactly.

    python scripts/bench/fuzz_server.py --max-examples 1000 --out benchmarks/cpu/fuzz_server

Every generated body is sent for the served model (a schemathesis hook sets `model`; a
random name is only ever a 404). Exact afterwards: a few greedy completions asked before
and after the run give the same text, and it is a lone plain decode's (lj.generate).
"""

from __future__ import annotations

import argparse
import asyncio
import os
import re
import signal
import subprocess
import sys
import tempfile
from pathlib import Path

import httpx

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

from machine import cpu_model  # noqa: E402
from results import write_results  # noqa: E402
from server_load import start_server  # noqa: E402

HOOKS = """import schemathesis


@schemathesis.hook
def map_body(ctx, body):
    if isinstance(body, dict):
        body["model"] = "m"
    return body
"""
PROMPTS = ["The capital of France is", "def add(a, b):", "1, 2, 3,"]


def answers(url: str, max_tokens: int) -> list[str]:
    body = {"model": "m", "prompt": PROMPTS, "max_tokens": max_tokens, "temperature": 0}
    r = httpx.post(f"{url}/v1/completions", json=body, timeout=300)
    r.raise_for_status()
    return [c["text"] for c in r.json()["choices"]]


def metrics(url: str) -> dict[str, float]:
    """The server's Prometheus samples, by name with labels."""
    out = {}
    for line in httpx.get(f"{url}/metrics").text.splitlines():
        if line and not line.startswith("#"):
            name, value = line.rsplit(" ", 1)
            out[name] = float(value)
    return out


def rss_mb(pid: int) -> float:
    """A process's resident memory (Linux: /proc/PID/status)."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return float("nan")


async def streams(url: str, n: int, pid: int, concurrency: int = 16) -> dict:
    """n streamed completions; client i % 10 == 9 goes away after its first chunk."""
    gate, memory = asyncio.Semaphore(concurrency), {}

    async def one(client, i: int) -> None:
        body = {"model": "m", "prompt": PROMPTS[i % len(PROMPTS)], "max_tokens": 16,
                "temperature": 0.7, "seed": i, "stream": True}  # fmt: skip
        async with gate, client.stream("POST", f"{url}/v1/completions", json=body) as r:
            async for line in r.aiter_lines():
                if line.startswith("data: ") and i % 10 == 9:
                    break  # leaving the block closes the connection mid-stream
        if i + 1 == n // 10:
            memory["after_first_tenth_mb"] = rss_mb(pid)

    async with httpx.AsyncClient(timeout=300) as client:
        await asyncio.gather(*(one(client, i) for i in range(n)))
    await asyncio.sleep(2)  # the server's next rounds see the last disconnects
    return {**memory, "at_the_end_mb": rss_mb(pid)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--ckpt", default="smollm2-135m")
    ap.add_argument("--lookahead", default="tokens=8")
    ap.add_argument("--max-examples", type=int, default=1000)
    ap.add_argument("--max-tokens", type=int, default=16)
    ap.add_argument("--streams", type=int, default=1000)
    ap.add_argument("--out", default="benchmarks/fuzz_server")
    args = ap.parse_args()
    proc, url = start_server(args.ckpt, 4, args.lookahead, args.max_tokens)
    try:
        before = answers(url, args.max_tokens)
        with tempfile.TemporaryDirectory() as hooks:
            Path(hooks, "fuzz_hooks.py").write_text(HOOKS)
            env = dict(os.environ, SCHEMATHESIS_HOOKS="fuzz_hooks", PYTHONPATH=hooks)
            st = [str(Path(sys.executable).with_name("st")), "run", f"{url}/openapi.json",
                  "--checks", "not_a_server_error", "--max-examples", str(args.max_examples),
                  "--generation-deterministic"]  # fmt: skip
            run = subprocess.run(st, env=env, capture_output=True, text=True)
        print(run.stdout[-3000:])
        memory = asyncio.run(streams(url, args.streams, proc.pid))
        after = answers(url, args.max_tokens)
        seen = metrics(url)
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.wait(timeout=120)
    import lookahead_jax as lj

    model = lj.load(args.ckpt)
    plain = lj.generate(model, PROMPTS, max_new_tokens=args.max_tokens, lookahead=None).texts
    generated = re.search(r"(\d+) generated", run.stdout)
    statuses: dict[str, float] = {}  # summed over the endpoints
    for k, count in seen.items():
        if k.startswith("lookahead_requests_total{"):
            status = k.split('status="')[1].rstrip('"}')
            statuses[status] = statuses.get(status, 0) + count
    result = {
        "command": " ".join([Path(sys.argv[0]).name, *sys.argv[1:]]),
        "cpu": cpu_model(),
        "schemathesis_exit": run.returncode,
        "generated": int(generated.group(1)) if generated else None,
        "responses_by_status": statuses,
        "server_errors": sum(v for k, v in statuses.items() if k.startswith("5")),
        "streams": args.streams,
        "streams_disconnected": args.streams // 10,
        "server_memory": memory,
        "slots_in_use_after": seen.get("lookahead_slots_in_use"),
        "queue_after": seen.get("lookahead_queue_length"),
        "same_answers_before_and_after": before == after,
        "answers_equal_plain_decoding": after == plain,
    }
    rows = "\n".join(f"| {k} | {v} |" for k, v in result.items() if k != "command")
    md = (
        f"# The server under schemathesis\n\n`python scripts/bench/{result['command']}`\n\n"
        f"| | |\n|---|---|\n{rows}\n"
    )
    write_results(args.out, result, md)


if __name__ == "__main__":
    main()
