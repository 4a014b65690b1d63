"""Top-k / top-p filtering on the CPU: the sort-based filter (before issue 34, kept here
as the reference) against the threshold search that replaced it
(lookahead_jax.decoding.sampling._top_k_top_p), side by side in one run, repeats
interleaved, at the vocabularies of SmolLM2 (49152) and Llama 3 (128256).

    python scripts/bench/topk_topp.py --out benchmarks/cpu/topk_topp

Each call filters B rows of one position each (a lookahead step of R positions filters
B * R rows). Logits are N(0, 2^2) float32; three settings: top-k 50 with top-p 0.9, top-p
0.9 alone, top-k 50 alone. Every call's output is checked equal between the two. Also
reports the size of the compiled HLO of each. Writes OUT.json and OUT.md.
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import time
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np

from lookahead_jax.decoding.sampling import _top_k_top_p

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
from machine import cpu_model  # noqa: E402
from results import write_results  # noqa: E402

# the filter before issue 34, kept once: as the test's reference
from tests.test_sampling_filter import sorted_top_k_top_p  # noqa: E402

VOCABS = {"SmolLM2": 49152, "Llama 3": 128256}
SETTINGS = {"k50_p0.9": (50, 0.9), "p0.9": (None, 0.9), "k50": (50, None)}


IMPLS = {"sort": jax.jit(sorted_top_k_top_p), "threshold": jax.jit(_top_k_top_p)}


def hlo_size(fn, *args) -> dict:
    compiled = fn.lower(*args).compile().as_text()
    return {"chars": len(compiled), "lines": compiled.count("\n")}


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", default="benchmarks/cpu/topk_topp")
    ap.add_argument("--batches", default="1,8,32")
    ap.add_argument("--repeats", type=int, default=7)
    args = ap.parse_args()
    batches = [int(b) for b in args.batches.split(",")]
    rng = np.random.default_rng(0)
    rows = []
    for model, vocab in VOCABS.items():
        for batch in batches:
            x = jnp.asarray(2 * rng.standard_normal((batch, 1, vocab)), jnp.float32)
            for setting, (k, p) in SETTINGS.items():
                k_b = jnp.full(batch, k or vocab, jnp.int32)
                p_b = jnp.full(batch, p or 1.0, jnp.float32)
                outs = {name: fn(x, k_b, p_b).block_until_ready() for name, fn in IMPLS.items()}
                assert np.array_equal(*(np.asarray(o) for o in outs.values())), setting
                kept = int(np.sum(np.asarray(outs["sort"]) > -np.inf))
                times = {name: [] for name in IMPLS}
                for _ in range(args.repeats):
                    for name, fn in IMPLS.items():
                        t0 = time.perf_counter()
                        fn(x, k_b, p_b).block_until_ready()
                        times[name].append(time.perf_counter() - t0)
                row = {"model": model, "vocab": vocab, "batch": batch, "setting": setting}
                row["kept_tokens"] = kept
                for name, ts in times.items():
                    row[f"{name}_min_ms"] = 1e3 * min(ts)
                    row[f"{name}_median_ms"] = 1e3 * statistics.median(ts)
                row["speedup_median"] = row["sort_median_ms"] / row["threshold_median_ms"]
                rows.append(row)
                print({k: round(v, 2) if isinstance(v, float) else v for k, v in row.items()})

    x = jnp.zeros((8, 1, VOCABS["Llama 3"]), jnp.float32)
    k_b, p_b = jnp.full(8, 50, jnp.int32), jnp.full(8, 0.9, jnp.float32)
    hlo = {name: hlo_size(fn, x, k_b, p_b) for name, fn in IMPLS.items()}
    cpu = cpu_model()
    lscpu = subprocess.run(["lscpu"], capture_output=True, text=True).stdout
    cpus = [ln.split(":")[1].strip() for ln in lscpu.splitlines() if ln.startswith("CPU(s):")]
    cores = cpus[0] if cpus else "?"
    command = "python scripts/bench/topk_topp.py " + " ".join(sys.argv[1:])
    result = {
        "command": command,
        "cpu": cpu,
        "cpus": cores,
        "jax": jax.__version__,
        "repeats": args.repeats,
        "rows": rows,
        "compiled_hlo_B8_V128256": hlo,
    }
    md = [
        "# Top-k / top-p filter on the CPU: sort vs threshold search\n",
        f"`{command}` on {cpu} ({cores} CPUs, shared), JAX {jax.__version__}; "
        f"{args.repeats} repeats interleaved, ms per call. B rows of one position each, "
        "logits N(0, 2^2) float32; outputs checked equal. `sort`: the filter before "
        "issue 34; `threshold`: bisection on the value (sampling._top_k_top_p).\n",
        "| model (V) | B | setting | kept (all rows) | sort min | sort median | threshold min "
        "| threshold median | speedup (median) |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        md.append(
            f"| {r['model']} ({r['vocab']}) | {r['batch']} | {r['setting']} | {r['kept_tokens']} "
            f"| {r['sort_min_ms']:.1f} | {r['sort_median_ms']:.1f} | {r['threshold_min_ms']:.1f} "
            f"| {r['threshold_median_ms']:.1f} | {r['speedup_median']:.1f}x |"
        )
    md.append("\nCompiled HLO (B=8, V=128256, `compile().as_text()`):\n")
    md.append("| filter | characters | lines |\n|---|---|---|")
    for name, h in hlo.items():
        md.append(f"| {name} | {h['chars']} | {h['lines']} |")
    write_results(args.out, result, "\n".join(md) + "\n")


if __name__ == "__main__":
    main()
