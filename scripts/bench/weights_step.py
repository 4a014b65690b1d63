"""Step time of a real model shape with float and int8 weights (random weights), at a few
step sizes: what int8 saves where the weights dominate the step (accelerators, batch 1).

    python scripts/bench/weights_step.py --model llama2-7b --dtype bfloat16 \
        --out benchmarks/gpu/weights_step_llama2_7b

Writes OUT.json and OUT.md.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import jax
import numpy as np
from cost_curve import model_and_params

from lookahead_jax.checkpoints.loading import resolve_dtype
from lookahead_jax.decoding.autotune import compiled_step, run_time
from lookahead_jax.models.llama import LlamaLM, quantize_params


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="llama2-7b")
    ap.add_argument("--dtype", default="bfloat16")
    ap.add_argument("--tokens", default="1,16,64")
    ap.add_argument("--context", type=int, default=512)
    ap.add_argument("--repeats", type=int, default=10)
    ap.add_argument(
        "--options",
        default="{}",
        help="XLA compiler options for the int8 programs (JSON), beside the defaults: "
        "e.g. '{\"xla_gpu_enable_triton_gemm\": true}'",
    )
    ap.add_argument("--out", default="benchmarks/gpu/weights_step")
    args = ap.parse_args()

    cfg, params = model_and_params(args.model, resolve_dtype(args.dtype))
    rows = []
    variants = [("float", None), ("int8", None)]
    if json.loads(args.options):
        variants.append(("int8", json.loads(args.options)))
    for weights, options in variants:
        if weights == "int8" and options is None:
            params = quantize_params(params, cfg)  # the float params go as they are replaced
        n_bytes = int(sum(x.nbytes for x in jax.tree.leaves(params)))
        for t in (int(x) for x in args.tokens.split(",")):
            lm = LlamaLM(cfg, weights)
            exe, xs = compiled_step(lm, params, t, args.context, t > 1, 1, options)
            step = float(np.median([run_time(exe, xs) for _ in range(args.repeats)]))
            del exe, xs
            rows.append(
                {
                    "weights": weights,
                    "options": options,
                    "tokens": t,
                    "step_ms": 1e3 * step,
                    "param_bytes": n_bytes,
                    "weight_gbps": n_bytes / step / 1e9,
                }
            )
            print(rows[-1], flush=True)
    device = jax.devices()[0]
    result = {
        "command": " ".join(["python", *sys.argv]),
        "model": args.model,
        "dtype": args.dtype,
        "device": f"{device.platform}:{device.device_kind}",
        "jax": jax.__version__,
        "context": args.context,
        "rows": rows,
    }
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.with_name(out.name + ".json").write_text(json.dumps(result, indent=2) + "\n")
    lines = [
        f"# float and int8 weights: {args.model} ({args.dtype}) on {result['device']}",
        "",
        f"`{result['command']}` — batch 1, a {args.context}-token cache, median of "
        f"{args.repeats} steps, random weights.",
        "",
        "| weights | XLA options | param bytes | T | step | weights GB/s |",
        "|---|---|---|---|---|---|",
    ]
    for r in rows:
        lines.append(
            f"| {r['weights']} | {json.dumps(r['options']) if r['options'] else 'default'} | "
            f"{r['param_bytes'] / 1e9:.2f} GB | {r['tokens']} | "
            f"{r['step_ms']:.2f} ms | {r['weight_gbps']:.0f} |"
        )
    out.with_name(out.name + ".md").write_text("\n".join(lines) + "\n")


if __name__ == "__main__":
    main()
