"""What one decoding step costs as the batch grows: the compiled decode loop's time per
step (plain, and lookahead steps of T tokens) at several batch sizes and cache sizes,
beside Hugging Face transformers' decode step at the same batch and live length and the
memory roofline of this machine.

Every row of a batch holds a 256-token prompt (the live length) and the cache has S
slots (S = 512 or 2048: the same live length in a cache four times larger). A timing is
`decoding.run_loop` over `--steps` steps from a freshly prefilled state (no EOS, so no
row stops), divided by the steps; min and median of `--repeats`.

Versions are source trees (`--versions before=/path/to/old/clone,after=.`): each is
measured in its own process with that tree first on PYTHONPATH, batch size by batch size,
the versions alternating, so that a slow moment of this shared machine falls on both.

    python scripts/bench/step_cost.py --versions before=/tmp/base_clone,after=. \
        --batches 1,4,8,16,32 --slots 512,2048 --out benchmarks/cpu/step_cost

The roofline: (weight bytes + the live K/V bytes) / the machine's read bandwidth (bytes
per second an XLA sum over 256 MB reads): a step reads every weight and the live K/V at
least once, so no step can be faster.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
PROMPT_TOKENS = 256


def measure(batch: int, slots: list[int], layouts: list[str], steps: int, repeats: int) -> list:
    """Rows {layout, slots, batch, step_ms, compile_s} for the lookahead_jax on sys.path."""
    import jax
    import jax.numpy as jnp

    import lookahead_jax as lj
    from lookahead_jax import decoding
    from lookahead_jax.decoding import programs, sampling
    from lookahead_jax.decoding.decode_state import DecodeSpec

    # the same measurement across versions: per-row sampling settings (after issue 34)
    # are a field `sampled` and a sixth argument; before, a SamplingConfig in the spec
    per_row = "sampled" in DecodeSpec.__dataclass_fields__
    greedy = {"sampled": False} if per_row else {"sampling": sampling.SamplingConfig()}

    model = lj.load("smollm2-135m")
    rng = np.random.default_rng(0)
    prompt = rng.integers(3, model.lm.vocab_size, (batch, PROMPT_TOKENS)).astype(np.int32)
    rows = []
    for S in slots:
        for layout in layouts:
            config = None if layout == "plain" else lj.LookaheadConfig.for_budget(int(layout))
            spec = DecodeSpec(
                lm=model.lm,
                **greedy,
                eos_ids=(),  # no row stops: every step decodes every row
                lookahead=config,
                cache_dtype="float32",
            )
            cap = S - PROMPT_TOKENS - spec.max_emit
            args = (
                model.params,
                jnp.asarray(prompt),
                jnp.full((batch,), PROMPT_TOKENS, jnp.int32),
                jnp.full((batch,), cap, jnp.int32),
                jnp.asarray(np.zeros((batch, 2), np.uint32)),
            )
            if per_row:
                args += (sampling.RowSampling.of([sampling.SamplingConfig()] * batch),)
            fns = decoding.jitted(spec, cap, None, args)  # as lj.generate compiles them
            with programs.precision_scope("float32"):
                t0 = time.perf_counter()
                start = fns.start.lower(*args).compile()
                state = start(*args)
                loop_exe = fns.run_loop.lower(model.params, state, jnp.int32(0), False).compile()
                compile_s = time.perf_counter() - t0
            times = []
            for r in range(repeats + 1):
                state = jax.block_until_ready(start(*args))
                t0 = time.perf_counter()
                state = jax.block_until_ready(
                    loop_exe(model.params, state, jnp.int32(steps), False)
                )
                if r:  # the first run warms up
                    times.append(1000 * (time.perf_counter() - t0) / steps)
            assert int(state.steps.min()) == steps, "every row decodes every step"
            rows.append(
                {
                    "layout": layout,
                    "slots": int(state.tokens.shape[1]),
                    "batch": batch,
                    "step_ms": {"min": min(times), "median": float(np.median(times))},
                    "compile_s": compile_s,
                }
            )
            print(json.dumps(rows[-1]), file=sys.stderr, flush=True)
    return rows


def hf_step_ms(batches: list[int], steps: int, repeats: int) -> dict:
    """HF transformers' decode step (one token per row with its DynamicCache) over the
    same 256-token prompts, per batch size: {B: {min, median}} in ms."""
    import torch
    from transformers import AutoModelForCausalLM

    from lookahead_jax.checkpoints import default_model

    torch.set_num_threads(os.cpu_count() or 1)
    path = default_model.gguf_path()
    hf = AutoModelForCausalLM.from_pretrained(
        str(path.parent), gguf_file=path.name, dtype=torch.float32
    ).eval()
    out = {}
    for B in batches:
        prompt = np.random.default_rng(0).integers(3, hf.config.vocab_size, (B, PROMPT_TOKENS))
        times = []
        with torch.inference_mode():
            for r in range(repeats + 1):
                res = hf(torch.as_tensor(prompt), use_cache=True)
                cache, nxt = res.past_key_values, res.logits[:, -1:].argmax(-1)
                t0 = time.perf_counter()
                for _ in range(steps):
                    res = hf(nxt, past_key_values=cache, use_cache=True)
                    cache, nxt = res.past_key_values, res.logits[:, -1:].argmax(-1)
                if r:
                    times.append(1000 * (time.perf_counter() - t0) / steps)
        out[B] = {"min": min(times), "median": float(np.median(times))}
        print(f"hf B={B}: {out[B]}", file=sys.stderr, flush=True)
    return out


def read_bandwidth(repeats: int = 10) -> float:
    """Bytes per second an XLA sum over 256 MB reads. (Not a copy `a + 1`: its fresh
    output buffer is page-faulted in on every call, which measured 1.8 GB/s here against
    19 GB/s read.)"""
    import jax
    import jax.numpy as jnp

    x = jnp.ones((64 << 20,), jnp.float32)
    total = jax.jit(jnp.sum)
    jax.block_until_ready(total(x))
    best = min(_timed(lambda: jax.block_until_ready(total(x))) for _ in range(repeats))
    return x.nbytes / best


def _timed(fn) -> float:
    t0 = time.perf_counter()
    fn()
    return time.perf_counter() - t0


def model_bytes() -> dict:
    import jax

    import lookahead_jax as lj

    model = lj.load("smollm2-135m")
    cfg = model.cfg
    per_token = 2 * cfg.num_layers * cfg.num_kv_heads * cfg.head_dim * 4  # K and V, float32
    return {
        "weights": int(sum(x.nbytes for x in jax.tree.leaves(model.params))),
        "kv_per_token": per_token,
    }


def child(args) -> None:
    rows = measure(args.batch, args.slots_list, args.layouts.split(","), args.steps, args.repeats)
    print(json.dumps(rows))


def report(result: dict, out: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from results import write_results

    versions = list(result["versions"])
    by = {(r["version"], r["layout"], r["slots"], r["batch"]): r for r in result["rows"]}
    layouts = sorted({r["layout"] for r in result["rows"]}, key=lambda x: (x != "plain", x))
    slots = sorted({r["slots"] for r in result["rows"]})
    batches = sorted({r["batch"] for r in result["rows"]})
    bw, sizes = result["read_bandwidth"], result["bytes"]
    lines = [
        "# Decode step cost against the batch (issue 33)",
        "",
        f"CPU: {result['cpu']} ({result['cores']} cores), JAX {result['jax']}, SmolLM2-135M "
        f"float32, greedy. Every row: a {PROMPT_TOKENS}-token prompt (the live length); S: "
        f"the cache's slots. Time per step of `decoding.run_loop` over {result['steps']} steps, "
        f"min (median) of {result['repeats']} runs; versions measured in turn, batch size by "
        "batch size.",
        "",
        f"Command: `{result['command']}`",
        "",
        f"Roofline: (weights {sizes['weights'] / 1e6:.0f} MB + live K/V) / read bandwidth "
        f"{bw / 1e9:.1f} GB/s. HF: transformers {result.get('transformers', '?')}, its decode "
        "step (one token per row, DynamicCache) at the same live length.",
        "",
    ]
    for S in slots:
        lines += [f"## S = {S}", ""]
        head = ["B", "roofline ms", "HF ms"]
        for v in versions:
            head += [f"{v} {lay}" for lay in layouts]
        lines += ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
        for B in batches:
            live = B * PROMPT_TOKENS * sizes["kv_per_token"]
            cells = [str(B), f"{1000 * (sizes['weights'] + live) / bw:.1f}"]
            hf = result["hf"].get(str(B))
            cells.append("–" if hf is None else f"{hf['min']:.1f}")
            for v in versions:
                for lay in layouts:
                    r = by.get((v, lay, S, B))
                    if r is None:
                        cells.append("–")
                        continue
                    one = by.get((v, lay, S, batches[0]))
                    ratio = r["step_ms"]["min"] / one["step_ms"]["min"] if one else float("nan")
                    cells.append(
                        f"{r['step_ms']['min']:.1f} ({r['step_ms']['median']:.1f}) {ratio:.1f}x"
                    )
            lines.append("| " + " | ".join(cells) + " |")
        lines += ["", f"(each cell: ms min (median), then the ratio to B = {batches[0]})", ""]
    if len(slots) > 1:
        lines += [f"## S = {slots[-1]} over S = {slots[0]}, the same live length", ""]
        head = ["B"] + [f"{v} {lay}" for v in versions for lay in layouts]
        lines += ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
        for B in batches:
            cells = [str(B)]
            for v in versions:
                for lay in layouts:
                    a, b = by.get((v, lay, slots[0], B)), by.get((v, lay, slots[-1], B))
                    ok = a and b
                    cells.append(f"{b['step_ms']['min'] / a['step_ms']['min']:.2f}x" if ok else "–")
            lines.append("| " + " | ".join(cells) + " |")
        lines.append("")
    lines += ["## Compile seconds (prefill + loop)", ""]
    head = ["layout", "S"] + versions
    lines += ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for lay in layouts:
        for S in slots:
            cells = [lay, str(S)]
            for v in versions:
                cs = [
                    r["compile_s"] for k, r in by.items() if k[0] == v and k[1] == lay and k[2] == S
                ]
                cells.append(f"{min(cs):.1f}–{max(cs):.1f}" if cs else "–")
            lines.append("| " + " | ".join(cells) + " |")
    md = "\n".join(lines) + "\n"
    write_results(out, result, md)

    fig, axes = plt.subplots(1, len(slots), figsize=(6 * len(slots), 4.5), squeeze=False)
    for ax, S in zip(axes[0], slots, strict=True):
        for v, style in zip(versions, ("--", "-", ":", "-."), strict=False):
            for lay in layouts:
                ys = [by.get((v, lay, S, B)) for B in batches]
                ax.plot(
                    batches,
                    [y["step_ms"]["min"] if y else np.nan for y in ys],
                    style,
                    marker="o",
                    label=f"{v} {lay}",
                )
        hf = [result["hf"].get(str(B), {}).get("min", np.nan) for B in batches]
        ax.plot(batches, hf, "k-", marker="s", label="HF transformers")
        live = [
            1000 * (sizes["weights"] + B * PROMPT_TOKENS * sizes["kv_per_token"]) / bw
            for B in batches
        ]
        ax.plot(batches, live, "k:", label="roofline")
        ax.set_xscale("log", base=2)
        ax.set_yscale("log")
        ax.set_xlabel("batch")
        ax.set_ylabel("ms per step")
        ax.set_title(f"S = {S}")
        ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(Path(out).with_name(Path(out).name + ".png"), dpi=110)


def merge(results: list[dict], out: str) -> None:
    """One report from several runs (e.g. an earlier version on fewer sizes): their rows,
    every HF step measured, the first run's machine figures."""
    first = dict(results[0])
    first["command"] = " ; ".join(r["command"] for r in results)
    first["versions"] = {k: v for r in results for k, v in r["versions"].items()}
    first["hf"] = {k: v for r in results for k, v in r["hf"].items()}
    seen, rows = set(), []
    for r in results:
        for row in r["rows"]:
            key = (row["version"], row["layout"], row["slots"], row["batch"])
            if key not in seen:
                seen.add(key)
                rows.append(row)
    first["rows"] = rows
    if "read_bandwidth" not in first:  # a run from before the roofline read bandwidth
        first.pop("copy_bandwidth", None)
        first["read_bandwidth"] = read_bandwidth()
    report(first, out)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--versions", default="current=.", help="label=source tree, comma-separated")
    ap.add_argument("--batches", default="1,4,8,16,32")
    ap.add_argument("--slots", default="512,2048")
    ap.add_argument("--layouts", default="plain,8,16")
    ap.add_argument("--steps", type=int, default=8)
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--no-hf", action="store_true")
    ap.add_argument("--out", default="benchmarks/cpu/step_cost")
    ap.add_argument(
        "--merge",
        default=None,
        metavar="A.json,B.json",
        help="no measuring: one report from earlier results (their rows and HF steps)",
    )
    ap.add_argument("--child-batch", type=int, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.merge:
        return merge([json.loads(Path(f).read_text()) for f in args.merge.split(",")], args.out)
    args.slots_list = [int(s) for s in args.slots.split(",")]
    if args.child_batch is not None:
        args.batch = args.child_batch
        return child(args)

    import jax
    from machine import cpu_model

    versions = dict(v.split("=", 1) for v in args.versions.split(","))
    batches = [int(b) for b in args.batches.split(",")]
    rows = []
    for B in batches:
        for label, tree in versions.items():
            env = dict(os.environ, PYTHONPATH=str(Path(tree).resolve()), HF_HUB_OFFLINE="1")
            env["LOOKAHEAD_JAX_NO_COMPILE_CACHE"] = "1"  # compile_s: a real compilation
            cmd = [sys.executable, __file__, "--child-batch", str(B), "--slots", args.slots,
                   "--layouts", args.layouts, "--steps", str(args.steps),
                   "--repeats", str(args.repeats)]  # fmt: skip
            print(f"{label} B={B}", file=sys.stderr, flush=True)
            done = subprocess.run(cmd, env=env, check=True, stdout=subprocess.PIPE, text=True)
            rows += [dict(r, version=label) for r in json.loads(done.stdout.splitlines()[-1])]
    import transformers

    result = {
        "command": "python " + " ".join(sys.argv),
        "cpu": cpu_model(),
        "cores": os.cpu_count(),
        "jax": jax.__version__,
        "transformers": transformers.__version__,
        "steps": args.steps,
        "repeats": args.repeats,
        "versions": versions,
        "bytes": model_bytes(),
        "read_bandwidth": read_bandwidth(),
        "hf": {} if args.no_hf else {str(k): v for k, v in hf_step_ms(batches, 12, 3).items()},
        "rows": rows,
    }
    report(result, args.out)


if __name__ == "__main__":
    main()
