"""What a decoding step costs beyond its forward pass, per layout, and each layout's
compile time.

For each batch size and layout (plain, or LookaheadConfig.for_budget(T)), decodes
random prompts with a random-weight model of a real shape through `lj.generate` (the
whole on-device loop: guess sources, tree merge, verification, commit, while loop), and
compares its time per step with one bare forward pass of the same T tokens per row over a
cache of the same length (scripts/bench/cost_curve.py's pass). The difference is what the step
spends outside the forward. Random weights make the guesses land rarely, which changes
the number of steps, not what one step costs.

compile_s is the first generate's compile time; run the script twice with the same
LOOKAHEAD_JAX_CACHE to see the persistent compilation cache's effect (`--cache-label`).

    python scripts/bench/step_overhead.py --model llama2-7b --dtype bfloat16 --batch 1,8 \
        --out benchmarks/gpu/step_overhead_llama2_7b
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import jax
import numpy as np
from cost_curve import SHAPES, bench_model

import lookahead_jax as lj
from lookahead_jax.cache_dir import enable_compilation_cache
from lookahead_jax.checkpoints.loading import resolve_dtype
from lookahead_jax.decoding.autotune import compiled_step, run_time


def random_prompts(vocab: int, batch: int, length: int, seed: int = 0) -> list[list[int]]:
    rng = np.random.default_rng(seed)
    return rng.integers(3, vocab, size=(batch, length)).tolist()


def forward_s(model, tokens: int, context: int, batch: int, all_logits: bool, repeats: int):
    exe, args = compiled_step(model.lm, model.params, tokens, context, all_logits, batch)
    return float(np.median([run_time(exe, args) for _ in range(repeats)]))


def measure_layout(model, prompts, layout, new_tokens: int, repeats: int) -> dict:
    config = None if layout == "plain" else lj.LookaheadConfig.for_budget(int(layout))
    first = lj.generate(model, prompts, max_new_tokens=new_tokens, lookahead=config)
    runs = [
        lj.generate(model, prompts, max_new_tokens=new_tokens, lookahead=config).stats
        for _ in range(repeats)
    ]
    step_ms = [r["step_ms"] for r in runs]
    return {
        "layout": layout,
        "step_tokens": 1 if config is None else config.tokens_per_step,
        "compile_s": first.stats["compile_s"],
        "step_ms": {"min": min(step_ms), "median": float(np.median(step_ms))},
        "steps": max(first.steps),
        "compression": runs[0]["compression"],
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="llama2-7b", help=f"one of {', '.join(SHAPES)}")
    ap.add_argument("--dtype", default="bfloat16")
    ap.add_argument("--batch", default="1,8")
    ap.add_argument("--layouts", default="plain,8,16,32,64")
    ap.add_argument("--prompt-len", type=int, default=512)
    ap.add_argument("--new-tokens", type=int, default=128)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--cache-label", default="", help="e.g. cold / warm, for the record")
    ap.add_argument("--out", default="benchmarks/gpu/step_overhead")
    args = ap.parse_args()

    enable_compilation_cache()
    dtype = resolve_dtype(args.dtype)
    model = bench_model(args.model, dtype)
    cfg = model.cfg
    context = args.prompt_len + args.new_tokens // 2  # the cache's mean length while decoding
    rows = []
    for batch in (int(x) for x in args.batch.split(",")):
        prompts = random_prompts(cfg.vocab_size, batch, args.prompt_len)
        for layout in args.layouts.split(","):
            r = measure_layout(model, prompts, layout, args.new_tokens, args.repeats)
            plain = layout == "plain"
            fwd = forward_s(model, r["step_tokens"], context, batch, not plain, 10)
            r.update(
                batch=batch,
                forward_ms=1000 * fwd,
                outside_forward=1 - fwd / (r["step_ms"]["median"] / 1000),
            )
            rows.append(r)
            write(args, cfg_record(args, context), rows)  # so far: a cut-off run keeps it
            print(
                f"B={batch} {layout:>5}: T={r['step_tokens']:3d} step "
                f"{r['step_ms']['median']:7.2f} ms, forward {r['forward_ms']:7.2f} ms, "
                f"outside {100 * r['outside_forward']:5.1f} %, compile {r['compile_s']:6.1f} s",
                flush=True,
            )
    print(f"wrote {args.out}.json")


def cfg_record(args, context: int) -> dict:
    device = jax.devices()[0]
    return {
        "command": " ".join(["python", *sys.argv]),
        "model": args.model,
        "dtype": args.dtype,
        "device": f"{device.platform}:{device.device_kind}",
        "jax": jax.__version__,
        "cache_label": args.cache_label,
        "context_for_forward": context,
    }


def write(args, record: dict, rows: list[dict]) -> None:
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    text = json.dumps({**record, "rows": rows}, indent=2) + "\n"
    out.with_name(out.name + ".json").write_text(text)


if __name__ == "__main__":
    main()
