"""The attention over the cache alone: llama.attention with XLA's loop over 64-position
blocks against the CPU kernel (models/cpu_kernel/cache_attention.cc), for SmolLM2-135M's
30 layers (3 kv heads of 3 query heads, head dim 64), each layer its own cache as in the
model (so the K/V come from memory, not the CPU's caches), one jitted program per case.

    python scripts/bench/cache_attention.py --out benchmarks/cpu/cache_attention

Cases: B rows x T new tokens over `--context` cached positions of a 512-position cache;
ms for the 30 layers (min / median of `--repeats`) and the K/V bytes read per ms.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))

LAYERS, KV_HEADS, Q_PER_KV, HEAD_DIM, POSITIONS = 30, 3, 3, 64, 512
CASES = [(1, 1), (1, 8), (1, 16), (16, 1)]  # (rows, tokens)


def program(B: int, T: int, context: int, kernel: bool, rng):
    """(jitted 30-layer attention, its arguments)."""
    import jax
    import jax.numpy as jnp

    from lookahead_jax.models.llama import attention

    def normal(*shape):
        return jnp.asarray(rng.standard_normal(shape).astype(np.float32))

    shape = (B, KV_HEADS, POSITIONS, HEAD_DIM)
    caches = [(normal(*shape), normal(*shape)) for _ in range(LAYERS)]
    q = normal(B, T, KV_HEADS, Q_PER_KV, HEAD_DIM)
    new_kv = normal(B, KV_HEADS, T, HEAD_DIM)
    lengths = jnp.full((B,), context, jnp.int32)
    positions = lengths[:, None] + jnp.arange(T, dtype=jnp.int32)[None]
    mask = jnp.tril(jnp.ones((T, T), bool))[None]

    @jax.jit
    def layers(q, caches):
        for k, v in caches:  # each layer's output feeds the next, as in the model
            out = attention(q, new_kv, new_kv, mask, k, v, lengths, positions, kernel=kernel)
            q = q + 1e-3 * out
        return q

    return layers, (q, caches)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--context", type=int, default=256)
    ap.add_argument("--repeats", type=int, default=10)
    ap.add_argument("--out", default="benchmarks/cpu/cache_attention")
    args = ap.parse_args()

    import jax
    from machine import cpu_model
    from results import write_results

    from lookahead_jax.models import cpu_kernel

    if not cpu_kernel.available():
        raise SystemExit("the CPU kernel does not run here")
    rng = np.random.default_rng(0)
    progs = {
        (B, T, kernel): program(B, T, args.context, kernel, rng)
        for B, T in CASES
        for kernel in (False, True)
    }
    times = {k: [] for k in progs}
    for r in range(args.repeats + 1):  # interleaved; the first round compiles and warms up
        for key, (fn, fn_args) in progs.items():
            t0 = time.perf_counter()
            jax.block_until_ready(fn(*fn_args))
            if r:
                times[key].append(1000 * (time.perf_counter() - t0))
    rows = []
    for B, T in CASES:
        kv_bytes = 2 * LAYERS * B * KV_HEADS * args.context * HEAD_DIM * 4
        row = {"batch": B, "tokens": T, "kv_mb": kv_bytes / 1e6}
        for kernel in (False, True):
            ts = times[(B, T, kernel)]
            name = "kernel" if kernel else "xla"
            row[name] = {"min": min(ts), "median": float(np.median(ts))}
            row[f"{name}_gbps"] = kv_bytes / (min(ts) / 1000) / 1e9
        row["xla_over_kernel"] = row["xla"]["min"] / row["kernel"]["min"]
        rows.append(row)
    result = {
        "cpu": cpu_model(),
        "context": args.context,
        "rows": rows,
        "command": "python " + " ".join(sys.argv),
    }
    lines = [
        f"# Attention over the cache: XLA against the CPU kernel ({result['cpu']})",
        "",
        f"`{result['command']}`",
        "",
        f"SmolLM2-135M's 30 layers (3 kv heads x 3, head dim 64), {args.context} cached "
        "positions per row, each layer its own cache.",
        "",
        "| rows | tokens | K/V MB | XLA ms (min / median) | kernel ms (min / median) "
        "| kernel GB/s | XLA / kernel |",
        "|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        x, k = r["xla"], r["kernel"]
        lines.append(
            f"| {r['batch']} | {r['tokens']} | {r['kv_mb']:.1f} | {x['min']:.2f} / "
            f"{x['median']:.2f} | {k['min']:.2f} / {k['median']:.2f} | "
            f"{r['kernel_gbps']:.1f} | {r['xla_over_kernel']:.2f} |"
        )
    write_results(args.out, result, "\n".join(lines) + "\n")


if __name__ == "__main__":
    main()
