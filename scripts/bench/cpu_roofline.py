"""Plain decoding against the memory roofline on this CPU: the per-token time of plain
greedy decoding (the on-device loop, batch 1) of SmolLM2-135M with float32, bfloat16 and
int8 weights, against PyTorch streaming the same float32 weight bytes through one
matrix-vector product per matrix (the practical roofline), and the layer loop's share of
the gap. One run, repeats interleaved.

    python scripts/bench/cpu_roofline.py --out benchmarks/cpu/roofline

Effective GB/s = bytes of the params / time per token. Writes OUT.json and OUT.md.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")  # PyTorch's idle threads must not spin

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402

import lookahead_jax as lj  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parent))
from machine import cpu_model  # noqa: E402
from results import write_results  # noqa: E402

PROMPT = "Write a long story about a lighthouse keeper and a storm, in ten paragraphs."


def param_bytes(params) -> int:
    return int(sum(x.nbytes for x in jax.tree.leaves(params)))


def torch_gemv(shapes: list[tuple[int, int]], layout: str):
    """A function streaming every [out, in] matrix of `shapes` through one float32
    matrix-vector product each, the way a decode step reads them; and their bytes."""
    import torch

    torch.set_num_threads(os.cpu_count() or 1)
    gen = torch.Generator().manual_seed(0)
    if layout == "out_in":  # nn.Linear's layout: y = W x
        ws = [torch.randn(o, i, generator=gen) * 0.02 for o, i in shapes]
        xs = {i: torch.randn(i, generator=gen) for _, i in shapes}

        def run():
            for w in ws:
                torch.mv(w, xs[w.shape[1]])

    else:  # this project's layout: y = x W
        ws = [torch.randn(i, o, generator=gen) * 0.02 for o, i in shapes]
        xs = {i: torch.randn(1, i, generator=gen) for _, i in shapes}

        def run():
            for w in ws:
                torch.mm(xs[w.shape[0]], w)

    run()
    return run, sum(w.numel() * 4 for w in ws)


def layer_loop_probe(cfg, repeats: int) -> list[dict]:
    """The MLP of every layer at T=1 (float32), three ways: lax.scan over stacked weights
    (this project's forward), a Python loop over separate per-layer arrays, and a Python
    loop over slices of the stacked weights (what unrolling the scan gives)."""
    L, D, F = cfg.num_layers, cfg.hidden_size, cfg.intermediate_size
    key = jax.random.split(jax.random.PRNGKey(0), 3)
    wg, wu = (0.02 * jax.random.normal(k, (L, D, F)) for k in key[:2])
    wd = 0.02 * jax.random.normal(key[2], (L, F, D))
    x = jnp.ones((1, D))

    def mlp(x, g, u, d):
        return x + (jax.nn.silu(x @ g) * (x @ u)) @ d

    def scan(x, wg, wu, wd):
        return jax.lax.scan(lambda x, w: (mlp(x, *w), None), x, (wg, wu, wd))[0]

    def sliced(x, wg, wu, wd):
        for i in range(L):
            x = mlp(x, wg[i], wu[i], wd[i])
        return x

    def separate(x, gs, us, ds):
        for g, u, d in zip(gs, us, ds, strict=True):
            x = mlp(x, g, u, d)
        return x

    split = tuple([w[i] for i in range(L)] for w in (wg, wu, wd))
    cases = {
        "lax.scan over stacked layers": (scan, (x, wg, wu, wd)),
        "loop over separate per-layer arrays": (separate, (x, *split)),
        "loop over slices of stacked layers": (sliced, (x, wg, wu, wd)),
    }
    n_bytes = 3 * L * D * F * 4
    rows = []
    for name, (f, args) in cases.items():
        f = jax.jit(f)
        jax.block_until_ready(f(*args))
        times = []
        for _ in range(repeats):
            t0 = time.perf_counter()
            jax.block_until_ready(f(*args))
            times.append(time.perf_counter() - t0)
        rows.append(
            {
                "loop": name,
                "min_ms": 1e3 * min(times),
                "median_ms": 1e3 * float(np.median(times)),
                "gbps": n_bytes / min(times) / 1e9,
            }
        )
        print(rows[-1], flush=True)
    return rows


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--ckpt", default="smollm2-135m")
    ap.add_argument("--max-new-tokens", type=int, default=64)
    ap.add_argument("--repeats", type=int, default=10)
    ap.add_argument("--out", default="benchmarks/cpu/roofline")
    args = ap.parse_args()

    systems = {}
    for dtype, weights in (("float32", "float"), ("bfloat16", "float"), ("float32", "int8")):
        model = lj.load(args.ckpt, dtype=dtype, weights=weights)
        ids = [model.tokenizer.encode_prompt(PROMPT, chat=True)]

        def per_token(model=model, ids=ids):
            out = lj.generate(model, ids, max_new_tokens=args.max_new_tokens, lookahead=None)
            return out.stats["decode_s"] / max(out.steps[0], 1)

        per_token()  # compile
        name = "int8" if weights == "int8" else dtype
        systems[name] = (per_token, param_bytes(model.params))
    cfg = model.cfg
    D, F, H, K, Dh, V = (
        cfg.hidden_size,
        cfg.intermediate_size,
        cfg.num_heads,
        cfg.num_kv_heads,
        cfg.head_dim,
        cfg.vocab_size,
    )
    shapes = [(H * Dh, D), (K * Dh, D), (K * Dh, D), (D, H * Dh), (F, D), (F, D), (D, F)]
    shapes = shapes * cfg.num_layers + [(V, D)]
    for layout in ("out_in", "in_out"):
        run, n = torch_gemv(shapes, layout)

        def timed(run=run):
            t0 = time.perf_counter()
            run()
            return time.perf_counter() - t0

        systems[f"pytorch_gemv_{layout}"] = (timed, n)

    times = {name: [] for name in systems}
    for _ in range(args.repeats):  # interleaved: noise hits every system alike
        for name, (f, _) in systems.items():
            times[name].append(f())
    rows = []
    for name, (_, n) in systems.items():
        t = times[name]
        rows.append(
            {
                "system": name,
                "bytes": n,
                "min_ms": 1e3 * min(t),
                "median_ms": 1e3 * float(np.median(t)),
                "gbps_at_min": n / min(t) / 1e9,
                "gbps_at_median": n / float(np.median(t)) / 1e9,
            }
        )
        print(rows[-1], flush=True)
    roof = max(r["gbps_at_min"] for r in rows if r["system"].startswith("pytorch"))
    loop_rows = layer_loop_probe(cfg, args.repeats)
    result = {
        "command": " ".join(["python", *sys.argv]),
        "cpu": cpu_model(),
        "cores": os.cpu_count(),
        "jax": jax.__version__,
        "max_new_tokens": args.max_new_tokens,
        "repeats": args.repeats,
        "rows": rows,
        "pytorch_roofline_gbps": roof,
        "layer_loop": loop_rows,
    }
    write_results(args.out, result, markdown(result))


def markdown(r: dict) -> str:
    lines = [
        f"# Plain decoding against the memory roofline ({r['cpu']}, {r['cores']} cores)",
        "",
        f"`{r['command']}` — JAX {r['jax']}; time per token of plain greedy decoding "
        f"(batch 1, {r['max_new_tokens']} new tokens after a chat prompt, the on-device "
        f"loop); min and median of {r['repeats']} interleaved repeats. PyTorch streams the "
        "same float32 matrices (every layer's and the LM head) through one matrix-vector "
        "product each: the practical roofline.",
        "",
        "| system | weight bytes | per token (min) | per token (median) | GB/s (at min) | "
        "of PyTorch's best GB/s |",
        "|---|---|---|---|---|---|",
    ]
    for row in r["rows"]:
        lines.append(
            f"| {row['system']} | {row['bytes'] / 1e6:.0f} MB | {row['min_ms']:.2f} ms | "
            f"{row['median_ms']:.2f} ms | {row['gbps_at_min']:.1f} | "
            f"{row['gbps_at_min'] / r['pytorch_roofline_gbps']:.0%} |"
        )
    lines += [
        "",
        "The layer loop (float32, every layer's MLP alone at T=1):",
        "",
        "| loop | min | median | GB/s (at min) |",
        "|---|---|---|---|",
    ]
    for row in r["layer_loop"]:
        lines.append(
            f"| {row['loop']} | {row['min_ms']:.2f} ms | {row['median_ms']:.2f} ms | "
            f"{row['gbps']:.1f} |"
        )
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    main()
