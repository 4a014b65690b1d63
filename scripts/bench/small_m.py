"""Each matmul shape of SmolLM2-135M at M = 1 .. 64 rows: time, GB/s and GFLOP/s for
XLA as the product compiles it, each XLA:CPU library option, numpy's BLAS, PyTorch, and
the project's small-M kernel (models/cpu_kernel/), side by side in one process.

A shape is timed over 30 distinct weight matrices (one per layer, as the model holds
them; the LM head once), `x[M, K] @ W_l[K, N]` for every l in one call, so the weights
stream from memory as in a decode step (30 layers of gate/up are 106 MB, beyond the
32 MB L3). min and median of `--repeats` calls after a warm-up.

    python scripts/bench/small_m.py --out benchmarks/cpu/small_m
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

D, F, H_DH, KV_DH, V, LAYERS = 576, 1536, 576, 192, 49152, 30
SHAPES = {  # name: (K, N, copies)
    "q": (D, H_DH, LAYERS),
    "k/v": (D, KV_DH, LAYERS),
    "o": (H_DH, D, LAYERS),
    "gate/up": (D, F, LAYERS),
    "down": (F, D, LAYERS),
    "lm_head": (D, V, 1),
}
NO_YNN = {"xla_cpu_experimental_ynn_fusion_type": ""}
XLA_OPTIONS = {  # jaxlib 0.10.2: dots of M > 1 go to YNNPACK by default (a __ynn_fusion)
    "xla": {},
    "xla+ynn_off": NO_YNN,
    "xla+xnnpack": {"xla_cpu_use_xnnpack": True},
    "xla+onednn": {"xla_cpu_use_onednn": True},
    "xla+onednn_fusion=dot": {
        **NO_YNN,
        "xla_cpu_experimental_onednn_fusion_type": "LIBRARY_FUSION_TYPE_DOT",
    },
    "xla+xnn_fusion=dot": {
        **NO_YNN,
        "xla_cpu_experimental_xnn_fusion_type": "LIBRARY_FUSION_TYPE_DOT",
    },
    "xla+xnn_graph=greedy": {
        **NO_YNN,
        "xla_cpu_experimental_xnn_graph_fusion_mode": "XNN_GRAPH_FUSION_MODE_GREEDY",
    },
}
LIBRARIES = ("ynn", "xnn", "onednn")  # what the optimized HLO names a library fusion by


def best_of(fn, repeats: int) -> tuple[float, float]:
    fn()
    ts = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        ts.append(time.perf_counter() - t0)
    return min(ts), float(np.median(ts))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--ms", default="1,2,4,8,16,32,64")
    ap.add_argument("--shapes", default=",".join(SHAPES))
    ap.add_argument("--variants", default=",".join([*XLA_OPTIONS, "numpy", "torch", "kernel"]))
    ap.add_argument("--repeats", type=int, default=7)
    ap.add_argument("--out", default="benchmarks/cpu/small_m")
    args = ap.parse_args()

    import jax.numpy as jnp
    import torch
    from machine import cpu_model

    torch.set_num_threads(os.cpu_count() or 1)
    variants = args.variants.split(",")
    rng = np.random.default_rng(0)
    rows = []
    for shape in args.shapes.split(","):
        K, N, copies = SHAPES[shape]
        ws = [(0.02 * rng.standard_normal((K, N))).astype(np.float32) for _ in range(copies)]
        jws = [jnp.asarray(w) for w in ws]
        tws = [torch.from_numpy(w) for w in ws]
        panels = [jnp.asarray(w.reshape(K, N // 16, 16).transpose(1, 0, 2).copy()) for w in ws]
        for M in [int(m) for m in args.ms.split(",")]:
            x = rng.standard_normal((M, K)).astype(np.float32)
            jx, tx = jnp.asarray(x), torch.from_numpy(x)
            for variant in variants:
                made = runner(variant, (jx, jws), (x, ws), (tx, tws), (jx, panels))
                if made is None:
                    continue
                if isinstance(made, str):  # an option this jaxlib refuses: say so
                    rows.append({"shape": shape, "M": M, "variant": variant, "error": made})
                    continue
                run, calls = made
                t_min, t_med = best_of(run, args.repeats)
                nbytes, flops = copies * K * N * 4, 2 * M * copies * K * N
                rows.append(
                    {
                        "shape": shape,
                        "K": K,
                        "N": N,
                        "copies": copies,
                        "M": M,
                        "variant": variant,
                        "calls": calls,
                        "ms": {"min": 1e3 * t_min, "median": 1e3 * t_med},
                        "gb_s": nbytes / t_min / 1e9,
                        "gflop_s": flops / t_min / 1e9,
                    }
                )
                print(json.dumps(rows[-1]), file=sys.stderr, flush=True)
    result = {"cpu": cpu_model(), "command": " ".join(sys.argv), "rows": rows}
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.with_suffix(".json").write_text(json.dumps(result, indent=1))
    out.with_suffix(".table.md").write_text(table(result))
    print(table(result))


def runner(variant: str, xla_args, numpy_args, torch_args, kernel_args):
    """(a function running the shape's matmuls once, what it calls), the error message of
    an XLA option this jaxlib refuses, or None where the kernel does not run here."""
    import jax

    from lookahead_jax.models import cpu_kernel

    if variant in XLA_OPTIONS:
        f = jax.jit(lambda x, ws: [x @ w for w in ws])
        try:
            exe = f.lower(*xla_args).compile(compiler_options=XLA_OPTIONS[variant])
        except Exception as e:
            return str(e).splitlines()[0][:200]
        text = exe.as_text()
        libs = [lib for lib in LIBRARIES if f"{lib}_fusion" in text or f"__{lib}" in text]
        return (lambda: jax.block_until_ready(exe(*xla_args))), (libs or ["xla's own dot"])[0]
    if variant == "numpy":
        x, ws = numpy_args
        return (lambda: [x @ w for w in ws]), "numpy's BLAS"
    if variant == "torch":
        x, ws = torch_args
        return (lambda: [x @ w for w in ws]), "torch"
    if variant == "kernel":
        if not cpu_kernel.available():
            return None
        g = jax.jit(lambda x, ps: [cpu_kernel.matmul(x, p) for p in ps])
        return (lambda: jax.block_until_ready(g(*kernel_args))), "models/cpu_kernel"
    raise SystemExit(f"unknown variant {variant}")


def table(result: dict) -> str:
    """One markdown table a shape: variants down, M across, ms (min) and x of M = 1."""
    lines = [f"Measured on {result['cpu']}: `{result['command']}`", ""]
    by_shape: dict = {}
    for r in result["rows"]:
        by_shape.setdefault(r["shape"], []).append(r)
    for shape, rs in by_shape.items():
        ms = sorted({r["M"] for r in rs})
        k, n, c = next((r["K"], r["N"], r["copies"]) for r in rs if "K" in r)
        lines += [
            f"### {shape}: K = {k}, N = {n}, {c} matrices ({c * k * n * 4 / 1e6:.0f} MB)",
            "",
            "| variant | " + " | ".join(f"M = {m}" for m in ms) + " |",
            "|---|" + "---|" * len(ms),
        ]
        for variant in dict.fromkeys(r["variant"] for r in rs):
            cells = []
            one = next((r for r in rs if r["variant"] == variant and r["M"] == 1), None)
            for m in ms:
                r = next((r for r in rs if r["variant"] == variant and r["M"] == m), None)
                if r is None or "error" in r:
                    cells.append("refused" if r else "")
                    continue
                x = f" ({r['ms']['min'] / one['ms']['min']:.2f}x)" if one and "ms" in one else ""
                cells.append(
                    f"{r['ms']['min']:.2f}{x}, {r['gb_s']:.0f} GB/s, {r['gflop_s']:.0f} GF/s"
                )
            calls = sorted({r.get("calls", "") for r in rs if r["variant"] == variant} - {""})
            lines.append(f"| {variant} ({', '.join(calls)}) | " + " | ".join(cells) + " |")
        lines.append("")
    return "\n".join(lines)


if __name__ == "__main__":
    main()
