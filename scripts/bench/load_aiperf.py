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

For each server and concurrency C it sends max(16, 2 C) requests (C at a time, each
waiting for the one before it in its slot), after a warm-up of C requests, and records
aiperf's time to first token, inter-token latency (p50, p90, p99), output tokens/s and
requests/s, and its error count. The server runs with --batch 16: at C = 64, 48 requests
wait for a slot, which their time to first token shows. The servers run with
`--no-shared-guesses` unless `--shared-guesses` is given: the levels' requests ask the 80
prompts more than once, and an answer asked again would be recalled (as
load_levels.py's docstring says). Writes OUT.json, OUT.md and OUT.png.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from server_load import start_server  # noqa: E402

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
    ap.add_argument("--out", required=True)
    args = ap.parse_args()

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
    for name, tree in servers:
        proc, url = start_server(
            None, args.batch, SERVERS[name.removesuffix("_before")], max(args.max_tokens, 128),
            "--auto-temperature", "0", log=f"load_aiperf_server_{name}.log", name="smollm2",
            cwd=tree, shared_guesses=args.shared_guesses,
        )  # fmt: skip
        port = int(url.rsplit(":", 1)[1])
        try:
            for c in args.concurrency:
                n = max(16, 2 * c)
                export = aiperf(args.aiperf, port, tokenizer, prompts, c, n, args.max_tokens,
                                work / f"{name}_c{c}")  # fmt: skip
                result["runs"][f"{name}/{c}"] = {
                    "server": name,
                    "concurrency": c,
                    **summary(export),
                }
                write_results(args.out, result)
                print(name, c, result["runs"][f"{name}/{c}"], flush=True)
        finally:
            proc.send_signal(signal.SIGTERM)
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
        "requests a level after C warm-up requests.",
        "",
        "| server | C | TTFT p50 ms | TTFT p99 ms | ITL p50 ms | ITL p99 ms | output tok/s "
        "| requests/s | errors |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    fmt = lambda x: "—" if x is None else f"{x:.1f}"  # noqa: E731
    for row in result["runs"].values():
        lines.append(
            f"| {row['server']} | {row['concurrency']} | {fmt(row['ttft_ms']['p50'])} | "
            f"{fmt(row['ttft_ms']['p99'])} | {fmt(row['itl_ms']['p50'])} | "
            f"{fmt(row['itl_ms']['p99'])} | {fmt(row['output_tok_s'])} | "
            f"{row['requests_s']:.2f} | {row['errors']} |"
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
