"""Per-device parameter bytes and tokens/s on device meshes (8 simulated CPU devices by
default), against one device, with identical tokens checked.

    python scripts/bench/mesh_bench.py --out benchmarks/cpu/mesh

On this CPU the 8 "devices" share 2 cores, so the tokens/s show what the collectives
cost, not a speedup; on a GPU node or TPU slice the same command shards for real.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

if "--real-devices" not in sys.argv:
    os.environ["XLA_FLAGS"] = (
        os.environ.get("XLA_FLAGS", "") + " --xla_force_host_platform_device_count=8"
    )

import jax  # noqa: E402
import numpy as np  # noqa: E402

import lookahead_jax as lj  # noqa: E402

MESHES = {
    "smollm2-135m": [
        None,
        dict(data=1, model=2),
        dict(model=4),
        dict(model=8),
        dict(data=2, model=4),
    ],
}


def per_device_bytes(params) -> dict:
    out: dict[str, int] = {}
    for arr in jax.tree.leaves(params):
        for shard in arr.addressable_shards:
            key = str(shard.device)
            out[key] = out.get(key, 0) + shard.data.nbytes
    return out


def run(model, prompts, la, repeats):
    lj.generate(model, prompts, max_new_tokens=64, lookahead=la)  # compile
    times, out = [], None
    for _ in range(repeats):
        t = time.perf_counter()
        out = lj.generate(model, prompts, max_new_tokens=64, lookahead=la)
        times.append(time.perf_counter() - t)
    new = sum(len(x) for x in out.token_ids)
    return out.token_ids, new / float(np.median(times)), new / min(times)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--ckpt", default="smollm2-135m")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--real-devices", action="store_true", help="do not simulate 8 devices")
    ap.add_argument("--out", default="benchmarks/cpu/mesh")
    args = ap.parse_args()

    questions = ["Name three rivers in Europe.", "What is 12 times 12?"]
    rows = []
    reference = {}
    for sizes in MESHES["smollm2-135m"]:
        mesh = None if sizes is None else lj.make_mesh(**sizes)
        model = lj.load(args.ckpt, mesh=mesh)
        prompts = [model.tokenizer.encode_prompt(q, chat=True) for q in questions]
        per_dev = per_device_bytes(model.params)
        row = {
            "mesh": "one device" if sizes is None else sizes,
            "devices": len(per_dev),
            "param_bytes_per_device": sorted(set(per_dev.values())),
            "param_bytes_total": int(sum(a.nbytes for a in jax.tree.leaves(model.params))),
        }
        for name, la in (("plain", None), ("lookahead_5,1,1", lj.LookaheadConfig(5, 1, 1))):
            tokens, median_tps, best_tps = run(model, prompts, la, args.repeats)
            reference.setdefault(name, tokens)
            row[name] = {
                "tokens_per_s_median": median_tps,
                "tokens_per_s_max": best_tps,
                "same_tokens_as_one_device": tokens == reference[name],
            }
        rows.append(row)
        print(json.dumps(row), flush=True)
    result = {
        "command": " ".join(["python", *sys.argv]),
        "ckpt": args.ckpt,
        "batch": len(questions),
        "max_new_tokens": 64,
        "devices": f"{len(jax.devices())} x {jax.devices()[0].device_kind}",
        "rows": rows,
    }
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.with_name(out.name + ".json").write_text(json.dumps(result, indent=2) + "\n")
    lines = [
        f"# Meshes: {args.ckpt}, batch {len(questions)}, 64 new tokens, greedy, "
        f"{result['devices']}",
        "",
        f"`{result['command']}`",
        "",
        "| mesh | devices | param bytes per device | plain tok/s | lookahead 5,1,1 tok/s "
        "| same tokens |",
        "|---|---|---|---|---|---|",
    ]
    for r in rows:
        lines.append(
            f"| {r['mesh']} | {r['devices']} | "
            + " / ".join(f"{b / 2**20:.1f} MiB" for b in r["param_bytes_per_device"])
            + f" | {r['plain']['tokens_per_s_median']:.1f} | "
            f"{r['lookahead_5,1,1']['tokens_per_s_median']:.1f} | "
            f"{all(r[k]['same_tokens_as_one_device'] for k in ('plain', 'lookahead_5,1,1'))} |"
        )
    out.with_name(out.name + ".md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
