"""Same tokens, same compression, same step time: a fixed matrix of lj.generate runs on
the real SmolLM2-135M whose every output token, tokens per step and per-source counts
are written to JSON, for a refactor's before and after (run it from each tree, then
`--compare`).

    python scripts/bench/refactor_check.py --out /tmp/before.json   # in the old tree
    python scripts/bench/refactor_check.py --out /tmp/after.json    # in the new tree
    python scripts/bench/refactor_check.py --compare /tmp/before.json /tmp/after.json

Step time is the median over `--repeats` of a warm run's wall time per forward pass.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import numpy as np  # noqa: E402
from machine import cpu_model  # noqa: E402
from prompts import select  # noqa: E402

import lookahead_jax as lj  # noqa: E402

# (label, lookahead, sampling): greedy budgets, the paper's knobs with verify_window and
# without adapt, and one sampled run (token recycling ranks by the noise there)
MATRIX = [
    ("plain", None, None),
    ("tokens=4", "tokens=4", None),
    ("tokens=16", "tokens=16", None),
    ("tokens=64", "tokens=64", None),
    ("5,7,7 vw", "n=5,w=7,g=7,verify_window=True,adapt=False", None),
    ("tokens=16 t0.8", "tokens=16", dict(temperature=0.8, top_p=0.95, seed=3)),
]


def run(args) -> None:
    model = lj.load(args.ckpt)
    prompts = [r["prompt"] for r in select(["mt_bench", "code"], limit=args.per_set)]
    rows = []
    for label, la, sampling in MATRIX:
        config = None if la is None else lj.LookaheadConfig.parse(la)
        kw = dict(lookahead=config, max_new_tokens=args.tokens, **(sampling or {}))
        out = lj.generate(model, prompts, **kw)  # compiles
        times = []
        for _ in range(args.repeats):
            t0 = time.perf_counter()
            again = lj.generate(model, prompts, **kw)
            times.append((time.perf_counter() - t0) / max(again.stats["row_steps"], 1))
        rows.append(
            {
                "label": label,
                "token_ids": [list(map(int, t)) for t in out.token_ids],
                "compression": out.stats["compression"],
                "sources": out.stats.get("sources"),
                "step_s": {"min": min(times), "median": float(np.median(times))},
            }
        )
        print(f"{label:16s} compression {out.stats['compression']:.3f}  step "
              f"{1000 * np.median(times):.1f} ms", flush=True)  # fmt: skip
        Path(args.out).write_text(  # after every run: a partial file if it stops
            json.dumps({"cpu": cpu_model(), "command": " ".join(sys.argv), "rows": rows}) + "\n"
        )


def compare(before_path: str, after_path: str) -> None:
    before, after = (json.loads(Path(p).read_text()) for p in (before_path, after_path))
    print(f"CPU: {after['cpu']}")
    print("| run | same tokens | compression before / after | step min before / after |")
    print("|---|---|---|---|")
    for b, a in zip(before["rows"], after["rows"], strict=True):
        same = b["token_ids"] == a["token_ids"]
        print(
            f"| {a['label']} | {'yes' if same else 'NO'} | {b['compression']:.3f} / "
            f"{a['compression']:.3f} | {1000 * b['step_s']['min']:.1f} / "
            f"{1000 * a['step_s']['min']:.1f} ms |"
        )


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--ckpt", default="smollm2-135m")
    ap.add_argument("--per-set", type=int, default=2, help="prompts from each set")
    ap.add_argument("--tokens", type=int, default=64)
    ap.add_argument("--repeats", type=int, default=2)
    ap.add_argument("--out", default="/tmp/refactor_check.json")
    ap.add_argument("--compare", nargs=2, metavar=("BEFORE", "AFTER"))
    args = ap.parse_args()
    if args.compare:
        compare(*args.compare)
    else:
        run(args)


if __name__ == "__main__":
    main()
