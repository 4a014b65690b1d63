"""Step compression (new tokens per forward pass) of lookahead layouts on MT-bench and code.

Compression is a property of the algorithm and the model, not of the hardware, so rows
are batched to finish sooner; every row's tokens are also checked against plain decoding
(same seed and temperature). Reports compression overall, per prompt set, per category
and per guess source (which source supplied the accepted paths).

Configs as LookaheadConfig.parse reads them: `tokens=T` (for_budget), `N,W,G` (the
paper's knobs), or fields, e.g. `n=3,w=1,g=2,recycle=40,suffix=2,tree=13`.

    python scripts/bench/step_compression.py --sets mt_bench code \\
        --configs tokens=8 tokens=16 4,1,2 --out benchmarks/cpu/budgets
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import numpy as np  # noqa: E402
from prompts import select  # noqa: E402
from tqdm import tqdm  # noqa: E402

import lookahead_jax as lj  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--ckpt", default="smollm2-135m")
    ap.add_argument("--configs", nargs="+", default=["tokens=16", "4,1,2"])
    ap.add_argument("--max-new-tokens", type=int, default=256)
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--temperature", type=float, default=0.0)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--limit", type=int, default=None, help="first K prompts of each set only")
    ap.add_argument("--sets", nargs="+", default=["mt_bench"], choices=["mt_bench", "code"])
    ap.add_argument(
        "--per-category", type=int, default=0, help="first K prompts of each category (0 = all)"
    )
    ap.add_argument("--out", default="benchmarks/compression")
    args = ap.parse_args()

    model = lj.load(args.ckpt)
    rows = select(args.sets, args.per_category, args.limit)
    prompts = [model.tokenizer.encode_prompt(r["prompt"], chat=True) for r in rows]
    results = {
        "command": " ".join(sys.argv),
        "ckpt": args.ckpt,
        "max_new_tokens": args.max_new_tokens,
        "temperature": args.temperature,
        "prompts": {name: sum(r["set"] == name for r in rows) for name in args.sets},
        "configs": {},
    }

    def run(la):
        tokens, steps, sources = [], [], {}
        for i in tqdm(
            range(0, len(prompts), args.batch), desc=la.name if la else "plain", leave=False
        ):
            out = lj.generate(
                model,
                prompts[i : i + args.batch],
                max_new_tokens=args.max_new_tokens,
                lookahead=la,
                temperature=args.temperature,
                seed=args.seed + i,
            )
            tokens += out.token_ids
            steps += out.steps
            for name, s in out.stats.get("sources", {}).items():
                acc = sources.setdefault(name, {"paths": 0, "tokens": 0})
                acc["paths"] += s["paths"]
                acc["tokens"] += s["tokens"]
        return tokens, steps, sources

    def ratio(pairs):
        new, st = sum(a for a, _ in pairs), sum(b for _, b in pairs)
        return new / max(st, 1)

    t = time.time()
    plain_tokens, _, _ = run(None)
    for text in args.configs:
        la = lj.LookaheadConfig.parse(text)
        t0 = time.time()
        tokens, steps, sources = run(la)
        same = sum(a == b for a, b in zip(tokens, plain_tokens, strict=True))
        per = [(len(x), s) for x, s in zip(tokens, steps, strict=True)]
        groups: dict[str, dict[str, list]] = {"set": {}, "category": {}}
        for r, p in zip(rows, per, strict=True):
            groups["set"].setdefault(r["set"], []).append(p)
            groups["category"].setdefault(f"{r['set']}/{r['category']}", []).append(p)
        results["configs"][text] = {
            "layout": la.describe(),
            "step_tokens": la.tokens_per_step,
            "compression": ratio(per),
            "mean_per_prompt": float(np.mean([a / max(b, 1) for a, b in per])),
            "by_set": {k: ratio(v) for k, v in sorted(groups["set"].items())},
            "by_category": {k: ratio(v) for k, v in sorted(groups["category"].items())},
            "sources": sources,
            "new_tokens": sum(a for a, _ in per),
            "steps": sum(b for _, b in per),
            "rows_equal_to_plain": same,
            "seconds": time.time() - t0,
        }
        short = {k: results["configs"][text][k] for k in ("step_tokens", "compression", "by_set")}
        print(text, json.dumps(short), f"{same}/{len(rows)} equal", flush=True)
    results["seconds"] = time.time() - t
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.with_name(out.name + ".json").write_text(json.dumps(results, indent=2) + "\n")
    out.with_name(out.name + ".md").write_text(markdown(results, len(rows)))


def markdown(results: dict, n_rows: int) -> str:
    configs = results["configs"]
    first = next(iter(configs.values()))
    sets = list(first["by_set"])
    cats = list(first["by_category"])
    sources = sorted({s for r in configs.values() for s in r["sources"]})
    mode = "greedy" if not results["temperature"] else f"temperature {results['temperature']}"
    lines = [
        f"# Step compression ({n_rows} prompts: "
        + ", ".join(f"{k} {v}" for k, v in results["prompts"].items())
        + f"; chat template, {mode}, {results['max_new_tokens']} new tokens, {results['ckpt']})",
        "",
        f"`{results['command']}`",
        "",
        "| config | tokens/step | compression | " + " | ".join(sets) + " | rows == plain |",
        "|---|---|---|" + "---|" * len(sets) + "---|",
    ]
    for text, r in configs.items():
        lines.append(
            f"| {text} | {r['step_tokens']} | {r['compression']:.3f} | "
            + " | ".join(f"{r['by_set'][s]:.3f}" for s in sets)
            + f" | {r['rows_equal_to_plain']}/{n_rows} |"
        )
    if sources:
        lines += [
            "",
            "Accepted guessed tokens by source (share of all accepted guessed tokens):",
            "",
            "| config | " + " | ".join(sources) + " |",
            "|---|" + "---|" * len(sources),
        ]
        for text, r in configs.items():
            total = max(sum(s["tokens"] for s in r["sources"].values()), 1)
            cells = [f"{r['sources'].get(s, {}).get('tokens', 0) / total:.0%}" for s in sources]
            lines.append(f"| {text} | " + " | ".join(cells) + " |")
    lines += [
        "",
        "By category:",
        "",
        "| config | " + " | ".join(cats) + " |",
        "|---|" + "---|" * len(cats),
    ]
    for text, r in configs.items():
        lines.append(f"| {text} | " + " | ".join(f"{r['by_category'][c]:.2f}" for c in cats) + " |")
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    main()
