"""The server under load from a maintained load tool (issue 47): NVIDIA's aiperf at
concurrency 1, 4, 16 and 64 against `python -m lookahead_jax.serve`, with lookahead
(auto) and without (--no-lookahead), streaming chat completions of the MT-bench first
turns (the server applies the chat template), greedy, at most --max-tokens new tokens
each.

aiperf runs in an environment of its own (its dependencies pin versions this project's
do not), given by --aiperf:

    python3 -m venv /tmp/loadvenv && /tmp/loadvenv/bin/pip install aiperf
    python scripts/bench/load_aiperf.py --aiperf /tmp/loadvenv/bin/aiperf \\
        --out benchmarks/cpu/load_aiperf

The servers run side by side (all up, one driven at a time), `--repeats` passes each
at every concurrency C, alternating which goes first, so that both meet the machine's
drift alike (one pass a server cannot tell a ratio: stop 79's two C = 64 runs read plain
at 93.9 and 115.2 tokens/s, stop 81's at 140.7). A pass sends max(16, 2 C) requests (C
at a time, each waiting for the one before it in its slot), after a warm-up of C
requests; each records aiperf's time to first token, inter-token latency (p50, p90,
p99), output tokens/s and requests/s, its error count, and what the pass cost the server
(its /metrics' growth: seconds in prefills and decode rounds, positions prefilled,
rounds); the table shows the passes' medians. The server runs with --batch 16: at C =
64, 48 requests wait for a slot, which their time to first token shows. The servers run
with `--no-shared-guesses` unless `--shared-guesses` is given: the levels' requests ask
the 80 prompts more than once, and an answer asked again would be recalled (as
load_levels.py's docstring says). Writes OUT.json, OUT.md and OUT.png.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from server_load import SPENT, server_metrics, spent_between, start_server  # noqa: E402

os.environ.setdefault("HF_HUB_OFFLINE", "1")

SERVERS = {"lookahead": "auto", "plain": "plain"}  # server name -> start_server's mode
METRICS = {  # aiperf's metric tag -> what the table calls it
    "time_to_first_token": "TTFT ms",
    "inter_token_latency": "ITL ms",
}


def aiperf(exe: str, port: int, tokenizer: Path, prompts: Path, concurrency: int,
           requests: int, max_tokens: int, out: Path) -> dict:  # fmt: skip
    """One aiperf profile run; its exported JSON."""
    cmd = [exe, "profile", "--model", "smollm2", "--url", f"http://127.0.0.1:{port}",
           "--endpoint-type", "chat", "--streaming", "--tokenizer", str(tokenizer),
           "--input-file", str(prompts), "--custom-dataset-type", "single_turn",
           "--concurrency", str(concurrency), "--request-count", str(requests),
           "--warmup-request-count", str(concurrency),
           "--extra-inputs", f"max_tokens:{max_tokens}", "--extra-inputs", "temperature:0",
           "--output-artifact-dir", str(out), "--no-auto-plot"]  # fmt: skip
    # without HF_HUB_OFFLINE: in offline mode aiperf looks a tokenizer up in the hub's
    # cache even when given a directory (online, a directory loads as a directory)
    env = {
        k: v for k, v in os.environ.items() if k not in ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE")
    }
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=1800, env=env)
    if done.returncode != 0:
        raise SystemExit(
            f"aiperf failed ({done.returncode}):\n{done.stdout[-3000:]}\n{done.stderr[-3000:]}"
        )
    export = out / "profile_export_aiperf.json"
    if not export.is_file():
        raise SystemExit(f"aiperf wrote no {export}")
    return json.loads(export.read_text())


def hf_tokenizer(ckpt: Path, out: Path) -> Path:
    """A directory transformers' AutoTokenizer loads (aiperf counts tokens with it): the
    checkpoint's tokenizer.json, and its tokenizer_config.json naming the class."""
    out.mkdir(parents=True)
    shutil.copy(ckpt / "tokenizer.json", out / "tokenizer.json")
    config = json.loads((ckpt / "tokenizer_config.json").read_text())
    config["tokenizer_class"] = "PreTrainedTokenizerFast"
    (out / "tokenizer_config.json").write_text(json.dumps(config))
    return out


