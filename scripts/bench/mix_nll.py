"""Held-out quality along the line from a base checkpoint to a consistency-tuned one:
per-token NLL of held-out ShareGPT responses under base + mix * (tuned - base) for each
mix (lookahead_jax.training --mix writes such a checkpoint), to choose a mix.

    python scripts/bench/mix_nll.py --tuned /tmp/tunedB --held-out /tmp/sharegpt.held_out.jsonl \\
        --mix 0.25,0.5,0.6,0.7,0.8,1 --out benchmarks/cpu/consistency_mix_nll

Writes OUT.json and OUT.md.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from consistency_bench import held_out_nll  # noqa: E402
from machine import cpu_model  # noqa: E402
from results import write_results  # noqa: E402

import lookahead_jax as lj  # noqa: E402
from lookahead_jax import training as C  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--base", default="smollm2-135m")
    ap.add_argument("--tuned", required=True)
    ap.add_argument(
        "--held-out", required=True, help="scripts/training/sharegpt.py's held_out.jsonl"
    )
    ap.add_argument("--mix", default="0.25,0.5,0.6,0.7,0.8,1", help="comma-separated, (0, 1]")
    ap.add_argument("--nll-tokens", type=int, default=256, help="response tokens per text")
    ap.add_argument("--out", default="benchmarks/cpu/consistency_mix_nll")
    args = ap.parse_args()
    try:
        mixes = [C.check_mix(float(x), "--mix") for x in args.mix.split(",")]
    except lj.UserInputError as e:
        raise SystemExit(str(e)) from None

    source = json.loads((Path(args.tuned) / "manifest.json").read_text()).get("source") or {}
    if source.get("mix", 1) != 1:
        raise SystemExit(f"{args.tuned} was itself written with --mix; give the unmixed one")
    base, tuned = lj.load(args.base), lj.load(args.tuned)
    held = [json.loads(line) for line in Path(args.held_out).read_text().splitlines() if line]
    base_nll, _ = held_out_nll(base, held, args.nll_tokens)
    rows = []
    for mix in mixes:
        mixed = dataclasses.replace(tuned, params=C.mix(base.params, tuned.params, mix))
        nll, _ = held_out_nll(mixed, held, args.nll_tokens)
        rows.append({"mix": mix, "nll": nll, "change": nll / base_nll - 1})
        print(rows[-1], flush=True)
    result = {
        "command": " ".join(["python", *sys.argv]),
        "cpu": cpu_model(),
        "tuned_source": source,
        "texts": len(held),
        "base_nll": base_nll,
        "rows": rows,
    }
    lines = [
        "# Held-out NLL along base + mix * (tuned - base)",
        "",
        f"`{result['command']}`",
        "",
        f"{len(held)} held-out ShareGPT responses (first {args.nll_tokens} tokens each); "
        f"base NLL {base_nll:.4f}.",
        "",
        "| mix | NLL | change |",
        "|---|---|---|",
        *(f"| {r['mix']:g} | {r['nll']:.4f} | {r['change']:+.2%} |" for r in rows),
    ]
    write_results(args.out, result, "\n".join(lines) + "\n")


if __name__ == "__main__":
    main()
