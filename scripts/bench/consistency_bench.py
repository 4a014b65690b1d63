"""A consistency-tuned checkpoint against its base, side by side: lookahead compression
(tokens per forward pass) at the small (tokens=16) and large (tokens=128) layouts, pure
Jacobi compression (n / iterations per n-token block, from the block's guessed start),
decode tokens/s at tokens=16 (one prompt at a time), per-token NLL of held-out ShareGPT
responses and how often greedy outputs agree on held-out prompts.

    python scripts/training/sharegpt.py --train 256 --held-out 32 --out /tmp/sharegpt
    python -m lookahead_jax.training --ckpt smollm2-135m --prompts /tmp/sharegpt.train.jsonl \\
        --chat --out /tmp/tuned [...]
    python scripts/bench/consistency_bench.py --tuned /tmp/tuned \\
        --held-out /tmp/sharegpt.held_out.jsonl --out benchmarks/cpu/consistency

Writes OUT.json and OUT.md. --base-results OLD.json reuses an earlier run's base
compression (same base, prompt counts, --subset, --max-new-tokens; greedy decoding of the
base is deterministic), which halves the compression measurements (most of the time);
tokens/s, NLL and agreement are measured afresh for both.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from agreement import agreement  # noqa: E402
from machine import cpu_model  # noqa: E402
from prompts import prompt_set  # noqa: E402
from results import write_results  # noqa: E402

import lookahead_jax as lj  # noqa: E402
from lookahead_jax import training as C  # noqa: E402
from lookahead_jax.engine.testing import full_pass_logits  # noqa: E402

BUDGETS = (16, 128)
JACOBI_BLOCK, JACOBI_BLOCKS = 16, 2  # as trained: blocks of 16, the first two of each answer


def compression(model, ids: list[list[int]], max_new_tokens: int, config, batch: int) -> dict:
    """New tokens per forward pass over all prompts, decoded `batch` rows at a time (per-row
    acceptance: the same count as one prompt at a time)."""
    new = steps = 0
    for i in range(0, len(ids), batch):
        out = lj.generate(model, ids[i : i + batch], max_new_tokens, lookahead=config)
        new, steps = new + out.stats.new_tokens, steps + out.stats.row_steps
    return {"prompts": len(ids), "new_tokens": new, "steps": steps, "compression": new / steps}


def measure_set(model, ids: list[list[int]], args) -> dict:
    """Compression at tokens=16 on every prompt, at tokens=128 and of pure Jacobi decoding
    on the first `--subset` (the CPU's budget: a 128-token tree per step is 8x the work)."""
    row = {}
    for budget in BUDGETS:
        some = ids if budget == 16 else ids[: args.subset]
        config = lj.LookaheadConfig.for_tokens(budget)
        row[f"t{budget}"] = compression(model, some, args.max_new_tokens, config, args.batch)
    some = ids[: args.subset]
    slots = max(len(p) for p in some)
    data = C.collect(model, some, JACOBI_BLOCK, JACOBI_BLOCKS, slots, batch=args.batch)
    row["jacobi"] = {
        "prompts": len(some),
        "blocks": int((data.out_len // JACOBI_BLOCK).sum()),
        "iterations_per_block": data.meta["mean_iterations_per_block"],
        "compression": JACOBI_BLOCK / data.meta["mean_iterations_per_block"],
    }
    return row


def reused_base(earlier: dict, name: str, prompts: int, args) -> dict:
    """The base's compression on set `name` from an earlier run measured the same way."""
    same = {
        # as given on the command line (files from before this key: the default)
        "base": (earlier.get("base", "smollm2-135m"), args.base),
        "max_new_tokens": (earlier["max_new_tokens"], args.max_new_tokens),
        "subset": (earlier["subset"], args.subset),
        f"{name} prompts": (earlier["sets"].get(name, {}).get("prompts"), prompts),
    }
    differ = [f"{k} {a} (there) != {b}" for k, (a, b) in same.items() if a != b]
    if differ:
        raise SystemExit(f"--base-results {args.base_results}: measured otherwise: {differ}")
    return earlier["sets"][name]["base"]


def tokens_per_s(models: dict, ids: list[list[int]], max_new_tokens: int, repeats: int) -> dict:
    """One prompt at a time at tokens=16, the CPU default, interleaved between the models
    so that noise hits both: best and median over repeats of the summed decode tokens/s
    (noise only slows a run down)."""
    config = lj.LookaheadConfig.for_tokens(16)
    for model in models.values():  # compile, untimed
        lj.generate(model, ids[:1], max_new_tokens=max_new_tokens, lookahead=config)
    runs = {w: [] for w in models}
    for _ in range(repeats):
        for w, model in models.items():
            new = secs = 0.0
            for p in ids:
                out = lj.generate(model, [p], max_new_tokens=max_new_tokens, lookahead=config)
                new, secs = new + out.stats.new_tokens, secs + out.stats.decode_s
            runs[w].append(new / secs)
    return {w: {"max": max(r), "median": float(np.median(r)), "runs": r} for w, r in runs.items()}


def response_nll(model, prompt_ids: list[int], response_ids: list[int]) -> np.ndarray:
    ids = prompt_ids + response_ids
    logits = full_pass_logits(model, ids)[len(prompt_ids) - 1 : -1]
    shifted = logits - logits.max(-1, keepdims=True)
    logp = shifted - np.log(np.exp(shifted).sum(-1, keepdims=True))
    return -logp[np.arange(len(response_ids)), response_ids]


def held_out_nll(model, held: list[dict], tokens: int) -> tuple[float, int]:
    """Mean per-token NLL of held-out responses (the first `tokens` of each, after their
    prompt in the chat template), and how many tokens that is."""
    tok, nll = model.tokenizer, []
    for row in held:
        p = tok.encode_prompt(row["prompt"], chat=True)
        r = tok.encode(row["response"], add_special_tokens=False)[:tokens]
        nll.append(response_nll(model, p, r))
    return float(np.concatenate(nll).mean()), int(sum(len(v) for v in nll))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--base", default="smollm2-135m")
    ap.add_argument("--tuned", required=True)
    ap.add_argument(
        "--held-out", required=True, help="scripts/training/sharegpt.py's held_out.jsonl"
    )
    ap.add_argument("--mt", type=int, default=80, help="MT-bench prompts (first N)")
    ap.add_argument("--code", type=int, default=20, help="code prompts (first N)")
    ap.add_argument("--subset", type=int, default=16, help="prompts per set at tokens=128 "
                    "and for Jacobi (first N)")  # fmt: skip
    ap.add_argument("--max-new-tokens", type=int, default=64)
    ap.add_argument("--batch", type=int, default=10, help="rows per generate call")
    ap.add_argument("--speed-prompts", type=int, default=4, help="MT-bench prompts timed")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--nll-tokens", type=int, default=256, help="response tokens per text")
    ap.add_argument("--base-results", default=None, help="an earlier OUT.json whose base "
                    "compression to reuse")  # fmt: skip
    ap.add_argument("--out", default="benchmarks/cpu/consistency")
    args = ap.parse_args()
    earlier = json.loads(Path(args.base_results).read_text()) if args.base_results else None

    models = {"base": lj.load(args.base), "tuned": lj.load(args.tuned)}
    tok = models["base"].tokenizer
    sets = {}
    for name, n in (("mt_bench", args.mt), ("code", args.code)):
        ids = [tok.encode_prompt(r["prompt"], chat=True) for r in prompt_set(name)[:n]]
        sets[name] = {"prompts": len(ids)}
        for which, model in models.items():
            if which == "base" and earlier is not None:
                sets[name][which] = reused_base(earlier, name, len(ids), args)
            else:
                sets[name][which] = measure_set(model, ids, args)
            print(name, which, sets[name][which], flush=True)
        if name == "mt_bench":
            speed_prompts = len(ids[: args.speed_prompts])
            speed = tokens_per_s(models, ids[:speed_prompts], 128, args.repeats)
            print("tokens/s", speed, flush=True)

    held = [json.loads(line) for line in Path(args.held_out).read_text().splitlines() if line]
    nll = {w: held_out_nll(m, held, args.nll_tokens) for w, m in models.items()}
    prompts = [tok.encode_prompt(row["prompt"], chat=True) for row in held]
    outs = {
        w: lj.generate(m, prompts, max_new_tokens=64, lookahead=None).token_ids
        for w, m in models.items()
    }
    agreed = agreement(outs["base"], outs["tuned"])
    manifest = json.loads((Path(args.tuned) / "manifest.json").read_text())
    result = {
        "command": " ".join(["python", *sys.argv]),
        "base": args.base,
        "base_compression_from": args.base_results,
        "cpu": cpu_model(),
        "tuned_source": manifest.get("source"),
        "max_new_tokens": args.max_new_tokens,
        "subset": args.subset,
        "sets": sets,
        "tokens_per_s_t16": {"prompts": speed_prompts, "max_new_tokens": 128, **speed},
        "held_out_nll": {**{w: v[0] for w, v in nll.items()}, "tokens": nll["base"][1]},
        "greedy_agreement": agreed,
    }
    write_results(args.out, result, markdown(result))


def markdown(r: dict) -> str:
    src = r["tuned_source"] or {}
    lines = [
        f"# Consistency fine-tuning: tuned against base ({r['cpu']})",
        "",
        f"`{r['command']}`",
        "",
        f"Tuned with {json.dumps(src.get('train'))} on {src.get('tokens_per_epoch')} "
        "trajectory tokens per epoch. Compression: new tokens per forward pass, "
        f"{r['max_new_tokens']} new tokens per prompt; tokens=128 and pure Jacobi (blocks of "
        f"{JACOBI_BLOCK}, from a guess of random prompt tokens) on the first "
        f"{r['subset']} prompts of each set.",
        "",
    ]
    if src.get("mix", 1) != 1:
        lines += [f"Written as base + {src['mix']:g} * (trained - base) (`--mix`).", ""]
    if r.get("base_compression_from"):
        lines += [f"Base compression reused from `{r['base_compression_from']}`.", ""]
    lines += [
        "| set | model | tokens=16 | tokens=128 | Jacobi n=16 |",
        "|---|---|---|---|---|",
    ]
    for name, s in r["sets"].items():
        for which in ("base", "tuned"):
            v = s[which]
            lines.append(
                f"| {name} ({v['t16']['prompts']} / {v['t128']['prompts']}) | {which} | "
                f"{v['t16']['compression']:.3f} | {v['t128']['compression']:.3f} | "
                f"{v['jacobi']['compression']:.3f} |"
            )
        b, t = s["base"], s["tuned"]
        ratios = [t[k]["compression"] / b[k]["compression"] for k in ("t16", "t128", "jacobi")]
        lines.append(f"| {name} | tuned / base | " + " | ".join(f"{x:.3f}x" for x in ratios) + " |")
    n, g, v = r["held_out_nll"], r["greedy_agreement"], r["tokens_per_s_t16"]
    lines += [
        "",
        f"Decode tokens/s at tokens=16, one prompt at a time ({v['prompts']} MT-bench prompts, "
        f"{v['max_new_tokens']} tokens, best / median of {len(v['base']['runs'])} interleaved "
        f"runs): base {v['base']['max']:.1f} / {v['base']['median']:.1f}, tuned "
        f"{v['tuned']['max']:.1f} / {v['tuned']['median']:.1f} (median ratio "
        f"{v['tuned']['median'] / v['base']['median']:.3f}x).",
        "",
        f"Held-out ShareGPT responses ({n['tokens']} tokens): NLL base {n['base']:.4f}, "
        f"tuned {n['tuned']:.4f} ({n['tuned'] / n['base'] - 1:+.2%}). Greedy outputs (64 "
        f"tokens) on {g['prompts']} held-out prompts: {g['identical']} identical, first "
        f"difference after {g['mean_common_prefix']:.1f} tokens on average.",
    ]
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    main()
