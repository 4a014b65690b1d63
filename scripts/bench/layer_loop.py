"""How the forward's loop over layers is compiled, and what it costs: the step latency
of a random-weight model of a real shape with `lax.scan` over the stacked layers at
several unroll factors (unroll = number of layers: no loop at all).

A loop over stacked weights slices one layer's weights per iteration; if XLA copies
the slice before the matmul instead of reading it in place, a weight-bound step moves
its weights three times (read, write, read).

    python scripts/bench/layer_loop.py --model llama2-7b --dtype bfloat16 \
        --out benchmarks/gpu/layer_loop_llama2_7b
"""

from __future__ import annotations

import argparse
import functools
import itertools
import json
import sys
import time
from pathlib import Path

import jax
import numpy as np
from cost_curve import SHAPES, model_and_params

from lookahead_jax.checkpoints.loading import resolve_dtype
from lookahead_jax.decoding.autotune import compiled_step, run_time
from lookahead_jax.models.llama import LlamaLM

_SCAN = jax.lax.scan


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="llama2-7b", help=f"one of {', '.join(SHAPES)}")
    ap.add_argument("--dtype", default="bfloat16")
    ap.add_argument("--unroll", default="1,2,4,all")
    ap.add_argument(
        "--options",
        default="{}",
        help="JSON list of XLA compiler-option dicts to try at each unroll, e.g. "
        "'[{}, {\"xla_gpu_enable_dynamic_slice_fusion\": true}]'",
    )
    ap.add_argument("--tokens", default="1,16")
    ap.add_argument("--batch", type=int, default=1)
    ap.add_argument("--context", type=int, default=512)
    ap.add_argument("--repeats", type=int, default=20)
    ap.add_argument("--out", default="benchmarks/gpu/layer_loop")
    args = ap.parse_args()

    cfg, params = model_and_params(args.model, resolve_dtype(args.dtype))
    weight_bytes = sum(x.nbytes for x in jax.tree.leaves(params))
    options = json.loads(args.options)
    options = options if isinstance(options, list) else [options]
    rows = []
    for u in args.unroll.split(","):
        unroll = cfg.num_layers if u == "all" else int(u)
        jax.lax.scan = functools.partial(_SCAN, unroll=unroll)
        try:
            for opts, t in itertools.product(options, (int(x) for x in args.tokens.split(","))):
                t0 = time.perf_counter()
                try:
                    exe, xs = compiled_step(
                        LlamaLM(cfg), params, t, args.context, t > 1, args.batch, opts
                    )
                except Exception as e:  # an option this XLA does not know
                    print(f"unroll {unroll} {opts}: {type(e).__name__}: {e}"[:300], flush=True)
                    continue
                compile_s = time.perf_counter() - t0
                step_s = float(np.median([run_time(exe, xs) for _ in range(args.repeats)]))
                rows.append(
                    {
                        "unroll": unroll,
                        "options": opts,
                        "tokens": t,
                        "step_ms": 1000 * step_s,
                        "weight_gbps": weight_bytes / step_s / 1e9,
                        "compile_s": compile_s,
                    }
                )
                print(rows[-1], flush=True)
        finally:
            jax.lax.scan = _SCAN
    device = jax.devices()[0]
    result = {
        "command": " ".join(["python", *sys.argv]),
        "model": args.model,
        "dtype": args.dtype,
        "device": f"{device.platform}:{device.device_kind}",
        "jax": jax.__version__,
        "batch": args.batch,
        "context": args.context,
        "weight_bytes": int(weight_bytes),
        "rows": rows,
    }
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.with_name(out.name + ".json").write_text(json.dumps(result, indent=2) + "\n")


if __name__ == "__main__":
    main()
