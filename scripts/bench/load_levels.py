"""One server size at every load: `python -m lookahead_jax.serve --batch 16` (and
`--batch 1` for a lone request's rate), plain decoding against `--lookahead auto`, at
concurrency 1, 4 and 16, streamed chat completions of the code prompts — all greedy, and
a mix with every other request sampled at temperature 1.0 (seeded).

    python scripts/bench/load_levels.py --out benchmarks/cpu/load_levels

The two `--batch 16` servers run side by side (both up, one driven at a time): after a
warm-up pass of every prompt with max_tokens `--warm-tokens` (8) at each concurrency on
each (most prefill shapes and row buckets the passes use compiled, and auto's probes of
each bucket run: a server's start-up, not its pace), each (workload, concurrency) runs
`--repeats` passes on each server, alternating which goes first, so that both meet the
machine's drift alike. The server started first reads a few percent less
(server_load.running): halfway through the repeats both stop and start again, warmed
again, in the reverse order. A pass sends `--requests` requests (default: 8 at
concurrency 1, else 2x the concurrency, cycling through the prompts). At concurrency 16
how a pass's arrivals fall into admissions moves its tokens/s by a third either way
(load_levels_epyc_zen4_s81.md): one pass a server cannot tell a ratio, the median of
several can. A pass in which the server still compiled in the foreground (its /metrics
`lookahead_compile_seconds` grew by more than COMPILE_S) is run again, up to TRIES times
in all; each records its tries and the last try's compile seconds. The servers run with
`--no-shared-guesses` unless `--shared-guesses` is given: a prompt asked again would be a
recall of its earlier answer (benchmarks/cpu/shared_guesses.md), not lookahead on a new one.

A lone request's rate (concurrency 1, greedy, one pass) is also measured on `--batch 1`
servers, plain and auto, and on a `--batch 16 --row-buckets off` plain server (every
round steps all rows: the engine before row buckets), each alone.

Reported per (workload, concurrency): each server's total output tokens/s (completion
tokens / the pass's wall time), median and range over the repeats; auto's median over
plain's, and the range of the repeats' own ratios (a pass of auto over the plain pass
beside it); TTFT medians; where a pass's time went (the engine's seconds in prefills and
in decode rounds, positions prefilled, rounds: the growth of the server's /metrics over
the pass; medians); greedy answers compared between plain and auto over every repeat
(identical when exact). The idle server is quiet but for a background compile a pass of
its started. The `--batch 16` auto server's per-round choices (row buckets, lookahead or
plain rounds) are read from its /metrics at the end of each half.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

from server_load import drive, halves, metered, running, server_metrics, summarize  # noqa: E402

WORKLOADS = ("greedy", "mix t=1.0")
COMPILE_S, TRIES = 0.5, 3  # a pass compiling longer than COMPILE_S runs again (docstring)


def one_pass(url: str, prompts: list[str], c: int, max_tokens: int, temps: list[float]):
    """(summary, greedy texts: None for a sampled request) of one pass of `prompts` at
    concurrency c, run again while the server compiled in it (COMPILE_S, TRIES)."""
    tries, spent = 0, {"compile_s": COMPILE_S + 1}
    while spent["compile_s"] > COMPILE_S and tries < TRIES:
        run, spent = metered(url, asyncio.run, drive(url, prompts, c, max_tokens, temps))
        tries += 1
    answers = zip(run["requests"], temps, strict=True)
    texts = [r["text"] if t == 0 else None for r, t in answers]
    return {**summarize(run), "tries": tries, **spent}, texts


def passes(urls: dict, prompts: list[str], levels: list[int], args, workloads, repeats):
    """{((batch, mode), workload, concurrency): [(summary, texts) a repeat]} on running
    servers (urls: (batch, mode) -> url), each warmed first, the `repeats` (a range)
    alternating between them (one pass each, alone)."""
    for url in urls.values():
        for c in levels:  # warm-up: every prompt's prefill shape, each row bucket's rounds
            asyncio.run(drive(url, prompts, c, args.warm_tokens))
    out: dict = {}
    for workload in workloads:
        for c in levels:
            n = args.requests or (8 if c == 1 else 2 * c)
            batch = [prompts[i % len(prompts)] for i in range(n)]
            temps = [1.0 if workload != "greedy" and i % 2 else 0.0 for i in range(n)]
            modes = list(urls)
            for r in repeats:
                for mode in modes if r % 2 == 0 else modes[::-1]:
                    got = one_pass(urls[mode], batch, c, args.max_tokens, temps)
                    out.setdefault((mode, workload, c), []).append(got)
                    print(mode, workload, c, r, json.dumps(got[0]), flush=True)
    return out


def serving(args, specs: list[tuple[int, str]], prompts, levels, workloads=WORKLOADS):
    """`passes` on a server per (batch, mode), started in two `halves` (one server: one
    pass): their results, and each half's /metrics rounds and auto's of specs[-1]'s."""
    got, rounds = {}, []
    for order, repeats in halves(specs, args.repeats if len(specs) > 1 else 1):
        starts = [((args.ckpt, batch, mode.split(",")[0], args.max_tokens,
                    *(["--row-buckets", "off"] if "off" in mode else [])),
                   dict(shared_guesses=args.shared_guesses)) for batch, mode in order]  # fmt: skip
        with running(starts) as up:
            url_of = {spec: url for spec, (_, url) in zip(order, up, strict=True)}
            urls = {spec: url_of[spec] for spec in specs}  # (passes alternate from specs')
            for key, runs in passes(urls, prompts, levels, args, workloads, repeats).items():
                got.setdefault(key, []).extend(runs)
            rounds.append(server_metrics(urls[specs[-1]], "lookahead_rounds{", "lookahead_auto_"))
    return got, rounds


