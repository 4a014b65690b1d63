"""One server size at every load: `python -m lookahead_jax.serve --batch 16` (and
`--batch 1` for a lone request's rate), plain decoding against `--lookahead auto`, at
concurrency 1, 4 and 16, streamed chat completions of the code prompts — all greedy, and
a mix with every other request sampled at temperature 1.0 (seeded).

    python scripts/bench/load_levels.py --out benchmarks/cpu/load_levels

Each (server, workload, concurrency) pass sends `--requests` requests (default: 8 at
concurrency 1, else 2x the concurrency, cycling through the prompts), after a warm-up
pass of every prompt with max_tokens `--warm-tokens` (8) at each concurrency: most
prefill shapes and row buckets the passes use have their programs compiled, and auto has
opened each bucket (three one-step lookahead probes: ~3 s at 16 rows on a 2-core CPU),
before anything is timed — a server's start-up, not its pace. A pass in which the server
still compiled (its /metrics `lookahead_compile_seconds` grew by more than COMPILE_S:
a burst's admissions group otherwise than the warm-up's) is run again, up to TRIES times
in all; each row records its tries and the last try's compile seconds. The servers run
with `--no-shared-guesses` unless `--shared-guesses` is given: 20 prompts cycle through
the passes and their tries, and a prompt asked again would be a recall of its earlier
answer (benchmarks/cpu/shared_guesses.md), not lookahead on a new one (with them on, a
retried pass measures recall: load_levels_epyc_zen4_s79_shared_repeats.md). A lone
request's rate is also measured on a `--batch 16 --row-buckets off` plain server (every
round steps all rows: the engine before row buckets). Reported per pass: total output
tokens/s (completion tokens / the pass's wall time), the median request's tokens/s, TTFT
median; auto over plain side by side; greedy answers compared between plain and auto
(identical when exact). The server's own per-round choices (row buckets
and lookahead or plain rounds) are read from its `--batch 16` auto process at the end
of its passes, through /metrics.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import signal
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

from server_load import drive, start_server, summarize  # noqa: E402

WORKLOADS = ("greedy", "mix t=1.0")
COMPILE_S, TRIES = 0.5, 3  # a pass compiling longer than COMPILE_S runs again (docstring)


def passes(
    url: str, prompts: list[str], levels: list[int], max_tokens: int, requests: int, warm: int
):
    """{(workload, concurrency): (summary, texts)} on one running server."""
    out = {}
    for c in levels:  # warm-up: every prompt's prefill shape, each row bucket's rounds
        asyncio.run(drive(url, prompts, c, warm))
    for workload in WORKLOADS:
        for c in levels:
            n = requests or (8 if c == 1 else 2 * c)
            batch = [prompts[i % len(prompts)] for i in range(n)]
            temps = [1.0 if workload != "greedy" and i % 2 else 0.0 for i in range(n)]
            tries, compiled = 0, COMPILE_S + 1
            while compiled > COMPILE_S and tries < TRIES:
                before = server_metrics(url, "lookahead_compile_seconds ")
                run = asyncio.run(drive(url, batch, c, max_tokens, temps))
                after = server_metrics(url, "lookahead_compile_seconds ")
                compiled, tries = sum(after.values()) - sum(before.values()), tries + 1
            answers = zip(run["requests"], temps, strict=True)
            texts = [r["text"] if t == 0 else None for r, t in answers]
            summary = {**summarize(run), "tries": tries, "compile_s": round(compiled, 2)}
            out[(workload, c)] = (summary, texts)
            print(workload, c, json.dumps(summary), flush=True)
    return out


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


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--ckpt", default="smollm2-135m")
    ap.add_argument("--levels", default="1,4,16")
    ap.add_argument("--batch", type=int, default=16)
    ap.add_argument("--max-tokens", type=int, default=64)
    ap.add_argument("--requests", type=int, default=0, help="per pass (0: by concurrency)")
    ap.add_argument("--warm-tokens", type=int, default=8, help="max_tokens of the warm-up")
    ap.add_argument(
        "--shared-guesses", action="store_true", help="keep the servers' shared guesses on"
    )
    ap.add_argument("--out", default="benchmarks/cpu/load_levels")
    args = ap.parse_args()

    from machine import run_header
    from prompts import code
    from results import write_results

    prompts = [r["prompt"] for r in code()]
    levels = [int(c) for c in args.levels.split(",")]
    result = {**run_header(), "ckpt": args.ckpt, "max_tokens": args.max_tokens, "rows": []}
    result["shared_guesses"] = args.shared_guesses
    got, rounds = {}, {}
    servers = [(args.batch, "plain"), (args.batch, "auto"), (1, "plain"), (1, "auto")]
    servers.append((args.batch, "plain, --row-buckets off"))  # every round steps all rows
    for batch, mode in servers:
        lv = levels if batch == args.batch and "off" not in mode else [1]
        flags = ["--row-buckets", "off"] if "off" in mode else []
        proc, url = start_server(
            args.ckpt, batch, mode.split(",")[0], args.max_tokens, *flags,
            shared_guesses=args.shared_guesses,
        )  # fmt: skip
        try:
            got[(batch, mode)] = passes(
                url, prompts, lv, args.max_tokens, args.requests, args.warm_tokens
            )
            # its rounds by row bucket, auto's rounds and rates by mode
            rounds[(batch, mode)] = server_metrics(url, "lookahead_rounds{", "lookahead_auto_")
        finally:
            proc.send_signal(signal.SIGTERM)
            proc.wait(timeout=120)
        for (workload, c), (summary, _) in got[(batch, mode)].items():
            row = {"batch": batch, "mode": mode, "workload": workload, "concurrency": c}
            result["rows"].append({**row, "summary": summary})
        Path(args.out).with_suffix(".partial.json").write_text(json.dumps(result, default=str))
    result["server_rounds"] = {f"--batch {b} {m}": r for (b, m), r in rounds.items()}
    same = total = 0
    for key, (_, texts) in got[(args.batch, "auto")].items():
        for a, b in zip(got[(args.batch, "plain")][key][1], texts, strict=True):
            if a is not None:
                same, total = same + (a == b), total + 1
    result["greedy_same"] = f"{same}/{total}"
    B = args.batch
    lines = [
        f"# One server at every load: --batch {B}, plain against auto",
        "",
        f"CPU: {result['cpu']} ({result['cores']} cores), JAX {result['jax']}, {args.ckpt} "
        f"float32; the 20 code prompts as chats, streamed, at most {args.max_tokens} tokens; "
        f"shared guesses {'on' if args.shared_guesses else 'off'}.",
        "",
        f"Command: `{result['command']}`",
        "",
        "| workload | concurrency | plain tokens/s | auto tokens/s | auto / plain | "
        "TTFT median plain, auto (s) | tries (compile s) plain, auto |",
        "|---|---|---|---|---|---|---|",
    ]
    for (workload, c), (s_auto, _) in got[(B, "auto")].items():
        s_plain = got[(B, "plain")][(workload, c)][0]
        ratio = s_auto["total_tokens_per_s"] / s_plain["total_tokens_per_s"]
        lines.append(
            f"| {workload} | {c} | {s_plain['total_tokens_per_s']:.1f} | "
            f"{s_auto['total_tokens_per_s']:.1f} | **{ratio:.2f}x** | "
            f"{s_plain['ttft_s']['median']:.2f}, {s_auto['ttft_s']['median']:.2f} | "
            f"{s_plain['tries']} ({s_plain['compile_s']}), "
            f"{s_auto['tries']} ({s_auto['compile_s']}) |"
        )
    lines += ["", "A lone request (concurrency 1, greedy) against a `--batch 1` server:", ""]
    lines += [f"| mode | --batch 1 tokens/s | --batch {B} tokens/s | {B} / 1 |"]
    lines += ["|---|---|---|---|"]
    for mode, big_mode in (("plain", "plain"), ("plain", "plain, --row-buckets off"),
                           ("auto", "auto")):  # fmt: skip
        if ("greedy", 1) not in got[(B, big_mode)]:  # (--levels without 1)
            continue
        one = got[(1, mode)][("greedy", 1)][0]["total_tokens_per_s"]
        big = got[(B, big_mode)][("greedy", 1)][0]["total_tokens_per_s"]
        lines.append(f"| {big_mode} | {one:.1f} | {big:.1f} | **{big / one:.2f}x** |")
    lines += [
        "",
        f"Greedy answers identical between plain and auto at --batch {B}: {result['greedy_same']}.",
        "",
        f"Rounds of the --batch {B} auto server by row bucket and mode (its /metrics): "
        f"`{json.dumps(result['server_rounds'][f'--batch {B} auto'])}`",
    ]
    write_results(args.out, result, "\n".join(lines) + "\n")


if __name__ == "__main__":
    main()
