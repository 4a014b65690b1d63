"""Guesses across requests (issue 48 part 3): tokens per step with the engine's shared
guess memory (`shared_guesses=True`) against per-row guesses alone, on the workloads it is
for and on prompts seen once.

    python scripts/bench/shared_guesses.py --out benchmarks/cpu/shared_guesses

The JSONL engine (lj.Engine.run, chat prompts, greedy), one engine per setting kept
across its runs, a fixed layout so that only the guesses differ:

    asked_twice   MT-bench first turns 1-16, then the same 16 again: the second run
    multi_turn    first turns 17-32, then their second turns [q1, the answer, q2]
    seen_once     first turns 33-80 after both of the above (the memory full of other
                  answers): no prompt repeats

Tokens per step (new tokens / row steps) is deterministic for greedy decoding, so one
run each; every answer is checked equal between the two settings (tokens unchanged).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--ckpt", default="smollm2-135m")
    ap.add_argument("--lookahead", default="tokens=16")
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--max-new-tokens", type=int, default=128)
    ap.add_argument("--out", default="benchmarks/cpu/shared_guesses")
    args = ap.parse_args()

    from machine import run_header
    from prompts import MT_BENCH
    from results import write_results

    import lookahead_jax as lj

    questions = [json.loads(line)["turns"] for line in MT_BENCH.read_text().splitlines() if line]
    model = lj.load(args.ckpt)
    la = lj.LookaheadConfig.parse(args.lookahead)
    user = lambda text: [{"role": "user", "content": text}]  # noqa: E731

    def runs(shared: bool) -> dict:
        engine = lj.Engine(model, batch=args.batch, max_new_tokens=args.max_new_tokens,
                           lookahead=la, shared_guesses=shared)  # fmt: skip

        def run(prompts: list) -> tuple[list[str], float, float]:
            results = sorted(engine.run(prompts), key=lambda r: r.id)
            stats = engine.stats
            return [r.text for r in results], stats.compression, stats.decode_s / stats.row_steps

        out = {}
        first, *_ = run([user(q[0]) for q in questions[:16]])
        out["asked_twice"] = run([user(q[0]) for q in questions[:16]])
        answers, *_ = run([user(q[0]) for q in questions[16:32]])
        turns = [
            [*user(q[0]), {"role": "assistant", "content": a}, *user(q[1])]
            for q, a in zip(questions[16:32], answers, strict=True)
        ]
        out["multi_turn"] = run(turns)
        out["seen_once"] = run([user(q[0]) for q in questions[32:]])
        out["first_pass"] = (first, None, None)
        return out

    per_row, shared = runs(False), runs(True)
    result = {
        **run_header(),
        "ckpt": args.ckpt,
        "lookahead": args.lookahead,
        "batch": args.batch,
        "max_new_tokens": args.max_new_tokens,
        "rows": [],
    }
    for name in ("asked_twice", "multi_turn", "seen_once"):
        (texts_a, a, step_a), (texts_b, b, step_b) = per_row[name], shared[name]
        same = sum(x == y for x, y in zip(texts_a, texts_b, strict=True))
        result["rows"].append(
            {"workload": name, "per_row": a, "shared": b, "ratio": b / a,
             "same": f"{same}/{len(texts_a)}",
             "step_ms_per_row": 1e3 * step_a, "step_ms_shared": 1e3 * step_b}
        )  # fmt: skip
    lines = [
        "# Guesses across requests: the engine's shared guess memory (issue 48)",
        "",
        f"CPU: {result['cpu']} ({result['cores']} cores; tokens per step does not depend on "
        f"it, the ms do), JAX {result['jax']}, {args.ckpt} float32, the JSONL engine "
        "(lj.Engine.run), "
        f"batch {args.batch}, `--lookahead {args.lookahead}`, chat prompts, greedy, "
        f"{args.max_new_tokens} new tokens at most.",
        "",
        f"Command: `{result['command']}`",
        "",
        "| workload | tokens per step, per-row guesses | with the shared memory | ratio | "
        "answers equal | decode ms a row step, per-row / shared |",
        "|---|---|---|---|---|---|",
    ]
    for row in result["rows"]:
        lines.append(
            f"| {row['workload']} | {row['per_row']:.3f} | {row['shared']:.3f} | "
            f"**{row['ratio']:.2f}x** | {row['same']} | "
            f"{row['step_ms_per_row']:.1f} / {row['step_ms_shared']:.1f} |"
        )
    write_results(args.out, result, "\n".join(lines) + "\n")


if __name__ == "__main__":
    main()