def median(runs: list, field: str) -> float:
    """The median of a summary field over a pass's repeats ([(summary, texts)])."""
    return statistics.median(s[field] for s, _ in runs)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--ckpt", default="smollm2-135m")
    ap.add_argument("--levels", default="1,4,16")
    ap.add_argument("--batch", type=int, default=16)
    ap.add_argument("--max-tokens", type=int, default=64)
    ap.add_argument("--requests", type=int, default=0, help="per pass (0: by concurrency)")
    ap.add_argument("--repeats", type=int, default=4, help="passes a server a level (even)")
    ap.add_argument("--warm-tokens", type=int, default=8, help="max_tokens of the warm-up")
    ap.add_argument(
        "--shared-guesses", action="store_true", help="keep the servers' shared guesses on"
    )
    ap.add_argument("--out", default="benchmarks/cpu/load_levels")
    args = ap.parse_args()
    if args.repeats < 1:
        ap.error("--repeats must be 1 or more")

    from machine import run_header
    from prompts import code
    from results import write_results

    prompts = [r["prompt"] for r in code()]
    levels = [int(c) for c in args.levels.split(",")]
    result = {**run_header(), "ckpt": args.ckpt, "max_tokens": args.max_tokens, "rows": []}
    result["shared_guesses"], result["repeats"] = args.shared_guesses, args.repeats
    B = args.batch
    got, rounds = serving(args, [(B, "plain"), (B, "auto")], prompts, levels)
    if 1 in levels and B > 1:  # a lone request, each server alone
        for spec in [(1, "plain"), (1, "auto"), (B, "plain, --row-buckets off")]:
            got.update(serving(args, [spec], prompts, [1], ("greedy",))[0])
    for (server, workload, c), runs in got.items():
        row = {"batch": server[0], "mode": server[1], "workload": workload, "concurrency": c}
        result["rows"].append({**row, "summaries": [s for s, _ in runs]})
    result["server_rounds"] = {f"--batch {B} auto": rounds}
    same = total = 0
    for (server, workload, c), runs in got.items():
        if server != (B, "auto"):
            continue
        for (_, a_texts), (_, p_texts) in zip(runs, got[((B, "plain"), workload, c)], strict=True):
            for a, p in zip(a_texts, p_texts, strict=True):
                if a is not None:
                    same, total = same + (a == p), total + 1
    result["greedy_same"] = f"{same}/{total}"
    write_results(args.out, result, report(result, got, args))


