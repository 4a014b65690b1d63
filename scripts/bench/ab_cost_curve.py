"""The forward step's cost at two or more commits (or settings), runs alternating.

This machine is shared and noisy: a regression between two commits shows only when
their runs alternate, so that a busy minute slows both. Each side is a git revision
checked out in a temporary worktree (its own lookahead_jax on PYTHONPATH, its own
cost_curve.py, wherever that commit kept it) plus optional environment settings; every
round runs each side once and the table reports every round and the min / median over
rounds of each side's median step time.

    python scripts/bench/ab_cost_curve.py --side old 4840a27 --side new a9f72e4 \\
        --rounds 3 --tokens 1,8 --context 512 --repeats 30 --out benchmarks/cpu/t8_regression
    # one commit, two settings:
    python scripts/bench/ab_cost_curve.py --side highest HEAD \\
        --side default HEAD JAX_DEFAULT_MATMUL_PRECISION=default ...
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from machine import cpu_model  # noqa: E402
from results import write_results  # noqa: E402

REPO = Path(__file__).resolve().parents[2]
SCRIPT_PATHS = ("scripts/bench/cost_curve.py", "scripts/cost_curve.py")  # now, before 09cedf6


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument(
        "--side",
        nargs="+",
        action="append",
        required=True,
        metavar="LABEL REV [KEY=VALUE ...]",
        help="a label, a git revision and environment settings for its runs",
    )
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--model", default="smollm2-135m")
    ap.add_argument("--tokens", default="1,8")
    ap.add_argument("--context", default="512")
    ap.add_argument("--repeats", type=int, default=30)
    ap.add_argument("--out", default="benchmarks/cpu/ab_cost_curve")
    args = ap.parse_args()
    if len(args.side) < 2 or any(len(s) < 2 for s in args.side):
        ap.error("give at least two --side LABEL REV [KEY=VALUE ...]")
    labels = [s[0] for s in args.side]
    if len(set(labels)) != len(labels):
        ap.error(f"side labels must differ, got {labels}")
    for s in args.side:
        if any("=" not in kv for kv in s[2:]):
            ap.error(f"settings of side {s[0]!r} must be KEY=VALUE, got {s[2:]}")

    with tempfile.TemporaryDirectory(prefix="ab_cost_") as tmp:
        sides: list[dict] = []
        try:
            for label, rev, *env in args.side:
                tree = Path(tmp) / label
                git("worktree", "add", "--detach", str(tree), rev)
                sides.append(dict(label=label, rev=rev, env=env, tree=tree))
                sides[-1]["commit"] = git("-C", str(tree), "rev-parse", "--short", "HEAD")
                sides[-1]["script"] = next(tree / p for p in SCRIPT_PATHS if (tree / p).exists())
            rounds = [
                [run_side(s, args, Path(tmp) / f"{s['label']}_{r}") for s in sides]
                for r in range(args.rounds)
            ]
        finally:  # every worktree added, even when a later one failed
            for s in sides:
                subprocess.run(
                    ["git", "-C", str(REPO), "worktree", "remove", "--force", str(s["tree"])],
                    check=False,
                )
    write(args, sides, rounds)


def git(*args: str) -> str:
    """Run git in the repository; its error output on failure, not a bare exit code."""
    done = subprocess.run(["git", "-C", str(REPO), *args], capture_output=True, text=True)
    if done.returncode:
        sys.exit(f"git {' '.join(args)} failed: {done.stderr.strip()}")
    return done.stdout.strip()


def run_side(side: dict, args, out: Path) -> dict:
    """{tokens: median seconds (all logits)} of one cost_curve.py run of a side."""
    env = dict(os.environ, PYTHONPATH=str(side["tree"]), HF_HUB_OFFLINE="1")
    env.update(kv.split("=", 1) for kv in side["env"])
    cmd = [
        sys.executable,
        str(side["script"]),
        "--model",
        args.model,
        "--tokens",
        args.tokens,
        "--context",
        args.context,
        "--repeats",
        str(args.repeats),
        "--out",
        str(out),
    ]
    subprocess.run(cmd, check=True, env=env, cwd=side["tree"], stdout=subprocess.DEVNULL)
    rows = json.loads(out.with_name(out.name + ".json").read_text())["rows"]
    times = {r["tokens"]: r["all_logits_s"]["median"] for r in rows}
    print(side["label"], {t: f"{1000 * s:.1f} ms" for t, s in times.items()}, flush=True)
    return times


def write(args, sides, rounds) -> None:
    tokens = sorted(rounds[0][0])
    summary = {}
    for i, s in enumerate(sides):
        per_t = {t: [r[i][t] for r in rounds] for t in tokens}
        summary[s["label"]] = {
            "commit": s["commit"],
            "env": s["env"],
            "median_step_s": {
                t: {"min": min(v), "median": float(np.median(v))} for t, v in per_t.items()
            },
        }
        if len(tokens) > 1:
            ratio = [r[i][tokens[-1]] / r[i][tokens[0]] for r in rounds]
            summary[s["label"]]["ratio"] = {"min": min(ratio), "median": float(np.median(ratio))}
    result = {
        "command": " ".join(["python", *sys.argv]),
        "cpu": cpu_model(),
        "model": args.model,
        "context": args.context,
        "repeats": args.repeats,
        "rounds": [{s["label"]: r[i] for i, s in enumerate(sides)} for r in rounds],
        "summary": summary,
    }
    big, small = tokens[-1], tokens[0]
    lines = [
        f"# Forward-step cost, runs alternating ({args.model}, {args.context}-token cache, "
        f"{result['cpu']})",
        "",
        f"`{result['command']}`",
        "",
        "Median step time of each run (all logits, ms), one run per side per round:",
        "",
        "| round | " + " | ".join(f"{s['label']} T={t}" for s in sides for t in tokens) + " |",
        "|---|" + "---|" * (len(sides) * len(tokens)),
    ]
    for k, r in enumerate(rounds):
        cells = [f"{1000 * r[i][t]:.1f}" for i in range(len(sides)) for t in tokens]
        lines.append(f"| {k + 1} | " + " | ".join(cells) + " |")
    if len(tokens) > 1:
        lines += [
            "",
            f"| side | commit | settings | T={big} / T={small}: min | median |",
            "|---|---|---|---|---|",
        ]
        for s in sides:
            q = summary[s["label"]]["ratio"]
            lines.append(
                f"| {s['label']} | {s['commit']} | {' '.join(s['env']) or '-'} | "
                f"{q['min']:.2f} | {q['median']:.2f} |"
            )
    write_results(args.out, result, "\n".join(lines) + "\n")


if __name__ == "__main__":
    main()
