"""XLA:CPU's fusion emitters against its older loop emitters, for the decode programs:
compile time, decode speed and the tokens, on the real model.

    python scripts/bench/cpu_emitters.py --out benchmarks/cpu/cpu_emitters

The programs are compiled with `loop.compiler_options()` plus, for "loops",
`xla_cpu_use_fusion_emitters=False`. Each round compiles afresh (the persistent
compilation cache is off) and then decodes `--repeats` times; rounds alternate the two
variants, so both see the same machine load. Every decode's tokens must be equal.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from pathlib import Path

os.environ["LOOKAHEAD_JAX_NO_COMPILE_CACHE"] = "1"  # compile for real each round

import lookahead_jax as lj  # noqa: E402
from lookahead_jax.decoding import loop, programs  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parent))
from machine import cpu_model  # noqa: E402
from prompts import prompt_set  # noqa: E402

DEFAULT_OPTIONS = loop.compiler_options
VARIANTS = {
    "fusion": lambda platform=None: DEFAULT_OPTIONS(platform),
    "loops": lambda platform=None: {
        **DEFAULT_OPTIONS(platform),
        "xla_cpu_use_fusion_emitters": False,
    },
}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--ckpt", default=None, help="default: the bundled SmolLM2-135M")
    ap.add_argument("--layouts", default="plain,tokens=16")
    ap.add_argument("--batch", type=int, default=1)
    ap.add_argument("--max-new-tokens", type=int, default=64)
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--out", default="benchmarks/cpu/cpu_emitters")
    args = ap.parse_args()

    model = lj.load(args.ckpt, compilation_cache=False)
    rows = prompt_set("mt_bench")[: args.batch]
    prompts = [model.tokenizer.encode_prompt(r["prompt"], chat=True) for r in rows]
    records = []
    tokens: dict[str, list] = {}
    for round_ in range(args.rounds):
        for variant, options in VARIANTS.items():
            loop.compiler_options = options
            for layout in args.layouts.split(","):
                la = None if layout == "plain" else lj.LookaheadConfig.parse(layout)
                programs.clear()
                kw = dict(max_new_tokens=args.max_new_tokens, lookahead=la)
                first = lj.generate(model, prompts, **kw)
                decode = []
                for _ in range(args.repeats):
                    t = time.perf_counter()
                    out = lj.generate(model, prompts, **kw)
                    decode.append(time.perf_counter() - t)
                    assert out.token_ids == first.token_ids
                tokens.setdefault(layout, first.token_ids)
                assert first.token_ids == tokens[layout], (variant, layout, "tokens differ")
                new = sum(len(t) for t in first.token_ids)
                records.append(
                    {
                        "round": round_,
                        "variant": variant,
                        "layout": layout,
                        "compile_s": first.stats["compile_s"],
                        "decode_s": decode,
                        "new_tokens": new,
                    }
                )
                print(json.dumps(records[-1]), flush=True)
    loop.compiler_options = DEFAULT_OPTIONS

    lines = [
        "# XLA:CPU fusion emitters against loop emitters (decode programs)",
        "",
        f"`python scripts/bench/cpu_emitters.py --batch {args.batch} --max-new-tokens "
        f"{args.max_new_tokens} --rounds {args.rounds} --repeats {args.repeats}`; "
        f"{cpu_model()}, {os.cpu_count()} cores; SmolLM2-135M float32, the first "
        f"{args.batch} MT-bench prompt(s). Compile: seconds for the decode's programs, "
        "min / max over rounds. Decode: whole-call seconds, min / median over rounds x "
        "repeats. Tokens were equal in every call of both variants.",
        "",
        "| layout | variant | compile s (min / max) | decode s (min / median) | tokens/s (best) |",
        "|---|---|---|---|---|",
    ]
    for layout in args.layouts.split(","):
        for variant in VARIANTS:
            rs = [r for r in records if r["layout"] == layout and r["variant"] == variant]
            comp = [r["compile_s"] for r in rs]
            dec = [d for r in rs for d in r["decode_s"]]
            lines.append(
                f"| {layout} | {variant} | {min(comp):.1f} / {max(comp):.1f} | "
                f"{min(dec):.3f} / {statistics.median(dec):.3f} | "
                f"{rs[0]['new_tokens'] / min(dec):.1f} |"
            )
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.with_suffix(".json").write_text(
        json.dumps({"cpu": cpu_model(), "args": vars(args), "records": records}, indent=1) + "\n"
    )
    out.with_suffix(".md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
