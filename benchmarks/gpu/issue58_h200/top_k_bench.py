"""vocab_top_k.top_k (two stages) against jax.lax.top_k on this machine's first device:
the shapes token recycling (k = 8) and logprobs (k = 20) read each step, SmolLM2's
vocabulary. Same values asserted; the median and min of 200 calls after 20 untimed.

    python3 benchmarks/gpu/issue58_h200/top_k_bench.py OUT.json
"""

import json
import sys
import time

import jax
import numpy as np

from lookahead_jax import vocab_top_k

V = 49152
SHAPES = [(1, V), (15, V), (16, 15, V), (16, 1, V)]
REPEATS, WARM = 200, 20


def times_ms(fn, x) -> list[float]:
    for _ in range(WARM):
        jax.block_until_ready(fn(x))
    out = []
    for _ in range(REPEATS):
        t = time.perf_counter()
        jax.block_until_ready(fn(x))
        out.append((time.perf_counter() - t) * 1e3)
    return out


def main() -> None:
    rng = np.random.default_rng(0)
    rows = []
    for shape in SHAPES:
        x = jax.device_put(rng.standard_normal(shape).astype(np.float32))
        for k in (8, 20):
            lax_fn = jax.jit(lambda x, k=k: jax.lax.top_k(x, k))
            two_fn = jax.jit(lambda x, k=k: vocab_top_k.top_k(x, k))
            np.testing.assert_array_equal(lax_fn(x)[0], two_fn(x)[0])
            row = {"shape": list(shape), "k": k}
            for name, fn in (("lax_top_k", lax_fn), ("two_stage", two_fn)):
                t = times_ms(fn, x)
                row[name] = {"median_ms": float(np.median(t)), "min_ms": float(np.min(t))}
            row["two_stage_over_lax_median"] = round(
                row["two_stage"]["median_ms"] / row["lax_top_k"]["median_ms"], 3
            )
            rows.append(row)
            print(json.dumps(row))
    d = jax.devices()[0]
    result = {
        "command": "python3 benchmarks/gpu/issue58_h200/top_k_bench.py OUT.json",
        "device": d.device_kind,
        "jax": jax.__version__,
        "rows": rows,
    }
    with open(sys.argv[1], "w") as f:
        json.dump(result, f, indent=1)


if __name__ == "__main__":
    main()
