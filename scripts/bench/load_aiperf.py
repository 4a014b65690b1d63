"""The server under load from a maintained load tool (issue 47): NVIDIA's aiperf at
concurrency 1, 4, 16 and 64 against `python -m lookahead_jax.serve` with lookahead (auto)
and without (--no-lookahead): streamed chat completions of the MT-bench first turns,
greedy, at most --max-tokens new tokens each. aiperf runs in an environment of its own
(its dependencies pin versions this project's do not), given by --aiperf:

    python3 -m venv /tmp/loadvenv && /tmp/loadvenv/bin/pip install aiperf
    python scripts/bench/load_aiperf.py --aiperf /tmp/loadvenv/bin/aiperf \\
        --out benchmarks/cpu/load_aiperf

The servers run side by side (all up, one driven at a time), `--repeats` passes each
at every concurrency C, which goes first alternating from pass to pass (one pass a server
cannot tell a ratio: plain alone read 89.1-140.7 tokens/s at C = 64 in four earlier
passes, load_aiperf_epyc_zen4_s79*.md, _s81_c64.md); halfway they start again in the
reverse order: the one started first reads less (two plain servers: 0.94x, `--servers
plain plain_b`, _s84_aa.md). A pass: max(16, 2 C) requests (C at a time) after C
warm-up requests; aiperf's TTFT, inter-token latency, output tokens/s, requests/s and
errors, and the server's /metrics growth over it, warm-up included (seconds compiling in
the foreground, in prefills, in decode rounds; positions prefilled; rounds; a pass that
compiled, each half's first, is not run again, unlike load_levels'); medians in the
table. At C = 64 (--batch 16) 48 requests wait for a slot. Shared guesses are off
unless `--shared-guesses`: the 80 prompts are asked more than once (as load_levels.py's
docstring says). Writes OUT.json, OUT.md and OUT.png.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from server_load import halves, metered, running  # noqa: E402

os.environ.setdefault("HF_HUB_OFFLINE", "1")

# name -> start_server's mode (plain_b: a second plain, `--servers plain plain_b` an A/A run)
SERVERS = {"lookahead": "auto", "plain": "plain", "plain_b": "plain"}
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
    """A level's figures: each the median of its passes' (None where one lacks it), errors
    summed."""
    med = lambda xs: statistics.median(xs) if None not in xs else None  # noqa: E731
    out = {k: {q: med([p[k][q] for p in passes]) for q in v} if isinstance(v, dict)
           else med([p[k] for p in passes]) for k, v in passes[0].items()}  # fmt: skip
    return {**out, "errors": sum(p["errors"] or 0 for p in passes)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--aiperf", default="aiperf", help="the aiperf executable")
    ap.add_argument("--concurrency", type=int, nargs="+", default=[1, 4, 16, 64])
    ap.add_argument("--batch", type=int, default=16)
    ap.add_argument("--max-tokens", type=int, default=64)
    ap.add_argument("--servers", nargs="+", default=["lookahead", "plain"], choices=list(SERVERS))
    ap.add_argument("--before", help="a source tree of an earlier version, whose servers run "
                    "too, as NAME_before, each after its own")  # fmt: skip
    ap.add_argument(
        "--shared-guesses", action="store_true", help="keep the servers' shared guesses on"
    )
    ap.add_argument("--repeats", type=int, default=2, help="passes a server at each level")
    ap.add_argument("--out", required=True)
    args = ap.parse_args()
    if args.repeats < 1:  # (as load_levels refuses it, not silently 1)
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
        "start_orders": [],
    }
    servers = [(n, None) for n in args.servers]
    if args.before:
        servers = [x for n in args.servers for x in ((f"{n}_before", args.before), (n, None))]
    for h, (order, repeats) in enumerate(halves(servers, args.repeats)):
        result["start_orders"].append([n for n, _ in order])
        starts = [((None, args.batch, SERVERS[n.removesuffix("_before")],
                    max(args.max_tokens, 128), "--auto-temperature", "0"),
                   dict(name="smollm2", cwd=tree, shared_guesses=args.shared_guesses,
                        log=f"load_aiperf_server_{n}_{h}.log")) for n, tree in order]  # fmt: skip
        with running(starts) as up:  # all up, driven one at a time
            ports = {n: int(u.rsplit(":", 1)[1]) for (n, _), (_, u) in zip(order, up, strict=True)}
            for c, r in ((c, r) for c in args.concurrency for r in repeats):
                for name, _ in servers[:: 1 - 2 * (r % 2)]:  # (which goes first alternates)
                    export, spent = metered(f"http://127.0.0.1:{ports[name]}", aiperf,
                        args.aiperf, ports[name], tokenizer, prompts, c, max(16, 2 * c),
                        args.max_tokens, work / f"{name}_c{c}_r{r}")  # fmt: skip
                    passes = result["runs"].get(f"{name}/{c}", {"passes": []})["passes"]
                    passes.append({**summary(export), **spent})
                    result["runs"][f"{name}/{c}"] = {
                        "server": name, "concurrency": c, **medians(passes), "passes": passes
                    }  # fmt: skip
                    write_results(args.out, result)
                    print(name, c, r, passes[-1], flush=True)
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
        "the servers side by side, alternating, started in the orders "
        f"{result['start_orders']} (one a half); medians. Compile / prefill / decode s, "
        "positions, rounds: the server's /metrics' growth over a pass (its warm-up too).",
        "",
        "| server | C | TTFT p50 ms | TTFT p99 ms | ITL p50 ms | ITL p99 ms | output tok/s "
        "(range) | requests/s | errors | compile s | prefill s | decode s | positions | rounds |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    fmt = lambda x, f=".1f": "—" if x is None else format(x, f)  # noqa: E731
    runs, ratios = result["runs"], []
    for row in runs.values():
        tps = [p["output_tok_s"] for p in row["passes"] if p["output_tok_s"] is not None]
        cells = [fmt(row[k], f) for k, f in (("compile_s", ".2f"), ("prefill_s", ".2f"),
                 ("decode_s", ".2f"), ("prefill_positions", ".0f"), ("rounds", ".1f"))]  # fmt: skip
        lines.append(
            f"| {row['server']} | {row['concurrency']} | {fmt(row['ttft_ms']['p50'])} | "
            f"{fmt(row['ttft_ms']['p99'])} | {fmt(row['itl_ms']['p50'])} | "
            f"{fmt(row['itl_ms']['p99'])} | {fmt(row['output_tok_s'])} "
            f"({fmt(min(tps, default=None))}-{fmt(max(tps, default=None))}) | "
            f"{fmt(row['requests_s'], '.2f')} | {row['errors']} | " + " | ".join(cells) + " |"
        )
    pairs = (("lookahead", "plain"), ("lookahead_before", "plain_before"), ("plain_b", "plain"))
    for (name, base), c in ((pair, c) for pair in pairs for c in args.concurrency):
        la, pl = runs.get(f"{name}/{c}"), runs.get(f"{base}/{c}")
        if la and pl and la["output_tok_s"] and pl["output_tok_s"]:
            both = zip(la["passes"], pl["passes"], strict=True)
            tps = [(a["output_tok_s"], b["output_tok_s"]) for a, b in both]
            own = ", ".join(f"{a / b:.2f}" for a, b in tps if a and b)
            ratios.append(f"* {name} over {base}, C = {c}: **"
                          f"{la['output_tok_s'] / pl['output_tok_s']:.2f}x** ({own})")  # fmt: skip
    if ratios:
        lines += ["", "Output tokens/s over plain's (medians; the passes' own ratios, each "
                  "over the plain pass beside it):", "", *ratios]  # fmt: skip
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
