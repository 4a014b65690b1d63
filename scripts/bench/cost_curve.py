"""Latency of one forward step against the number of tokens in it.

The step attends to a KV cache of `--context` tokens and feeds T new tokens
(T = 1 is a plain decoding step; a lookahead step feeds 1 + (N-1)W + G(N-1)).
Two curves: logits for every new token, and logits for one token (what a plain
step needs). Weights are random for the named shapes, so the 7B/8B shapes run
without a download.

    python scripts/bench/cost_curve.py --model smollm2-135m --out benchmarks/cpu/cost_curve
    python scripts/bench/cost_curve.py --model llama2-7b --dtype bfloat16 \
        --out benchmarks/gpu/cost_curve_llama2_7b
"""

from __future__ import annotations

import argparse
import functools
import json
import sys
import time
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np

from lookahead_jax.checkpoints.loading import resolve_dtype
from lookahead_jax.decoding.cost_curve import step_latencies
from lookahead_jax.models.config import LlamaConfig, RopeScaling
from lookahead_jax.models.llama import LlamaLM
from lookahead_jax.models.llama_params import (
    flat_names,
    from_flat,
    param_specs,
    quantize_params,
    split_layers,
)

SHAPES = {
    "smollm2-135m": dict(
        vocab_size=49152,
        hidden_size=576,
        intermediate_size=1536,
        num_layers=30,
        num_heads=9,
        num_kv_heads=3,
        head_dim=64,
        rope_theta=100000.0,
        tie_word_embeddings=True,
    ),
    "llama2-7b": dict(
        vocab_size=32000,
        hidden_size=4096,
        intermediate_size=11008,
        num_layers=32,
        num_heads=32,
        num_kv_heads=32,
        head_dim=128,
    ),
    "llama3-8b": dict(
        vocab_size=128256,
        hidden_size=4096,
        intermediate_size=14336,
        num_layers=32,
        num_heads=32,
        num_kv_heads=8,
        head_dim=128,
        rope_theta=500000.0,
        rope_scaling=RopeScaling("llama3", 8.0, 1.0, 4.0, 8192),
    ),
}
DEFAULT_TOKENS = [1, 2, 4, 8, 12, 16, 24, 32, 48, 64, 96, 128, 192, 256]


def model_and_params(name: str, dtype):
    """(cfg, params): a named shape with random weights, or a checkpoint's real ones."""
    if name in SHAPES:
        cfg = LlamaConfig(max_position_embeddings=8192, **SHAPES[name])
        return cfg, random_params(cfg, dtype)
    import lookahead_jax as lj

    model = lj.load(name, dtype=dtype)
    return model.cfg, model.params


def random_params(cfg, dtype, scale: float = 0.02, weights: str = "float"):
    """llama_params.init_params' weights made one tensor at a time, each by a small program per
    shape: init_params under one jit is one program that draws every weight and splits
    the layers, and XLA's GPU compiler took minutes over it for the 7B/8B shapes (issue
    36's device runs printed nothing within 100 s). weights "int8" / "q8_0": the matrices
    quantized as lj.load quantizes a checkpoint's."""

    @functools.partial(jax.jit, static_argnums=(1, 2))
    def draw(key, shape, norm):
        noise = jax.random.normal(key, shape, jnp.float32)
        return (1.0 + 0.1 * noise if norm else scale * noise).astype(dtype)

    named = flat_names(param_specs(cfg))
    keys = jax.random.split(jax.random.PRNGKey(0), len(named))
    flat = {
        name: draw(k, tuple(spec.shape), name.endswith("norm"))
        for (name, spec), k in zip(named.items(), keys, strict=True)
    }
    params = from_flat(cfg, flat)
    if weights != "float":
        params = quantize_params(params, cfg, weights=weights)
    return split_layers(params)


