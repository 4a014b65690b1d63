"""How far sampled text strays from the model's argmax, teacher-forced: the ceiling that
sampling puts on guesses that follow the greedy path.

For each prompt, plain decoding samples the output (the same seeds as step_compression.py);
one pass over prompt + output then gives the model's logits at every output position.
Reported per temperature: the share of positions whose sampled token is the argmax there
(a guess source that proposes the argmax continuation is right at most that often per
token), the mean length of the runs of such positions (what a chain of argmax guesses can
reach), and the share of sampled tokens among the top 8 there (what token recycling's
tables, which keep the top 8, can hold).

    python scripts/bench/sampling_agreement.py --sets mt_bench code --per-category 1 \\
        --temperatures 0.7 1.0 --out benchmarks/cpu/sampling_agreement
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import numpy as np  # noqa: E402
from machine import cpu_model  # noqa: E402
from prompts import select  # noqa: E402
from results import write_results  # noqa: E402
from tqdm import tqdm  # noqa: E402

import lookahead_jax as lj  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--ckpt", default="smollm2-135m")
    ap.add_argument("--sets", nargs="+", default=["mt_bench", "code"], choices=["mt_bench", "code"])
    ap.add_argument(
        "--per-category", type=int, default=1, help="first K prompts of each category (0 = all)"
    )
    ap.add_argument("--temperatures", nargs="+", type=float, default=[0.7, 1.0])
    ap.add_argument("--max-new-tokens", type=int, default=256)
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--out", default="benchmarks/cpu/sampling_agreement")
    args = ap.parse_args()

    model = lj.load(args.ckpt)
    rows = select(args.sets, args.per_category)
    prompts = [model.tokenizer.encode_prompt(r["prompt"], chat=True) for r in rows]
    table = []
    for t in [0.0, *args.temperatures]:
        argmax, top8, runs = [], [], []
        for i in tqdm(range(0, len(prompts), args.batch), desc=f"t={t}", leave=False):
            batch = prompts[i : i + args.batch]
            out = lj.generate(
                model,
                batch,
                max_new_tokens=args.max_new_tokens,
                temperature=t,
                seed=args.seed + i,  # as step_compression.py seeds its batches
                lookahead=None,
            )
            for p, ids in zip(batch, out.token_ids, strict=True):
                if not ids:
                    continue
                logits = lj.testing.full_pass_logits(model, p + ids)[len(p) - 1 : -1]
                ids_np = np.asarray(ids)
                same = np.argmax(logits, axis=-1) == ids_np
                top = np.argsort(-logits, axis=-1)[:, :8]
                argmax += same.tolist()
                top8 += np.any(top == ids_np[:, None], axis=1).tolist()
                runs += run_lengths(same)
        table.append(
            {
                "temperature": t,
                "positions": len(argmax),
                "sampled_is_argmax": float(np.mean(argmax)),
                "mean_argmax_run": float(np.mean(runs)) if runs else 0.0,
                "sampled_in_top8": float(np.mean(top8)),
            }
        )
        print(table[-1], flush=True)
    result = {
        "command": " ".join(["python", *sys.argv]),
        "cpu": cpu_model(),
        "ckpt": args.ckpt,
        "prompts": len(prompts),
        "rows": table,
    }
    lines = [
        f"# Sampled tokens against the argmax, teacher-forced ({len(prompts)} prompts, "
        f"{args.max_new_tokens} new tokens, {args.ckpt}, {result['cpu']})",
        "",
        f"`{result['command']}`",
        "",
        "| temperature | positions | sampled = argmax | mean run of argmax tokens "
        "| sampled in the top 8 |",
        "|---|---|---|---|---|",
    ]
    for r in table:
        lines.append(
            f"| {r['temperature']} | {r['positions']} | {r['sampled_is_argmax']:.1%} | "
            f"{r['mean_argmax_run']:.2f} | {r['sampled_in_top8']:.1%} |"
        )
    write_results(args.out, result, "\n".join(lines) + "\n")


def run_lengths(same: np.ndarray) -> list[int]:
    """Lengths of the maximal runs of True."""
    out, n = [], 0
    for s in same.tolist() + [False]:
        if s:
            n += 1
        elif n:
            out.append(n)
            n = 0
    return out


if __name__ == "__main__":
    main()
