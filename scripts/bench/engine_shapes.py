"""The continuous-batching engine on real model shapes (random weights) at large batches:
tokens/s per layout and batch size, and plain decoding as a fraction of the memory
roofline.

For each batch size B, `lj.Engine(batch=B)` decodes 2B random prompts of `--prompt-len`
tokens, `--new-tokens` each (no EOS: random weights, every row runs its whole budget),
once to compile and once timed. Random weights make guesses land rarely, so lookahead
figures here show what its steps cost at batch, not the speedup a real model gets (that
is scripts/bench/bench.py's job on the real SmolLM2).

Roofline: a plain step reads every weight once and each row's K/V cache; at the copy
bandwidth (a device-to-device copy, bytes read + written) that bounds plain tokens/s at
B / (bytes per step / bandwidth).

    python scripts/bench/engine_shapes.py --model llama2-7b --dtype bfloat16 \
        --batches 1,8,32,64 --layouts plain,auto,16 --out benchmarks/gpu/engine_llama2_7b
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import jax
import jax.numpy as jnp
from cost_curve import SHAPES, bench_model, cache_bytes_read, copy_bandwidth
from step_overhead import random_prompts

import lookahead_jax as lj
from lookahead_jax.checkpoints.loading import resolve_dtype


def layout_arg(name: str):
    if name == "plain":
        return None
    if name == "auto":
        return "auto"
    return lj.LookaheadConfig.for_budget(int(name))


def run_once(model, prompts, batch: int, layout, new_tokens: int) -> dict:
    engine = lj.Engine(
        model,
        batch=batch,
        max_new_tokens=new_tokens,
        lookahead=layout,
        max_prompt_tokens=len(prompts[0]),
    )
    t = time.perf_counter()
    results = list(engine.run(prompts))
    seconds = time.perf_counter() - t
    tokens = sum(len(r.token_ids) for r in results)
    config = engine.stats["config"]
    return {
        "seconds": seconds,
        "new_tokens": tokens,
        "tokens_per_s": tokens / seconds,
        "row_steps": engine.stats["row_steps"],
        "rounds": engine.stats["rounds"],
        "compile_s": engine.stats["compile_s"],
        "layout": config["lookahead"],
        "auto_choice": config.get("lookahead_auto"),
        "switched_to_plain_after_steps": (config.get("lookahead_auto") or {}).get(
            "switched_to_plain_after_steps"
        ),
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="llama2-7b", help=f"one of {', '.join(SHAPES)}")
    ap.add_argument("--dtype", default="bfloat16")
    ap.add_argument("--batches", default="1,8,32,64")
    ap.add_argument("--layouts", default="plain,auto,16", help="plain, auto or a budget T")
    ap.add_argument("--prompt-len", type=int, default=128)
    ap.add_argument("--new-tokens", type=int, default=128)
    ap.add_argument("--out", default="benchmarks/gpu/engine_shapes")
    args = ap.parse_args()

    dtype = resolve_dtype(args.dtype)
    model = bench_model(args.model, dtype)
    cfg = model.cfg
    weight_bytes = sum(x.nbytes for x in jax.tree.leaves(model.params))
    bandwidth = copy_bandwidth()
    device = jax.devices()[0]
    record = {
        "command": " ".join(["python", *sys.argv]),
        "model": args.model,
        "dtype": args.dtype,
        "device": f"{device.platform}:{device.device_kind}",
        "jax": jax.__version__,
        "weight_bytes": weight_bytes,
        "copy_bandwidth_Bps": bandwidth,
        "rows": [],
    }
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    for batch in (int(b) for b in args.batches.split(",")):
        prompts = random_prompts(cfg.vocab_size, 2 * batch, args.prompt_len, seed=batch)
        # mean cache length a row's step reads: the prompt and half the new tokens
        context = args.prompt_len + args.new_tokens // 2
        step_bytes = weight_bytes + cache_bytes_read(cfg, batch, context, dtype)
        roofline = batch * bandwidth / step_bytes
        for name in args.layouts.split(","):
            layout = layout_arg(name)
            first = run_once(model, prompts, batch, layout, args.new_tokens)
            r = run_once(model, prompts, batch, layout, args.new_tokens)
            row = {
                "batch": batch,
                "layout": name,
                **r,
                "first_run_s": first["seconds"],
                "roofline_tokens_per_s": roofline,
                "of_roofline": r["tokens_per_s"] / roofline,
            }
            record["rows"].append(row)
            out.with_name(out.name + ".json").write_text(json.dumps(record, indent=2) + "\n")
            print(
                f"{args.model} B={batch:3d} {name:>5}: {r['tokens_per_s']:9.1f} tok/s "
                f"({100 * row['of_roofline']:5.1f} % of the plain roofline "
                f"{roofline:8.1f}), {r['new_tokens'] / r['row_steps']:.2f} tok/row-step, "
                f"first run {first['seconds']:.1f} s, layout {r['layout']}",
                flush=True,
            )
        jax.clear_caches()
    print(f"wrote {out}.json; dtype {jnp.dtype(dtype).name}")


if __name__ == "__main__":
    main()
