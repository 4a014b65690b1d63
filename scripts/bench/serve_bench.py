"""The HTTP server under load (issue 34): `python -m lookahead_jax.serve` in a subprocess,
driven by an asyncio + httpx load generator of our own at a fixed concurrency, plain
decoding against `--lookahead auto`; beside it, the JSONL engine (`lj.Engine.run`) on the
same prompts at the same batch.

    python scripts/bench/serve_bench.py --concurrency 1,4,16 --per-category 4 \
        --out benchmarks/cpu/serve

Every request is a streamed chat completion (the prompt as the user turn, greedy, at most
--max-tokens tokens, usage included). The server runs with --batch = the concurrency.
Before the measured pass, a warm-up pass sends every prompt with max_tokens 1 at the same
concurrency (the prefill programs of every prompt bucket and row count compile there).

Per request: time to first token (TTFT: from sending to the first chunk with text),
inter-token latency (ITL: from the first to the last chunk over completion tokens - 1,
per token, not per chunk: a lookahead step can put several tokens in one chunk), and
tokens/s (completion tokens / (last chunk - sending)). Per pass: total tokens/s (all
completion tokens / the pass's wall time). Medians and 90th percentiles over requests.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start_server(ckpt: str, batch: int, mode: str, max_tokens: int, *extra: str):
    """(process, url) of a server up and healthy; extra: more of its flags."""
    import httpx

    port = free_port()
    flags = ["--no-lookahead"] if mode == "plain" else ["--lookahead", mode]
    cmd = [sys.executable, "-m", "lookahead_jax.serve", "--ckpt", ckpt, "--port", str(port),
           "--batch", str(batch), "--max-new-tokens", str(max_tokens), "--model-name", "m",
           "--log-level", "warning", *flags, *extra]  # fmt: skip
    proc = subprocess.Popen(cmd, env=dict(os.environ, HF_HUB_OFFLINE="1"))
    url = f"http://127.0.0.1:{port}"
    deadline = time.time() + 1800  # auto may measure its cost curve first
    while time.time() < deadline:
        if proc.poll() is not None:
            raise SystemExit(f"the server exited with {proc.returncode}")
        try:
            if httpx.get(f"{url}/health", timeout=1).status_code == 200:
                return proc, url
        except httpx.HTTPError:
            time.sleep(0.5)
    proc.kill()
    raise SystemExit("the server did not come up")


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
                piece = choice["delta"].get("content")
                if piece:
                    now = time.perf_counter()
                    first = first or now
                    last = now
                    text.append(piece)
    end = last or time.perf_counter()
    return {
        "ttft_s": (first or end) - t0,
        "itl_s": (end - first) / (tokens - 1) if first and tokens > 1 else None,
        "tokens": tokens,
        "tokens_per_s": tokens / (end - t0) if end > t0 else 0.0,
        "text": "".join(text),
    }


async def drive(
    url: str, prompts: list[str], concurrency: int, max_tokens: int, temperatures=None
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


def engine_tokens_per_s(ckpt: str, prompts: list[str], batch: int, mode: str, max_tokens: int):
    """The JSONL engine (lj.Engine.run) on the same chat prompts at the same batch, in a
    process of its own (after a warm-up run of budget 1)."""
    code = f"""
import json, sys, time
import lookahead_jax as lj
model = lj.load({ckpt!r})
prompts = json.loads(sys.stdin.read())
mode = {mode!r}
named = {{"plain": None, "auto": "auto"}}
la = named[mode] if mode in named else lj.LookaheadConfig.parse(mode)
kw = dict(batch={batch}, max_new_tokens={max_tokens}, lookahead=la, chat=True)
list(lj.Engine(model, **kw).run([lj.Request(p, max_new_tokens=1) for p in prompts]))
engine = lj.Engine(model, **kw)
results = list(engine.run(prompts))
print(json.dumps({{"tokens_per_s": engine.stats.tokens_per_s,
                   "new_tokens": engine.stats.new_tokens, "wall_s": engine.stats.wall_s}}))