def summary(export: dict) -> dict:
    """The figures the table shows, from aiperf's JSON export."""

    def metric(tag):
        m = export.get(tag) or {}
        return {k: m.get(k) for k in ("avg", "p50", "p90", "p99")}

    errors = export.get("error_request_count") or {}
    return {
        "ttft_ms": metric("time_to_first_token"),
        "itl_ms": metric("inter_token_latency"),
        "output_tok_s": (export.get("output_token_throughput") or {}).get("avg"),
        "requests_s": (export.get("request_throughput") or {}).get("avg"),
        "requests": (export.get("request_count") or {}).get("avg"),
        "errors": errors.get("avg", 0) if isinstance(errors, dict) else errors,
    }


def medians(passes: list[dict]) -> dict:
    """A level's figures over its passes: each the median of the passes' (a pass's
    latency percentiles' medians; its errors summed)."""
    med = lambda xs: statistics.median(xs) if None not in xs else None  # noqa: E731
    out = {k: med([p[k] for p in passes]) for k in passes[0] if k not in ("ttft_ms", "itl_ms")}
    for k in ("ttft_ms", "itl_ms"):
        out[k] = {q: med([p[k][q] for p in passes]) for q in passes[0][k]}
    out["errors"] = sum(p["errors"] or 0 for p in passes)
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--aiperf", default="aiperf", help="the aiperf executable")
    ap.add_argument("--concurrency", type=int, nargs="+", default=[1, 4, 16, 64])
    ap.add_argument("--batch", type=int, default=16)
    ap.add_argument("--max-tokens", type=int, default=64)
    ap.add_argument("--servers", nargs="+", default=list(SERVERS), choices=list(SERVERS))
    ap.add_argument("--before", help="a source tree of an earlier version, whose servers run "
                    "too, as NAME_before, each after its own")  # fmt: skip
    ap.add_argument(
        "--shared-guesses", action="store_true", help="keep the servers' shared guesses on"
    )
    ap.add_argument("--repeats", type=int, default=2, help="passes a server at each level")
    ap.add_argument("--out", required=True)
    args = ap.parse_args()
    if args.repeats < 1:
        ap.error("--repeats must be 1 or more")

    from machine import cpu_model
    from prompts import mt_bench
    from results import write_results

    import lookahead_jax as lj

    work = Path(tempfile.mkdtemp(prefix="load_aiperf_"))
    tokenizer = hf_tokenizer(lj.inspect("smollm2-135m").path, work / "tokenizer")
    prompts = work / "mt_bench.jsonl"
    prompts.write_text("".join(json.dumps({"text": r["prompt"]}) + "\n" for r in mt_bench()))
    version = subprocess.run([args.aiperf, "--version"], capture_output=True, text=True)
    result = {
        "cpu": cpu_model(),
        "aiperf": (version.stdout or version.stderr).strip(),
        "batch": args.batch,
        "max_tokens": args.max_tokens,
        "shared_guesses": args.shared_guesses,
        "runs": {},
    }
    servers = [(n, None) for n in args.servers]
    if args.before:
        servers = [x for n in args.servers for x in ((f"{n}_before", args.before), (n, None))]
    procs, ports = [], {}
    try:
        for name, tree in servers:  # all up at once, driven one at a time
            proc, url = start_server(
                None, args.batch, SERVERS[name.removesuffix("_before")],
                max(args.max_tokens, 128), "--auto-temperature", "0",
                log=f"load_aiperf_server_{name}.log", name="smollm2", cwd=tree,
                shared_guesses=args.shared_guesses,
            )  # fmt: skip
            procs.append(proc)
            ports[name] = int(url.rsplit(":", 1)[1])
        for c in args.concurrency:
            n = max(16, 2 * c)
            for r in range(args.repeats):
                for name, _ in servers if r % 2 == 0 else servers[::-1]:
                    url = f"http://127.0.0.1:{ports[name]}"
                    before = server_metrics(url, *SPENT)
                    export = aiperf(args.aiperf, ports[name], tokenizer, prompts, c, n,
                                    args.max_tokens, work / f"{name}_c{c}_r{r}")  # fmt: skip
                    spent = spent_between(before, server_metrics(url, *SPENT))
                    passes = result["runs"].setdefault(f"{name}/{c}", {"passes": []})["passes"]
                    passes.append({**summary(export), **spent})
                    result["runs"][f"{name}/{c}"] = {
                        "server": name, "concurrency": c, **medians(passes), "passes": passes
                    }  # fmt: skip
                    write_results(args.out, result)
                    print(name, c, r, passes[-1], flush=True)
    finally:
        for proc in procs:
            proc.send_signal(signal.SIGTERM)
        for proc in procs:
            proc.wait(timeout=60)
    write_results(args.out, result, markdown(result, args))
    plot(result, Path(args.out))


