"""A long prompt arriving while streams decode (issue 48): the server prefilling it in one
piece (`--prefill-chunk 0`) against in chunks between decode rounds (`auto`).

    python scripts/bench/chunked_prefill.py --out benchmarks/cpu/chunked_prefill

Eight streamed chat requests (MT-bench writing and roleplay first turns, greedy) decode;
once each has had 12 chunks, a ~2,000-token prompt arrives (MT-bench questions to summarize,
at most 8 new tokens). Per server: the eight streams' gaps between stream chunks (a
chunk: the tokens of `--stream-steps` steps) before the long prompt arrived, and from its
arrival until its first token: median before, p99 and max after, and the long prompt's
time to first token. Each server runs the scenario three times and the third is
measured: the first two compile the programs of its shapes (the streams' prompts come
from the prefix cache from the second on, as they do in the third). The long prompt
differs in its first block each time, so it is never found in the cache.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import signal
import sys
import time
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

from serve_bench import start_server  # noqa: E402

STREAMS = 8
STEADY_CHUNKS = 12  # the long prompt arrives once every stream has had this many chunks


async def stream(client, url: str, messages, max_tokens: int, arrivals=None) -> dict:
    """A streamed chat completion: the arrival time of each chunk with text (appended to
    `arrivals` as they come, if given)."""
    body = {"model": "m", "messages": messages, "max_tokens": max_tokens, "temperature": 0,
            "stream": True}  # fmt: skip
    sent, arrivals = time.perf_counter(), [] if arrivals is None else arrivals
    async with client.stream("POST", f"{url}/v1/chat/completions", json=body) as r:
        r.raise_for_status()
        async for line in r.aiter_lines():
            if line.startswith("data: ") and line != "data: [DONE]":
                chunk = json.loads(line[6:])
                if any(c["delta"].get("content") for c in chunk.get("choices", [])):
                    arrivals.append(time.perf_counter())
    return {"sent": sent, "arrivals": arrivals}


async def scenario(url: str, questions: list[str], long_prompt: str, max_tokens: int) -> dict:
    import httpx

    async with httpx.AsyncClient(timeout=None) as client:
        user = lambda text: [{"role": "user", "content": text}]  # noqa: E731
        seen: list[list[float]] = [[] for _ in questions]
        streams = [
            asyncio.create_task(stream(client, url, user(q), max_tokens, times))
            for q, times in zip(questions, seen, strict=True)
        ]
        while min(map(len, seen)) < STEADY_CHUNKS:  # every stream decoding steadily
            await asyncio.sleep(0.05)
        long_run = await stream(client, url, user(long_prompt), 8)
        runs = await asyncio.gather(*streams)
    arrive, first = long_run["sent"], long_run["arrivals"][0]
    before, after = [], []
    for run in runs:
        for a, b in zip(run["arrivals"], run["arrivals"][1:], strict=False):
            if b <= arrive:
                before.append(b - a)
            elif a < first:
                after.append(b - a)
    return {
        "long_ttft_s": first - arrive,
        "gaps_before_s": before,
        "gaps_after_s": after,
        "median_before_ms": 1000 * float(np.median(before)),
        "p99_after_ms": 1000 * float(np.percentile(after, 99)) if after else None,
        "max_after_ms": 1000 * float(max(after)) if after else None,
        "streams_alive_at_first_token": sum(r["arrivals"][-1] > first for r in runs),
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--ckpt", default="smollm2-135m")
    ap.add_argument("--mode", default="plain", help="the server's --lookahead (plain: none)")
    ap.add_argument("--max-tokens", type=int, default=512)
    ap.add_argument("--long-tokens", type=int, default=2000)
    ap.add_argument("--out", default="benchmarks/cpu/chunked_prefill")
    args = ap.parse_args()

    from machine import run_header
    from prompts import mt_bench
    from results import write_results

    import lookahead_jax as lj

    rows = mt_bench()
    questions = [r["prompt"] for r in rows if r["category"] in ("writing", "roleplay")][:STREAMS]
    tokenizer = lj.load(args.ckpt).tokenizer
    long_prompt = "Summarize the questions below in one sentence.\n"
    for r in rows:
        if len(tokenizer.encode(long_prompt)) >= args.long_tokens:
            break
        long_prompt += r["prompt"] + "\n"
    result = {
        **run_header(),
        "ckpt": args.ckpt,
        "mode": args.mode,
        "long_prompt_tokens": len(tokenizer.encode(long_prompt)),
    }
    for label, chunk in (("whole", "0"), ("chunked", "auto")):
        proc, url = start_server(
            args.ckpt, 16, args.mode, args.max_tokens, "--prefill-chunk", chunk,
            "--max-prompt-tokens", "2048",
        )  # fmt: skip
        try:
            for run in range(3):  # two warm-ups, then measured; the long prompt differs
                # in its first block each time, so it never comes from the prefix cache
                prompt = f"Run {run}. " + long_prompt
                result[label] = asyncio.run(scenario(url, questions, prompt, args.max_tokens))
        finally:
            proc.send_signal(signal.SIGTERM)
            proc.wait(timeout=120)
        r = result[label]
        print(label, {k: v for k, v in r.items() if not k.startswith("gaps")}, flush=True)
    lines = [
        "# A long prompt arriving while streams decode (issue 48)",
        "",
        f"CPU: {result['cpu']} ({result['cores']} cores), JAX {result['jax']}, "
        f"{result['ckpt']} float32, server `--batch 16 --lookahead {args.mode}`, {STREAMS} "
        f"streamed chats decoding (greedy, up to {args.max_tokens} tokens); once each has "
        f"had {STEADY_CHUNKS} chunks, a {result['long_prompt_tokens']}-token prompt arrives. Gaps "
        "between stream chunks (4 decode steps each) of the eight streams: before it "
        "arrived, and from its arrival to its first token. The third of three runs (the "
        "first two compile).",
        "",
        f"Command: `{result['command']}`",
        "",
        "| prefill | gap median before, ms | gap p99 after, ms | p99 after / median before "
        "| gap max after, ms | long prompt's TTFT, s |",
        "|---|---|---|---|---|---|",
    ]
    for label in ("whole", "chunked"):
        r = result[label]
        lines.append(
            f"| {label} | {r['median_before_ms']:.0f} | {r['p99_after_ms']:.0f} | "
            f"**{r['p99_after_ms'] / r['median_before_ms']:.2f}x** | {r['max_after_ms']:.0f} | "
            f"{r['long_ttft_s']:.1f} |"
        )
    write_results(args.out, result, "\n".join(lines) + "\n")


if __name__ == "__main__":
    main()
