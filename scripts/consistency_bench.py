"""A consistency-tuned checkpoint against its base, side by side: lookahead compression
(tokens per forward pass) at the small (tokens=16) and large (tokens=128) layouts, pure
Jacobi compression (n / iterations per n-token block, from the block's guessed start),
decode tokens/s at tokens=16, per-token NLL of held-out ShareGPT responses and how often
greedy outputs agree on held-out prompts.

    python scripts/sharegpt.py --train 256 --held-out 32 --out /tmp/sharegpt
    python -m lookahead_jax.consistency --ckpt smollm2-135m --prompts /tmp/sharegpt.train.jsonl \\
        --chat --out /tmp/tuned [...]
    python scripts/consistency_bench.py --tuned /tmp/tuned \\
        --held-out /tmp/sharegpt.held_out.jsonl --out benchmarks/cpu/consistency

Writes OUT.json and OUT.md.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from machine import cpu_model  # noqa: E402
from prompts import prompt_set  # noqa: E402

import lookahead_jax as lj  # noqa: E402
from lookahead_jax import consistency as C  # noqa: E402
from lookahead_jax.testing import first_divergence, full_pass_logits  # noqa: E402

BUDGETS = (16, 128)
JACOBI_BLOCK = 16


def measure_set(model, ids: list[list[int]], max_new_tokens: int) -> dict:
    row = {}
    for budget in BUDGETS:
        config = lj.LookaheadConfig.for_budget(budget)
        lj.generate(model, ids[:1], max_new_tokens=8, lookahead=config)  # compile
        out = lj.generate(model, ids, max_new_tokens=max_new_tokens, lookahead=config)
        row[f"compression_t{budget}"] = out.stats["compression"]
        row[f"tokens_per_s_t{budget}"] = out.stats.get("tokens_per_s")
    blocks = max(max_new_tokens // JACOBI_BLOCK, 1)
    slots = max(len(p) for p in ids)
    data = C.collect(model, ids, JACOBI_BLOCK, blocks, slots, batch=len(ids))
    row["jacobi_compression"] = JACOBI_BLOCK / data.meta["mean_iterations_per_block"]
    return row


def response_nll(model, prompt_ids: list[int], response_ids: list[int]) -> np.ndarray:
    ids = prompt_ids + response_ids
    logits = full_pass_logits(model, ids)[len(prompt_ids) - 1 : -1]
    shifted = logits - logits.max(-1, keepdims=True)
    logp = shifted - np.log(np.exp(shifted).sum(-1, keepdims=True))
    return -logp[np.arange(len(response_ids)), response_ids]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--base", default="smollm2-135m")
    ap.add_argument("--tuned", required=True)
    ap.add_argument("--held-out", required=True, help="scripts/sharegpt.py's held_out.jsonl")
    ap.add_argument("--mt", type=int, default=80, help="MT-bench prompts (first N)")
    ap.add_argument("--code", type=int, default=20, help="code prompts (first N)")
    ap.add_argument("--max-new-tokens", type=int, default=128)
    ap.add_argument("--nll-tokens", type=int, default=256, help="response tokens per text")
    ap.add_argument("--out", default="benchmarks/cpu/consistency")
    args = ap.parse_args()

    models = {"base": lj.load(args.base), "tuned": lj.load(args.tuned)}
    tok = models["base"].tokenizer
    sets = {}
    for name, n in (("mt_bench", args.mt), ("code", args.code)):
        ids = [tok.encode_prompt(r["prompt"], chat=True) for r in prompt_set(name)[:n]]
        sets[name] = {"prompts": len(ids)}
        for which, model in models.items():
            sets[name][which] = measure_set(model, ids, args.max_new_tokens)
            print(name, which, sets[name][which], flush=True)

    held = [json.loads(line) for line in Path(args.held_out).read_text().splitlines() if line]
    nll = {w: [] for w in models}
    for row in held:
        p = tok.encode_prompt(row["prompt"], chat=True)
        r = tok.encode(row["response"], add_special_tokens=False)[: args.nll_tokens]
        for w, m in models.items():
            nll[w].append(response_nll(m, p, r))
    nll_mean = {w: float(np.concatenate(v).mean()) for w, v in nll.items()}
    prompts = [tok.encode_prompt(row["prompt"], chat=True) for row in held]
    outs = {w: lj.generate(m, prompts, max_new_tokens=64).token_ids for w, m in models.items()}
    pairs = list(zip(outs["base"], outs["tuned"], strict=True))
    prefix = [len(a) if (i := first_divergence(a, b)) is None else i for a, b in pairs]
    agreement = {
        "prompts": len(pairs),
        "identical": sum(a == b for a, b in pairs),
        "mean_common_prefix": float(np.mean(prefix)),
    }
    manifest = json.loads((Path(args.tuned) / "manifest.json").read_text())
    result = {
        "command": " ".join(["python", *sys.argv]),
        "cpu": cpu_model(),
        "tuned_source": manifest.get("source"),
        "max_new_tokens": args.max_new_tokens,
        "sets": sets,
        "held_out_nll": {**nll_mean, "tokens": int(sum(len(v) for v in nll["base"]))},
        "greedy_agreement": agreement,
    }
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.with_name(out.name + ".json").write_text(json.dumps(result, indent=2) + "\n")
    out.with_name(out.name + ".md").write_text(markdown(result))
    print(markdown(result))


def markdown(r: dict) -> str:
    src = r["tuned_source"] or {}
    lines = [
        f"# Consistency fine-tuning: tuned against base ({r['cpu']})",
        "",
        f"`{r['command']}`; tuned with {json.dumps(src.get('train'))} on "
        f"{src.get('tokens_per_epoch')} trajectory tokens per epoch.",
        "",
        "| set | model | compression tokens=16 | tokens=128 | Jacobi (n=16) | tok/s tokens=16 |",
        "|---|---|---|---|---|---|",
    ]
    for name, s in r["sets"].items():
        for which in ("base", "tuned"):
            v = s[which]
            lines.append(
                f"| {name} ({s['prompts']}) | {which} | {v['compression_t16']:.3f} | "
                f"{v['compression_t128']:.3f} | {v['jacobi_compression']:.3f} | "
                f"{v['tokens_per_s_t16'] or float('nan'):.1f} |"
            )
        b, t = s["base"], s["tuned"]
        lines.append(
            f"| {name} | tuned / base | {t['compression_t16'] / b['compression_t16']:.3f}x | "
            f"{t['compression_t128'] / b['compression_t128']:.3f}x | "
            f"{t['jacobi_compression'] / b['jacobi_compression']:.3f}x | |"
        )
    n = r["held_out_nll"]
    g = r["greedy_agreement"]
    lines += [
        "",
        f"Held-out ShareGPT responses ({n['tokens']} tokens): NLL base {n['base']:.4f}, "
        f"tuned {n['tuned']:.4f} ({n['tuned'] / n['base'] - 1:+.2%}). Greedy outputs (64 "
        f"tokens) on {g['prompts']} held-out prompts: {g['identical']} identical, first "
        f"difference after {g['mean_common_prefix']:.1f} tokens on average.",
    ]
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    main()