def markdown(result: dict, args) -> str:
    lines = [
        "# The server under load (aiperf)",
        "",
        "Command: `" + " ".join(["python", *sys.argv]).replace(args.aiperf, "AIPERF") + "`",
        f"CPU: {result['cpu']} ({os.cpu_count()} cores); {result['aiperf']}; SmolLM2-135M "
        f"float32; server --batch {result['batch']}, shared guesses "
        f"{'on' if result['shared_guesses'] else 'off'}; streaming chat completions of the 80 "
        f"MT-bench first turns, greedy, max_tokens {result['max_tokens']}; max(16, 2 C) "
        f"requests a level after C warm-up requests; {args.repeats} passes a server a level, "
        "the servers side by side (all up, one driven at a time, alternating which goes "
        "first); medians over the passes. Where a pass's time went: the growth of the "
        "server's /metrics over it (engine seconds in prefills and in decode rounds, "
        "positions prefilled, rounds; medians).",
        "",
        "| server | C | TTFT p50 ms | TTFT p99 ms | ITL p50 ms | ITL p99 ms | output tok/s "
        "(range) | requests/s | errors | prefill s | decode s | positions | rounds |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    fmt = lambda x: "—" if x is None else f"{x:.1f}"  # noqa: E731
    runs = result["runs"]
    for row in runs.values():
        tps = [p["output_tok_s"] or 0.0 for p in row["passes"]]
        lines.append(
            f"| {row['server']} | {row['concurrency']} | {fmt(row['ttft_ms']['p50'])} | "
            f"{fmt(row['ttft_ms']['p99'])} | {fmt(row['itl_ms']['p50'])} | "
            f"{fmt(row['itl_ms']['p99'])} | {fmt(row['output_tok_s'])} ({min(tps):.1f}-"
            f"{max(tps):.1f}) | {row['requests_s']:.2f} | {row['errors']} | "
            f"{row['prefill_s']:.2f} | {row['decode_s']:.2f} | "
            f"{row['prefill_positions']:.0f} | {row['rounds']:.0f} |"
        )
    lines += ["", "Lookahead over plain, output tokens/s (medians; the passes' own ratios, "
              "each lookahead pass over the plain pass beside it):", ""]  # fmt: skip
    for c in args.concurrency:
        la, pl = runs.get(f"lookahead/{c}"), runs.get(f"plain/{c}")
        if la and pl and pl["output_tok_s"]:
            pairs = [(a["output_tok_s"] or 0) / (b["output_tok_s"] or 1)
                     for a, b in zip(la["passes"], pl["passes"], strict=True)]  # fmt: skip
            lines.append(
                f"* C = {c}: **{la['output_tok_s'] / pl['output_tok_s']:.2f}x** "
                f"({', '.join(f'{x:.2f}' for x in pairs)})"
            )
    return "\n".join(lines) + "\n"


def plot(result: dict, out: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 3, figsize=(13, 3.8))
    for name in dict.fromkeys(r["server"] for r in result["runs"].values()):
        rows = [r for r in result["runs"].values() if r["server"] == name]
        cs = [r["concurrency"] for r in rows]
        axes[0].plot(cs, [r["output_tok_s"] for r in rows], "o-", label=name)
        axes[1].plot(cs, [r["ttft_ms"]["p50"] for r in rows], "o-", label=name)
        axes[2].plot(cs, [r["itl_ms"]["p50"] for r in rows], "o-", label=name)
    for ax, title in zip(axes, ("output tokens/s", "TTFT p50 (ms)", "ITL p50 (ms)"), strict=True):
        ax.set_xscale("log", base=2)
        ax.set_xlabel("concurrency")
        ax.set_title(title)
        ax.legend()
    fig.tight_layout()
    fig.savefig(out.with_name(out.name + ".png"), dpi=110)


if __name__ == "__main__":
    main()
