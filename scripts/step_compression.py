"""Step compression (new tokens per forward pass) of lookahead configs on MT-bench or code.

Compression is a property of the algorithm and the model, not of the hardware,
so rows are batched to finish sooner; every row's tokens are also checked
against plain greedy decoding.

    python scripts/step_compression.py --configs 5,15,15 5,7,7 4,5,3 --out benchmarks/compression
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import numpy as np  # noqa: E402
from prompts import category_ranks, prompt_set  # noqa: E402
from tqdm import tqdm  # noqa: E402

import lookahead_jax as lj  # noqa: E402


def parse_config(text: str) -> lj.LookaheadConfig:
    n, w, g = (int(x) for x in text.split(","))
    return lj.LookaheadConfig(n, w, g)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--ckpt", default="smollm2-135m")
    ap.add_argument("--configs", nargs="+", default=["5,15,15", "5,7,7", "4,5,3"])
    ap.add_argument("--max-new-tokens", type=int, default=256)
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--limit", type=int, default=None, help="first K prompts only")
    ap.add_argument("--set", default="mt_bench", choices=["mt_bench", "code"])
    ap.add_argument(
        "--per-category", type=int, default=0, help="first K prompts of each category (0 = all)"
    )
    ap.add_argument("--out", default="benchmarks/compression")
    args = ap.parse_args()

    model = lj.load(args.ckpt)
    rows = [
        r
        for rank, r in category_ranks(prompt_set(args.set)[: args.limit])
        if not args.per_category or rank <= args.per_category
    ]
    prompts = [model.tokenizer.encode_prompt(r["prompt"], chat=True) for r in rows]
    results = {
        "command": " ".join(sys.argv),
        "ckpt": args.ckpt,
        "max_new_tokens": args.max_new_tokens,
        "prompts": len(rows),
        "configs": {},
    }

    def run(la):
        tokens, steps = [], []
        for i in tqdm(
            range(0, len(prompts), args.batch), desc=str(la and la.describe()), leave=False
        ):
            out = lj.generate(
                model, prompts[i : i + args.batch], max_new_tokens=args.max_new_tokens, lookahead=la
            )
            tokens += out.token_ids
            steps += out.steps
        return tokens, steps

    t = time.time()
    plain_tokens, _ = run(None)
    for text in args.configs:
        la = parse_config(text)
        t0 = time.time()
        tokens, steps = run(la)
        same = sum(a == b for a, b in zip(tokens, plain_tokens, strict=True))
        cats: dict[str, list[int]] = {}
        for r, toks, s in zip(rows, tokens, steps, strict=True):
            c = cats.setdefault(r["category"], [0, 0])
            c[0] += len(toks)
            c[1] += s
        new, total_steps = sum(len(x) for x in tokens), sum(steps)
        per_prompt = [len(x) / max(s, 1) for x, s in zip(tokens, steps, strict=True)]
        results["configs"][text] = {
            "compression": new / total_steps,
            "mean_per_prompt": float(np.mean(per_prompt)),
            "by_category": {k: a / b for k, (a, b) in sorted(cats.items())},
            "new_tokens": new,
            "steps": total_steps,
            "rows_equal_to_plain": same,
            "seconds": time.time() - t0,
        }
        print(text, json.dumps(results["configs"][text]), flush=True)
    results["seconds"] = time.time() - t
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.with_suffix(".json").write_text(json.dumps(results, indent=2) + "\n")
    cats = sorted(next(iter(results["configs"].values()))["by_category"])
    lines = [
        f"# Step compression on {args.set} ({len(rows)} prompts, chat template, greedy, "
        f"{args.max_new_tokens} new tokens, {args.ckpt})",
        "",
        f"`{results['command']}`",
        "",
        "| N,W,G | compression | " + " | ".join(cats) + " | rows == plain |",
        "|---|---|" + "---|" * len(cats) + "---|",
    ]
    for text, r in results["configs"].items():
        lines.append(
            f"| {text} | {r['compression']:.3f} | "
            + " | ".join(f"{r['by_category'][c]:.2f}" for c in cats)
            + f" | {r['rows_equal_to_plain']}/{len(rows)} |"
        )
    out.with_suffix(".md").write_text("\n".join(lines) + "\n")


if __name__ == "__main__":
    main()
