"""What the compiled decode loop copies inside its loop, per version, batch and layout:
every copy, transpose or slice of a weight, a K/V cache buffer, the pool, a recycling
table or the token buffer, read from the program's HLO (lookahead_jax/decoding/loop_copies.py,
the check tests/test_loop_copies.py runs on a tiny model), and the compile time.

Versions are source trees (`--versions before=/path/to/old/clone,after=.`), each
compiled in its own process with that tree first on PYTHONPATH; the check itself is always
this tree's, so an old version is read by the same rules. Runs on any device (the GPU's
program too, when there is one).

    python scripts/bench/loop_copies.py --versions before=/tmp/base_clone,after=. \
        --batches 1,8 --layouts plain,8 --out benchmarks/cpu/loop_copies
"""

from __future__ import annotations

import argparse
import collections
import functools
import importlib.util
import json
import os
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent.parent
sys.path.insert(0, str(HERE))


def _checker():
    """This tree's loop_copies module, whichever lookahead_jax is imported."""
    path = ROOT / "lookahead_jax" / "decoding" / "loop_copies.py"
    spec = importlib.util.spec_from_file_location("_loop_copies_check", path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


def child(args, batch: int, layouts: list[str]) -> list[dict]:
    import jax
    import jax.numpy as jnp

    import lookahead_jax as lj
    from lookahead_jax import decoding
    from lookahead_jax.decoding import programs, sampling
    from lookahead_jax.decoding.decode_state import DecodeSpec

    # per-row sampling settings (after issue 34): a field `sampled` and a sixth argument
    per_row = "sampled" in DecodeSpec.__dataclass_fields__
    greedy = {"sampled": False} if per_row else {"sampling": sampling.SamplingConfig()}

    check = _checker()
    prompt, max_new_tokens_bucket = args.prompt, args.max_new_tokens_bucket
    if args.shape:  # a real shape with random weights (the 7B/8B shapes on a GPU)
        from cost_curve import bench_model

        model = bench_model(args.shape, args.dtype)
    else:
        model = lj.load(args.ckpt, dtype=args.dtype, compilation_cache=False)
    rows = []
    for layout in layouts:
        config = None if layout == "plain" else lj.LookaheadConfig.for_budget(int(layout))
        spec = DecodeSpec(
            lm=model.lm,
            **greedy,
            eos_ids=tuple(model.eos_ids),
            lookahead=config,
            cache_dtype=jnp.dtype(model.dtype).name,
        )
        i32 = lambda *shape: jax.ShapeDtypeStruct(shape, jnp.int32)  # noqa: E731
        args = (model.params, i32(batch, prompt), i32(batch), i32(batch))
        args += (jax.ShapeDtypeStruct((batch, 2), jnp.uint32),)
        if per_row:
            greedy_rows = sampling.RowSampling.of([sampling.SamplingConfig()] * batch)
            args += (jax.tree.map(lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype), greedy_rows),)
        t0 = time.perf_counter()
        exe, _ = programs.compiled(model, spec, max_new_tokens_bucket, args, "run_loop")
        compile_s = time.perf_counter() - t0
        state = jax.eval_shape(
            functools.partial(
                decoding.start, spec=spec, max_new_tokens_bucket=max_new_tokens_bucket
            ),
            *args,
        )
        found = check.loop_copies(exe.as_text(), check.protected_shapes(model.params, state))
        kinds = collections.Counter((c.op, tuple(c.shape)) for c in found)
        rows.append(
            {
                "layout": layout,
                "batch": batch,
                "slots": int(state.tokens.shape[1]),
                "copies": len(found),
                "kinds": [{"op": op, "shape": list(s), "count": n} for (op, s), n in kinds.items()],
                "elements_copied": int(sum(int(jnp.prod(jnp.asarray(c.shape))) for c in found)),
                "compile_s": compile_s,
                "device": jax.devices()[0].device_kind,
            }
        )
        print(json.dumps(rows[-1]), file=sys.stderr, flush=True)
    return rows


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--ckpt", default="smollm2-135m")
    ap.add_argument("--shape", help="instead of --ckpt: a shape of cost_curve.py, random weights")
    ap.add_argument("--dtype", default="float32")
    ap.add_argument("--versions", default="current=.", help="label=source tree, comma-separated")
    ap.add_argument("--batches", default="1,8")
    ap.add_argument("--layouts", default="plain,8")
    ap.add_argument("--prompt", type=int, default=256, help="prompt bucket P")
    ap.add_argument(
        "--max_new_tokens_bucket",
        type=int,
        default=256,
        help="token budget: S = P + max_new_tokens_bucket + E",
    )
    ap.add_argument("--out", default="benchmarks/cpu/loop_copies")
    ap.add_argument("--child-batch", type=int, help=argparse.SUPPRESS)
    args = ap.parse_args()
    layouts = args.layouts.split(",")
    if args.child_batch is not None:
        print(json.dumps(child(args, args.child_batch, layouts)))
        return

    from machine import cpu_model
    from results import write_results

    versions = dict(v.split("=", 1) for v in args.versions.split(","))
    rows = []
    for B in [int(b) for b in args.batches.split(",")]:
        for label, tree in versions.items():
            path = [str(Path(tree).resolve()), os.environ.get("PYTHONPATH", "")]
            env = dict(os.environ, PYTHONPATH=os.pathsep.join(p for p in path if p))
            env["HF_HUB_OFFLINE"] = "1"
            cmd = [sys.executable, __file__, "--child-batch", str(B), "--ckpt", args.ckpt,
                   "--layouts", args.layouts, "--prompt", str(args.prompt), "--dtype", args.dtype,
                   *(["--shape", args.shape] if args.shape else []),
                   "--max_new_tokens_bucket", str(args.max_new_tokens_bucket)]  # fmt: skip
            done = subprocess.run(cmd, env=env, check=True, stdout=subprocess.PIPE, text=True)
            rows += [dict(r, version=label) for r in json.loads(done.stdout.splitlines()[-1])]
    lines = [
        "# What the decode loop copies, read from its HLO",
        "",
        f"{args.shape or args.ckpt} ({args.dtype}), prompt bucket {args.prompt}, budget "
        f"{args.max_new_tokens_bucket}; CPU: {cpu_model()} ({os.cpu_count()} cores); device "
        f"{rows[0]['device'] if rows else '?'}. Copies inside the compiled `run_loop` of "
        "weights, K/V buffers, pool, recycling tables or token buffer "
        "(decoding/loop_copies.py); compile seconds of that program, no compilation cache.",
        "",
        f"Command: `python {' '.join(sys.argv)}`",
        "",
        "| version | layout | B | S | copies | elements copied a step | compile s | what |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        what = "; ".join(f"{k['count']}x {k['op']} {k['shape']}" for k in r["kinds"]) or "–"
        lines.append(
            f"| {r['version']} | {r['layout']} | {r['batch']} | {r['slots']} | {r['copies']} "
            f"| {r['elements_copied']:,} | {r['compile_s']:.1f} | {what} |"
        )
    result = {"command": "python " + " ".join(sys.argv), "cpu": cpu_model(), "rows": rows}
    write_results(args.out, result, "\n".join(lines) + "\n")


if __name__ == "__main__":
    main()
