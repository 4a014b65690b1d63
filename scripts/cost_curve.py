"""Latency of one forward step against the number of tokens in it.

The step attends to a KV cache of `--context` tokens and feeds T new tokens
(T = 1 is a plain decoding step; a lookahead step feeds 1 + (N-1)W + G(N-1)).
Two curves: logits for every new token, and logits for one token (what a plain
step needs). Weights are random for the named shapes, so the 7B/8B shapes run
without a download.

    python scripts/cost_curve.py --model smollm2-135m --out benchmarks/cpu/cost_curve
    python scripts/cost_curve.py --model llama2-7b --dtype bfloat16 \
        --out benchmarks/gpu/cost_curve_llama2_7b
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import jax
import numpy as np

from lookahead_jax.autotune import step_latencies
from lookahead_jax.config import LlamaConfig, RopeScaling
from lookahead_jax.loading import resolve_dtype
from lookahead_jax.model import LlamaLM, init_params

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
        return cfg, jax.jit(init_params, static_argnums=(0, 2))(cfg, jax.random.PRNGKey(0), dtype)
    import lookahead_jax as lj

    model = lj.load(name, dtype=dtype)
    return model.cfg, model.params


def measure(cfg, params, tokens: list[int], context: int, repeats: int) -> list[dict]:
    rows = []
    for t in tokens:
        r = {"tokens": t}
        for key, all_logits in (("all_logits_s", True), ("one_logit_s", False)):
            ts = step_latencies(LlamaLM(cfg), params, t, context, repeats, all_logits)
            r[key] = {"min": min(ts), "median": float(np.median(ts))}
        rows.append(r)
        print(
            f"T={t:4d}  all logits {1000 * r['all_logits_s']['median']:8.2f} ms   "
            f"one logit {1000 * r['one_logit_s']['median']:8.2f} ms",
            flush=True,
        )
    return rows


def plot(rows: list[dict], title: str, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    t = [r["tokens"] for r in rows]
    fig, ax = plt.subplots(figsize=(7, 4.5))
    base = rows[0]["one_logit_s"]["median"]
    for key, label in (("all_logits_s", "logits for all T"), ("one_logit_s", "logits for 1")):
        ax.plot(t, [r[key]["median"] / base for r in rows], marker="o", label=label)
    ax.set_xscale("log", base=2)
    ax.set_xlabel("tokens in the forward step (T)")
    ax.set_ylabel("step latency / one-token step")
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
    ap.add_argument("--context", type=int, default=512, help="tokens already in the cache")
    ap.add_argument("--repeats", type=int, default=20)
    ap.add_argument("--out", default="benchmarks/cost_curve")
    args = ap.parse_args()

    dtype = resolve_dtype(args.dtype)
    cfg, params = model_and_params(args.model, dtype)
    tokens = [int(x) for x in args.tokens.split(",")]
    device = jax.devices()[0]
    rows = measure(cfg, params, tokens, args.context, args.repeats)
    n_params = sum(x.size for x in jax.tree.leaves(params))
    result = {
        "command": " ".join(["python", *sys.argv]),
        "model": args.model,
        "dtype": args.dtype,
        "context": args.context,
        "device": f"{device.platform}:{device.device_kind}",
        "params": int(n_params),
        "weight_bytes": int(sum(x.nbytes for x in jax.tree.leaves(params))),
        "rows": rows,
    }
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.with_name(out.name + ".json").write_text(json.dumps(result, indent=2) + "\n")
    plot(
        rows,
        f"{args.model} {args.dtype} on {result['device']}, cache {args.context}",
        out.with_name(out.name + ".png"),
    )
    print(f"wrote {out.with_name(out.name + '.json')} and {out.with_name(out.name + '.png')}")


if __name__ == "__main__":
    main()