def report(result: dict, got: dict, args) -> str:
    """The markdown: auto against plain per level, where the time went, a lone request."""
    B, tps = args.batch, "total_tokens_per_s"
    lines = [
        f"# One server at every load: --batch {B}, plain against auto",
        "",
        f"CPU: {result['cpu']} ({result['cores']} cores), JAX {result['jax']}, {args.ckpt} "
        f"float32; the 20 code prompts as chats, streamed, at most {args.max_tokens} tokens; "
        f"shared guesses {'on' if args.shared_guesses else 'off'}; {args.repeats} passes a "
        "server at each level, alternating between the two servers"
        + (", both started again halfway in the reverse order." if args.repeats > 1 else "."),
        "",
        f"Command: `{result['command']}`",
        "",
        "| workload | concurrency | plain tokens/s median (range) | auto tokens/s median "
        "(range) | auto / plain (medians) | the repeats' ratios | TTFT median plain, auto (s) "
        "| tries plain, auto |",
        "|---|---|---|---|---|---|---|---|",
    ]
    table = ["", f"Where each --batch {B} pass's time went (the servers' /metrics, grown over "
             "the pass; medians over the repeats): engine seconds in prefills (inserts, "
             "chunks) and in decode rounds, the rest host work and waiting; positions "
             "prefilled (padding included); decode rounds:", "",
             "| workload | concurrency | mode | wall s | prefill s | decode s | positions | "
             "rounds |", "|---|---|---|---|---|---|---|---|"]  # fmt: skip
    for (server, workload, c), auto in got.items():
        if server != (B, "auto"):
            continue
        plain = got[((B, "plain"), workload, c)]
        ratio = median(auto, tps) / median(plain, tps)
        pairs = sorted(a[tps] / p[tps] for (a, _), (p, _) in zip(auto, plain, strict=True))

        def span(runs):
            xs = [s[tps] for s, _ in runs]
            return f"{statistics.median(xs):.1f} ({min(xs):.1f}-{max(xs):.1f})"

        lines.append(
            f"| {workload} | {c} | {span(plain)} | {span(auto)} | **{ratio:.2f}x** | "
            f"{pairs[0]:.2f}-{pairs[-1]:.2f} | "
            f"{statistics.median(s['ttft_s']['median'] for s, _ in plain):.2f}, "
            f"{statistics.median(s['ttft_s']['median'] for s, _ in auto):.2f} | "
            f"{'/'.join(str(s['tries']) for s, _ in plain)}, "
            f"{'/'.join(str(s['tries']) for s, _ in auto)} |"
        )
        for mode, runs in (("plain", plain), ("auto", auto)):
            cells = [f"{median(runs, f):.2f}" for f in ("wall_s", "prefill_s", "decode_s")]
            cells += [f"{median(runs, f):.0f}" for f in ("prefill_positions", "rounds")]
            table.append(f"| {workload} | {c} | {mode} | " + " | ".join(cells) + " |")
    lines += table
    if ((1, "plain"), "greedy", 1) in got and B > 1:  # (not with --levels without 1)
        lines += ["", "A lone request (concurrency 1, greedy, one pass) against a `--batch 1` "
                  "server:", "", f"| mode | --batch 1 tokens/s | --batch {B} tokens/s | "
                  f"{B} / 1 |", "|---|---|---|---|"]  # fmt: skip
        for mode, big_mode in (("plain", "plain"), ("plain", "plain, --row-buckets off"),
                               ("auto", "auto")):  # fmt: skip
            one = median(got[((1, mode), "greedy", 1)], tps)
            big = median(got[((B, big_mode), "greedy", 1)], tps)
            lines.append(f"| {big_mode} | {one:.1f} | {big:.1f} | **{big / one:.2f}x** |")
    lines += [
        "",
        f"Greedy answers identical between plain and auto at --batch {B}: {result['greedy_same']}.",
        "",
        f"Rounds of the --batch {B} auto server by row bucket and mode (its /metrics, a half "
        "each): "
        f"`{json.dumps(result['server_rounds'][f'--batch {B} auto'])}`",
    ]
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    main()