def copy_bandwidth(n_bytes: int = 2 << 30, repeats: int = 10) -> float:
    """Bytes per second of a large device-to-device copy, counting bytes read plus bytes
    written (the practical memory roofline): the median of `repeats`."""
    x = jax.random.normal(jax.random.PRNGKey(3), (n_bytes // 4,), jnp.float32)
    scale = jax.jit(lambda a: a * 1.0001)
    jax.block_until_ready(scale(x))
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        jax.block_until_ready(scale(x))
        times.append(time.perf_counter() - t0)
    return 2 * n_bytes / float(np.median(times))


def cache_bytes_read(cfg, batch: int, context: int, dtype) -> int:
    """K and V bytes a step reads from a `context`-token cache."""
    per_token = 2 * cfg.num_layers * cfg.num_kv_heads * cfg.head_dim * jnp.dtype(dtype).itemsize
    return batch * context * per_token


def measure(cfg, params, tokens: list[int], context: int, repeats: int, batch: int) -> list[dict]:
    rows = []
    lm = LlamaLM(cfg)
    for t in tokens:
        r = {"tokens": t, "batch": batch, "context": context}
        kinds = [("all_logits_s", True)] + ([("one_logit_s", False)] if t == 1 else [])
        for key, all_logits in kinds:  # a plain step (one logit) only at T = 1
            ts = step_latencies(lm, params, t, context, repeats, all_logits, batch)
            r[key] = {"min": min(ts), "median": float(np.median(ts))}
        rows.append(r)
        print(
            f"B={batch} ctx={context} T={t:4d}  all logits "
            f"{1000 * r['all_logits_s']['median']:8.2f} ms",
            flush=True,
        )
    return rows


def add_ratios(curve: list[dict]) -> None:
    """Each row's `ratio_to_plain`: its step (all logits) over the plain one-token step
    (one logit), min over min and median over median. T = 8 / T = 1 in the committed
    results is how a regression of the multi-token step shows (a T-token step that costs
    more is lookahead speed lost)."""
    plain = next((r["one_logit_s"] for r in curve if r["tokens"] == 1), None)
    if plain is None:
        return
    for r in curve:
        r["ratio_to_plain"] = {k: r["all_logits_s"][k] / plain[k] for k in ("min", "median")}
        print(
            f"T={r['tokens']:4d} / T=1: {r['ratio_to_plain']['min']:.2f} (min) "
            f"{r['ratio_to_plain']['median']:.2f} (median)",
            flush=True,
        )


def plot(rows: list[dict], title: str, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4.5))
    for b, c in sorted({(r["batch"], r["context"]) for r in rows}):
        curve = [r for r in rows if (r["batch"], r["context"]) == (b, c)]
        base = curve[0]["one_logit_s"]["median"]
        t = [r["tokens"] for r in curve]
        ratio = [r["all_logits_s"]["median"] / base for r in curve]
        ax.plot(t, ratio, marker="o", label=f"batch {b}, cache {c}")
    ax.set_xscale("log", base=2)
    ax.set_xlabel("tokens per row in the forward step (T), logits for all")
    ax.set_ylabel("step latency / plain one-token step")
    ax.set_title(title, fontsize=10)
    ax.grid(True, alpha=0.3)
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=120)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument(
        "--model",
        default="smollm2-135m",
        help=f"one of {', '.join(SHAPES)} (random weights) or a checkpoint path",
    )
    ap.add_argument("--dtype", default="float32")
    ap.add_argument("--tokens", default=",".join(map(str, DEFAULT_TOKENS)))
    ap.add_argument("--context", default="512", help="tokens already in the cache (a list)")
    ap.add_argument("--batch", default="1", help="rows per step (a list)")
    ap.add_argument("--repeats", type=int, default=20)
    ap.add_argument("--out", default="benchmarks/cost_curve")
    args = ap.parse_args()

    dtype = resolve_dtype(args.dtype)
    cfg, params = model_and_params(args.model, dtype)
    tokens = [int(x) for x in args.tokens.split(",")]
    device = jax.devices()[0]
    weight_bytes = int(sum(x.nbytes for x in jax.tree.leaves(params)))
    print(f"{args.model}: {weight_bytes / 1e9:.2f} GB of weights on {device}", flush=True)
    copy_bps = copy_bandwidth() if device.platform != "cpu" else None
    rows, roofline = [], []
    for batch in (int(x) for x in args.batch.split(",")):
        for context in (int(x) for x in args.context.split(",")):
            curve = measure(cfg, params, tokens, context, args.repeats, batch)
            add_ratios(curve)
            rows += curve
            plain = min(r["one_logit_s"]["min"] for r in curve if r["tokens"] == 1)
            moved = weight_bytes + cache_bytes_read(cfg, batch, context, dtype)
            roofline.append(
                {
                    "batch": batch,
                    "context": context,
                    "plain_step_s": plain,
                    "plain_tokens_per_s": batch / plain,
                    "bytes_read": moved,
                    "effective_gbps": moved / plain / 1e9,
                    "fraction_of_copy_bw": None if copy_bps is None else moved / plain / copy_bps,
                }
            )
            print(f"plain step B={batch} ctx={context}: {roofline[-1]}", flush=True)
    n_params = sum(x.size for x in jax.tree.leaves(params))
    result = {
        "command": " ".join(["python", *sys.argv]),
        "model": args.model,
        "dtype": args.dtype,
        "device": f"{device.platform}:{device.device_kind}",
        "jax": jax.__version__,
        "params": int(n_params),
        "weight_bytes": weight_bytes,
        "copy_gbps": None if copy_bps is None else copy_bps / 1e9,
        "plain_roofline": roofline,
        "rows": rows,
    }
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.with_name(out.name + ".json").write_text(json.dumps(result, indent=2) + "\n")
    plot(
        rows,
        f"{args.model} {args.dtype} on {result['device']}",
        out.with_name(out.name + ".png"),
    )
    print(f"wrote {out.with_name(out.name + '.json')} and {out.with_name(out.name + '.png')}")


if __name__ == "__main__":
    main()
