"""The prefix cache under the traffic it is for (issue 48): the server with and without it
(`--prefix-cache-mb 0`), the same requests, side by side.

    python scripts/bench/prefix_cache.py --out benchmarks/cpu/prefix_cache

Workloads, each a pass of streamed chat completions at concurrency 16 (greedy):

    shared_system  16 MT-bench first turns, each after the same ~500-token system prompt
    multi_turn     16 MT-bench second turns: [question 1, the server's answer, question 2]
                   (the first turns are sent first, unmeasured; their answers come from
                   the server being measured, so both servers see the same prompts only
                   if their answers agree, which the report checks)
    asked_twice    16 MT-bench first turns, then the same 16 again: the second pass measured

Before each measured pass, two warm-up passes of the same kind with other content (the
system prompt's sentences in other orders, other questions), so that the programs of
the prompt and suffix buckets are compiled and the cache holds nothing of the measured
prompts; the seconds still spent compiling during a measured pass (a shape the warm-ups
did not meet) are reported beside its TTFT. Per pass: time to first token (median, p90),
the pass's wall time, the prompt tokens the cache supplied (the server's /metrics) and
whether every answer equals the other server's (tokens identical to cold decodes: a
greedy text match).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import time
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

from server_load import drive, running  # noqa: E402

CONCURRENCY = 16

# ~500 tokens of a deployment's system prompt (SmolLM2's tokenizer: see the report)
SYSTEM = " ".join(
    [
        "You are Atlas, the support assistant of Northwind Outfitters, an online store that "
        "sells outdoor clothing, camping equipment and climbing gear in twelve countries.",
        "Answer in the language of the customer's last message. Be friendly, precise and "
        "brief: two short paragraphs at most unless the customer asks for detail.",
        "Never invent order numbers, tracking codes, prices or delivery dates. When you do "
        "not know something, say so and offer to connect the customer with a human agent.",
        "Orders ship from our warehouses in Rotterdam, Denver and Melbourne. Standard "
        "delivery takes three to seven working days; express delivery takes one to two "
        "working days and costs twelve euros, fifteen dollars or twenty Australian dollars.",
        "Customers may return unused items within sixty days of delivery for a full refund. "
        "Worn items may be returned within thirty days if they are defective. Sale items "
        "can be exchanged but not refunded. Refunds reach the original payment method "
        "within ten working days of the return's arrival at the warehouse.",
        "Our lifetime guarantee covers tents, backpacks and sleeping bags of our own brand "
        "against manufacturing defects, not against wear, misuse or accidents. Repairs are "
        "free under the guarantee; outside it, we quote the repair before any work begins.",
        "For climbing gear (ropes, harnesses, carabiners, helmets) never give advice that "
        "could replace proper training. Remind customers that climbing equipment must be "
        "retired after a serious fall or after the number of years its maker states.",
        "Payment: we accept the major credit cards, PayPal, bank transfer in the European "
        "Union and gift cards. Gift cards never expire and cannot be exchanged for cash.",
        "Loyalty programme: members collect one point per euro or dollar spent; one hundred "
        "points give a five-unit voucher. Points expire two years after they were earned.",
        "Sizing: our jackets run small, so suggest one size up for layering. Boots follow "
        "European sizes; offer the size chart link rather than guessing a conversion.",
        "Privacy: never ask for a full card number, a password or a security code. You may "
        "ask for the order number and the email address used at checkout.",
        "Escalate to a human agent when a customer is upset, mentions an injury, asks for "
        "compensation above fifty units of their currency, or asks three times for the "
        "same thing. Tell them an agent will write within one working day.",
        "Style: plain words, no marketing language, no emoji, and end with a question only "
        "when you need information to go on.",
    ]
)
# the warm-ups': the same sentences in other orders (the same length, no shared block)
SENTENCES = SYSTEM.split(". ")
SYSTEM_WARM = (". ".join(reversed(SENTENCES)), ". ".join(SENTENCES[1:] + SENTENCES[:1]))


def metric(url: str, name: str) -> float:
    import httpx

    for line in httpx.get(f"{url}/metrics", timeout=10).text.splitlines():
        if line.startswith(name + " "):
            return float(line.split()[1])
    raise SystemExit(f"{name} not in /metrics")


def summary(run: dict) -> dict:
    ttft = [r["ttft_s"] for r in run["requests"]]
    return {
        "ttft_s": {"median": float(np.median(ttft)), "p90": float(np.percentile(ttft, 90))},
        "wall_s": run["wall_s"],
        "tokens": sum(r["tokens"] for r in run["requests"]),
    }


COUNTERS = ("lookahead_prefix_cache_hit_tokens", "lookahead_compile_seconds")


def measured(url: str, warm: list[list], prompts: list, max_tokens: int) -> dict:
    """Warm-up passes (each a list of prompts), then the pass of `prompts` measured, with
    the prompt tokens the cache supplied and the seconds spent compiling during it (a
    shape the warm-ups did not meet: its compile is in that pass's TTFT)."""
    for pass_ in warm:
        asyncio.run(drive(url, pass_, CONCURRENCY, max_tokens))
    before = [metric(url, name) for name in COUNTERS]
    run = asyncio.run(drive(url, prompts, CONCURRENCY, max_tokens))
    hit, compile_s = (metric(url, name) - b for name, b in zip(COUNTERS, before, strict=True))
    texts = [r["text"] for r in run["requests"]]
    return {**summary(run), "hit_tokens": hit, "compile_s": compile_s, "texts": texts}


def second_turns(url: str, turns: list[list[str]], max_tokens: int) -> list[list[dict]]:
    """The conversations [q1, the server's answer, q2] after sending the first turns."""
    firsts = asyncio.run(drive(url, [t[0] for t in turns], CONCURRENCY, max_tokens))
    return [
        [
            {"role": "user", "content": t[0]},
            {"role": "assistant", "content": r["text"]},
            {"role": "user", "content": t[1]},
        ]
        for t, r in zip(turns, firsts["requests"], strict=True)
    ]


def run_server(args, cache_mb: float, questions: list[dict]) -> dict:
    start = (args.ckpt, CONCURRENCY, args.mode, args.max_tokens, "--prefix-cache-mb", str(cache_mb))
    n, mt = CONCURRENCY, args.max_tokens
    firsts = [q["turns"][0] for q in questions]
    measure, warm = firsts[:n], (firsts[n : 2 * n], firsts[2 * n : 3 * n])
    with running([(start, {})]) as [(_, url)]:
        out = {}
        want = set(args.workloads.split(","))
        with_system = lambda system, qs: [  # noqa: E731
            [{"role": "system", "content": system}, {"role": "user", "content": q}] for q in qs
        ]
        if "shared_system" in want:
            warm_system = [with_system(s, qs) for s, qs in zip(SYSTEM_WARM, warm, strict=True)]
            out["shared_system"] = measured(url, warm_system, with_system(SYSTEM, measure), mt)
        if "multi_turn" in want:
            turns = [q["turns"][:2] for q in questions]
            warm_turns = [second_turns(url, turns[k * n : (k + 1) * n], mt) for k in (1, 2)]
            measure_turns = second_turns(url, turns[:n], mt)
            out["multi_turn"] = measured(url, warm_turns, measure_turns, mt)
        if "asked_twice" in want:
            for pass_ in (*warm, measure):  # each asked once; then the warm sets again,
                asyncio.run(drive(url, pass_, CONCURRENCY, mt))  # and the measured one
            out["asked_twice"] = measured(url, list(warm), measure, mt)
    return out


def report(result: dict, out: str) -> None:
    from results import write_results

    lines = [
        "# The prefix cache under shared-prefix traffic (issue 48)",
        "",
        f"CPU: {result['cpu']} ({result['cores']} cores), JAX {result['jax']}, "
        f"{result['ckpt']} float32, server `--batch {CONCURRENCY}` with `--lookahead "
        f"{result['mode']}`, {CONCURRENCY} streamed chat requests at once, greedy, at most "
        f"{result['max_tokens']} tokens; the system prompt is {result['system_tokens']} "
        "tokens. One measured pass each, after two warm-up passes of the same kind with other "
        "content.",
        "",
        f"Command: `{result['command']}`",
        "",
        "| workload | cache | TTFT s median | TTFT s p90 | pass wall s | compiling in the pass, "
        "s | prompt tokens from the cache | median TTFT on / off | answers equal to the "
        "cache-off server's |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for name in result["off"]:
        off, on = result["off"][name], result["on"][name]
        same = sum(a == b for a, b in zip(off["texts"], on["texts"], strict=True))
        ratio = on["ttft_s"]["median"] / off["ttft_s"]["median"]
        for label, row in (("off", off), (f"{result['cache_mb']:g} MB", on)):
            lines.append(
                f"| {name} | {label} | {row['ttft_s']['median']:.2f} | {row['ttft_s']['p90']:.2f} "
                f"| {row['wall_s']:.1f} | {row['compile_s']:.1f} | {row['hit_tokens']:.0f} | "
                + (f"**{ratio:.2f}x** | {same}/{len(off['texts'])} |" if label != "off" else "| |")
            )
    write_results(out, result, "\n".join(lines) + "\n")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--ckpt", default="smollm2-135m")
    ap.add_argument("--mode", default="auto", help="the server's --lookahead (plain: none)")
    ap.add_argument("--max-tokens", type=int, default=32)
    ap.add_argument("--cache-mb", type=float, default=256)
    ap.add_argument("--out", default="benchmarks/cpu/prefix_cache")
    ap.add_argument("--workloads", default="shared_system,multi_turn,asked_twice")
    args = ap.parse_args()
    unknown = set(args.workloads.split(",")) - {"shared_system", "multi_turn", "asked_twice"}
    if unknown:  # (a subset starts from another cache than the whole run's later passes)
        ap.error(f"unknown workloads: {', '.join(sorted(unknown))}")

    from machine import run_header
    from prompts import MT_BENCH

    import lookahead_jax as lj

    questions = [json.loads(line) for line in MT_BENCH.read_text().splitlines() if line.strip()]
    tokenizer = lj.load(args.ckpt).tokenizer
    result = {
        **run_header(),
        "ckpt": args.ckpt,
        "mode": args.mode,
        "max_tokens": args.max_tokens,
        "cache_mb": args.cache_mb,
        "system_tokens": len(tokenizer.encode(SYSTEM)),
    }
    for label, mb in (("off", 0), ("on", args.cache_mb)):
        t = time.perf_counter()
        result[label] = run_server(args, mb, questions)
        print(label, f"{time.perf_counter() - t:.0f} s", flush=True)
        Path(args.out).with_suffix(".partial.json").write_text(json.dumps(result))
    report(result, args.out)


if __name__ == "__main__":
    main()