"""
    out = subprocess.run(
        [sys.executable, "-c", code],
        input=json.dumps(prompts),
        capture_output=True,
        text=True,
        env=dict(os.environ, HF_HUB_OFFLINE="1"),
    )
    if out.returncode != 0:
        raise SystemExit(f"the JSONL engine run failed:\n{out.stderr[-3000:]}")
    return json.loads(out.stdout.splitlines()[-1])


def summarize(run: dict) -> dict:
    rows = run["requests"]
    pct = lambda xs, q: float(np.percentile([x for x in xs if x is not None], q))  # noqa: E731
    ttft = [r["ttft_s"] for r in rows]
    itl = [r["itl_s"] for r in rows]
    tps = [r["tokens_per_s"] for r in rows]
    tokens = sum(r["tokens"] for r in rows)
    return {
        "requests": len(rows),
        "tokens": tokens,
        "wall_s": run["wall_s"],
        "total_tokens_per_s": tokens / run["wall_s"],
        "ttft_s": {"median": pct(ttft, 50), "p90": pct(ttft, 90)},
        "itl_ms": {"median": 1000 * pct(itl, 50), "p90": 1000 * pct(itl, 90)},
        "request_tokens_per_s": {"median": pct(tps, 50), "p10": pct(tps, 10)},
    }


def report(result: dict, out: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from results import write_results

    lines = [
        "# The server under load (issue 34)",
        "",
        f"CPU: {result['cpu']} ({result['cores']} cores), JAX {result['jax']}, "
        f"{result['ckpt']} float32, {result['prompts']} chat prompts ({result['sets']}), "
        f"greedy, at most {result['max_tokens']} tokens, streamed; server --batch = the "
        "concurrency. One measured pass each, after a warm-up pass.",
        "",
        f"Command: `{result['command']}`",
        "",
        "| concurrency | mode | total tokens/s | request tokens/s (median, p10) | TTFT s "
        "(median, p90) | ITL ms/token (median, p90) | JSONL engine tokens/s | server / engine |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for row in result["rows"]:
        s, e = row["summary"], row.get("engine")
        engine = "– | –"
        if e:
            engine = f"{e['tokens_per_s']:.1f} | {s['total_tokens_per_s'] / e['tokens_per_s']:.2f}x"
        lines.append(
            f"| {row['concurrency']} | {row['mode']} | {s['total_tokens_per_s']:.1f} | "
            f"{s['request_tokens_per_s']['median']:.1f}, {s['request_tokens_per_s']['p10']:.1f} | "
            f"{s['ttft_s']['median']:.2f}, {s['ttft_s']['p90']:.2f} | "
            f"{s['itl_ms']['median']:.1f}, {s['itl_ms']['p90']:.1f} | " + engine + " |"
        )
    same = result.get("same_text")
    if same:
        lines += ["", f"Greedy answers identical between plain and auto: {same}."]
    write_results(out, result, "\n".join(lines) + "\n")
    fig, ax = plt.subplots(1, 2, figsize=(10, 4))
    for mode in dict.fromkeys(r["mode"] for r in result["rows"]):
        rows = [r for r in result["rows"] if r["mode"] == mode]
        cs = [r["concurrency"] for r in rows]
        ax[0].plot(cs, [r["summary"]["total_tokens_per_s"] for r in rows], "o-", label=mode)
        ax[1].plot(cs, [r["summary"]["request_tokens_per_s"]["median"] for r in rows], "o-",
                   label=mode)  # fmt: skip
    for a, title in zip(ax, ("total tokens/s", "per-request tokens/s (median)"), strict=True):
        a.set_xscale("log", base=2)
        a.set_xlabel("concurrency")
        a.set_title(title)
        a.legend()
    fig.suptitle(f"{result['ckpt']}, {result['cpu']}", fontsize=9)
    fig.tight_layout()
    fig.savefig(Path(out).with_name(Path(out).name + ".png"), dpi=110)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--ckpt", default="smollm2-135m")
    ap.add_argument("--concurrency", default="1,4,16")
    ap.add_argument(
        "--modes", default="plain,auto", help="plain, auto or tokens=T, comma-separated"
    )
    ap.add_argument("--sets", default="mt_bench,code")
    ap.add_argument("--per-category", type=int, default=4, help="0: every prompt")
    ap.add_argument("--max-tokens", type=int, default=256)
    ap.add_argument("--engine-at", default="16", help="concurrencies to run the JSONL engine at")
    ap.add_argument("--out", default="benchmarks/cpu/serve")
    ap.add_argument(
        "--rows-from",
        default=None,
        metavar="ROWS.jsonl",
        help="rows an earlier run of the same command printed (one JSON a line), reported "
        "before this run's (a run cut short, finished with the concurrencies it lacked)",
    )
    args = ap.parse_args()

    from machine import run_header
    from prompts import select

    rows_ = select(args.sets.split(","), args.per_category)
    prompts = [r["prompt"] for r in rows_]
    result = {
        **run_header(),
        "ckpt": args.ckpt,
        "prompts": len(prompts),
        "sets": ", ".join(f"{s} {sum(r['set'] == s for r in rows_)}" for s in args.sets.split(",")),
        "max_tokens": args.max_tokens,
        "rows": [],
    }
    if args.rows_from:
        lines = Path(args.rows_from).read_text().splitlines()
        result["rows"] = [json.loads(line) for line in lines if line.strip()]
        result["rows_from"] = args.rows_from
    texts = {}
    engine_at = {int(c) for c in args.engine_at.split(",") if c}
    for c in map(int, args.concurrency.split(",")):
        for mode in args.modes.split(","):
            proc, url = start_server(args.ckpt, c, mode, args.max_tokens)
            try:
                asyncio.run(drive(url, prompts, c, 1))  # warm-up
                run = asyncio.run(drive(url, prompts, c, args.max_tokens))
            finally:
                proc.send_signal(signal.SIGTERM)
                proc.wait(timeout=120)
            row = {"concurrency": c, "mode": mode, "summary": summarize(run), "run": run}
            texts[(c, mode)] = [r["text"] for r in run["requests"]]
            if c in engine_at:
                row["engine"] = engine_tokens_per_s(args.ckpt, prompts, c, mode, args.max_tokens)
            result["rows"].append(row)
            print(json.dumps({k: v for k, v in row.items() if k != "run"}), flush=True)
            Path(args.out).with_suffix(".partial.json").write_text(json.dumps(result))
    pairs = [(c, m) for c, m in texts if m != "plain" and (c, "plain") in texts]
    if pairs:
        same = sum(
            a == b
            for c, m in pairs
            for a, b in zip(texts[(c, "plain")], texts[(c, m)], strict=True)
        )
        result["same_text"] = f"{same}/{len(pairs) * len(prompts)}"
    report(result, args.out)


if __name__ == "__main__":
    main()
