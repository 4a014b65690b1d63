"""Matmul precision on this device, and what it does to lookahead's exactness.

1. The relative error of a float32 matmul against float64 under each
   `jax_default_matmul_precision` ('default' is what XLA does unasked: TF32 on NVIDIA
   GPUs since Ampere would show ~1e-3, full float32 ~1e-6).
2. Lookahead greedy against plain greedy on tiny random models (peaked weights), batched:
   rows whose outputs differ, and how many of those differ where plain decoding's top-2
   logits were a near-tie; for float32 at 'default' and 'highest' precision, and bfloat16.
   Also how many float32 rows differ from the float64 decode.
3. What 'highest' costs: forward-step latency of a float32 model of a real shape at a few
   T under each precision.

    python scripts/bench/precision_check.py --out benchmarks/gpu/precision
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
from cost_curve import SHAPES

import lookahead_jax as lj
from lookahead_jax.checkpoints.loading import Model
from lookahead_jax.decoding import programs
from lookahead_jax.decoding.autotune import step_latencies
from lookahead_jax.engine.testing import first_divergence, full_pass_logits, top2_gap
from lookahead_jax.models.config import LlamaConfig
from lookahead_jax.models.llama import LlamaLM, init_params

TINY = dict(
    vocab_size=128,
    hidden_size=64,
    intermediate_size=128,
    num_layers=2,
    num_heads=4,
    num_kv_heads=2,
    head_dim=16,
    max_position_embeddings=1024,
)
CONFIGS = (8, 16, 32)


def set_precision(name: str | None) -> None:
    jax.config.update("jax_default_matmul_precision", name)
    programs.clear()


def matmul_errors(n: int = 2048) -> dict:
    rng = np.random.default_rng(0)
    a, b = rng.standard_normal((n, n)), rng.standard_normal((n, n))
    ref = a @ b
    out = {}
    for name in ("default", "tensorfloat32", "float32", "highest"):
        with jax.default_matmul_precision(name):
            got = np.asarray(
                jax.jit(jnp.matmul)(jnp.asarray(a, jnp.float32), jnp.asarray(b, jnp.float32)),
                np.float64,
            )
        out[name] = float(np.linalg.norm(got - ref) / np.linalg.norm(ref))
    return out


def tiny_weights(seed: int, scale: float):
    """Random tiny-model weights as float32 numpy arrays (drawn outside x64 mode, where
    jax.random draws other numbers)."""
    params = init_params(LlamaConfig(**TINY), jax.random.PRNGKey(seed), jnp.float32, scale)
    return jax.tree.map(np.asarray, params)


def tiny_model(weights, dtype) -> Model:
    params = jax.tree.map(lambda x: jnp.asarray(x, dtype), weights)
    return Model(lm=LlamaLM(LlamaConfig(**TINY)), params=params, eos_ids=())


def divergences(model, prompts, new_tokens: int, near_tie: float) -> dict:
    plain = lj.generate(model, prompts, max_new_tokens=new_tokens, lookahead=None).token_ids
    out = {"rows": len(prompts)}
    for t in CONFIGS:
        cfg = lj.LookaheadConfig.for_budget(t)
        got = lj.generate(model, prompts, max_new_tokens=new_tokens, lookahead=cfg)
        diverged, ties = 0, 0
        for row, (a, b) in enumerate(zip(got.token_ids, plain, strict=True)):
            i = first_divergence(a, b)
            if i is None:
                continue
            diverged += 1
            gap = top2_gap(full_pass_logits(model, prompts[row] + b[:i])[-1])
            ties += gap < near_tie
        out[cfg.name] = {
            "diverged_rows": diverged,
            "of_which_near_tie": ties,
            "compression": got.stats["compression"],
        }
    return out, plain


def exactness(seeds: int, rows: int, new_tokens: int, scale: float) -> dict:
    rng = np.random.default_rng(1)
    result = {}
    for seed in range(seeds):
        prompts = rng.integers(3, TINY["vocab_size"], size=(rows, 12)).tolist()
        weights = tiny_weights(seed, scale)
        with jax.enable_x64(True):
            set_precision(None)
            ref = lj.generate(
                tiny_model(weights, jnp.float64), prompts, new_tokens, lookahead=None
            ).token_ids
        cases = (("float32", "default", 1e-3), ("float32", "highest", 1e-3))
        cases += (("bfloat16", None, 0.1),)
        for dtype, precision, tie in cases:
            set_precision(precision)
            model = tiny_model(weights, jnp.dtype(dtype))
            div, plain = divergences(model, prompts, new_tokens, tie)
            div["plain_rows_differing_from_float64"] = sum(
                first_divergence(a, b) is not None for a, b in zip(plain, ref, strict=True)
            )
            key = f"{dtype}/{precision or 'platform default'}"
            result.setdefault(key, []).append(div)
            print(f"seed {seed} {key}: {div}", flush=True)
    set_precision(None)
    return result


def precision_cost(shape: str, tokens: list[int], context: int) -> dict:
    from cost_curve import model_and_params

    cfg, params = model_and_params(shape, jnp.float32)
    out = {}
    for precision in ("default", "highest"):
        set_precision(precision)
        for t in tokens:
            ts = step_latencies(LlamaLM(cfg), params, t, context, 10, all_logits=True)
            out[f"{precision}/T={t}"] = float(np.median(ts))
            print(f"{shape} float32 {precision} T={t}: {1000 * out[f'{precision}/T={t}']:.2f} ms")
    set_precision(None)
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seeds", type=int, default=3)
    ap.add_argument("--rows", type=int, default=32)
    ap.add_argument("--new-tokens", type=int, default=48)
    ap.add_argument("--scale", type=float, default=0.15, help="weights' std (peaked logits)")
    ap.add_argument("--cost-shape", default="llama2-7b", help=f"one of {', '.join(SHAPES)}")
    ap.add_argument("--cost-tokens", default="1,16,64")
    ap.add_argument("--out", default="benchmarks/gpu/precision")
    args = ap.parse_args()

    device = jax.devices()[0]
    result = {
        "command": " ".join(["python", *sys.argv]),
        "device": f"{device.platform}:{device.device_kind}",
        "jax": jax.__version__,
        "matmul_relative_error_float32": matmul_errors(),
    }
    print(result, flush=True)
    result["exactness"] = exactness(args.seeds, args.rows, args.new_tokens, args.scale)
    if args.cost_shape:
        tokens = [int(x) for x in args.cost_tokens.split(",")]
        result["float32_step_s"] = precision_cost(args.cost_shape, tokens, 512)
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.with_name(out.name + ".json").write_text(json.dumps(result, indent=2) + "\n")
    print(f"wrote {out.with_name(out.name + '.json')}")


if __name__ == "__main__":
    main()
