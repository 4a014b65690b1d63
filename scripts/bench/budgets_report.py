"""Merge step_compression.py results into one report: draft-tree layouts by tokens per
step (tokens=T) beside the paper's (N, W, G), with a plot of compression against T.

Later files replace earlier ones' rows of the same config (a re-run after a fix), and
every command is recorded. Only results over the same prompts and settings are merged.

    python scripts/bench/budgets_report.py benchmarks/cpu/budgets.json \\
        benchmarks/cpu/budgets_rerun.json --out benchmarks/cpu/budgets
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from step_compression import markdown  # noqa: E402

SAME = ("ckpt", "max_new_tokens", "temperature", "prompts")


def merge(paths: list[Path]) -> dict:
    parts = [json.loads(p.read_text()) for p in paths]
    first = parts[0]
    for p, part in zip(paths, parts, strict=True):
        differ = [k for k in SAME if part[k] != first[k]]
        if differ:
            raise SystemExit(f"{p} differs from {paths[0]} in {differ}: not merged")
    configs: dict = {}
    for part in parts:
        configs.update(part["configs"])
    # draft-tree layouts first, by tokens per step; then the paper's configs
    order = sorted(configs, key=lambda k: (not k.startswith("tokens="), configs[k]["step_tokens"]))
    return {
        **{k: first[k] for k in SAME},
        "command": " && ".join(p["command"] for p in parts),
        "sources": [str(p) for p in paths],
        "configs": {k: configs[k] for k in order},
    }


def plot(results: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    configs = results["configs"]
    sets = list(next(iter(configs.values()))["by_set"])
    fig, axes = plt.subplots(1, len(sets), figsize=(5 * len(sets), 4), sharey=True, squeeze=False)
    axes = list(axes[0])
    for ax, name in zip(axes, sets, strict=True):
        for tree, label, style in ((True, "draft tree (tokens=T)", "o-"), (False, "N,W,G", "s--")):
            rows = [
                (r["step_tokens"], r["by_set"][name], k)
                for k, r in configs.items()
                if k.startswith("tokens=") == tree
            ]
            if not rows:
                continue
            xs, ys, names = zip(*sorted(rows), strict=True)
            ax.plot(xs, ys, style, label=label)
            if not tree:
                for x, y, k in zip(xs, ys, names, strict=True):
                    ax.annotate(k, (x, y), textcoords="offset points", xytext=(4, -10), fontsize=7)
        ax.set_xscale("log", base=2)
        ax.set_xlabel("tokens fed per step T")
        ax.set_title(name)
        ax.grid(alpha=0.3)
    axes[0].set_ylabel("new tokens per step")
    axes[0].legend()
    mode = f"temperature {results['temperature']}" if results["temperature"] else "greedy"
    fig.suptitle(f"{results['ckpt']}, {mode}, {results['max_new_tokens']} new tokens")
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("results", nargs="+", type=Path, help="step_compression.py JSON files")
    ap.add_argument("--out", required=True)
    args = ap.parse_args()
    results = merge(args.results)
    out = Path(args.out)
    out.with_name(out.name + ".json").write_text(json.dumps(results, indent=2) + "\n")
    n_rows = sum(results["prompts"].values())
    out.with_name(out.name + ".md").write_text(markdown(results, n_rows))
    plot(results, out.with_name(out.name + ".png"))


if __name__ == "__main__":
    main()
