"""Dataset throughput (issue 25): the engine (continuous batching) against static batches
through lj.generate and Hugging Face's batched generate, at several batch sizes.

    python scripts/bench/engine_bench.py --out benchmarks/cpu/engine            # 3 MT-bench a
        # category + 2 code a kind, 256 tokens, B = 1 4 8 16
    python scripts/bench/engine_bench.py --per-category 0 --out ...             # all 100 prompts

Systems, each over the same prompts (chat template), greedy, float32:
  engine_plain   lj.Engine, plain decoding          static_plain  lj.generate, batches of B
  engine_auto    lj.Engine, lookahead="auto"        engine_t8/t16 lj.Engine, tokens=8/16
  hf             transformers generate, batches of B, left padding
  engine_plain_before   engine_plain with an earlier version's lookahead_jax (--before
                 TREE: a source tree, run in a process of its own)

Tokens/s = all new tokens / the seconds of the whole set. Engine runs are timed after
a warm-up run of the same set (untimed), so no timing holds a compilation, except a
mid-run switch of auto to plain (part of auto's cost); static batches count prefill +
decode seconds (generate reports compilation apart). Auto starts from an empty cache
(--cache-dir): its cost curve at each B and its acceptance factor are measured in the
warm-up run (the timed run starts from what the warm-up learned).
Every engine row is compared with a plain decode of its prompt alone (the static plain
row, or engine plain at B = 1; float32: identical, or different from a near-tie on).
Writes OUT.json after every measurement, OUT.md and OUT.png at the end.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
os.environ.setdefault("HF_HUB_OFFLINE", "1")

SYSTEMS = [
    "engine_plain",
    "static_plain",
    "engine_auto",
    "engine_t8",
    "engine_t16",
    "hf",
    "engine_plain_before",
]
LOOKAHEAD = {
    "engine_plain": None,
    "engine_auto": "auto",
    "engine_t8": 8,
    "engine_t16": 16,
    "engine_plain_before": None,
}


def pick_prompts(per_category: int, sets: str = "mt_bench,code") -> list[dict]:
    from prompts import category_ranks, code, mt_bench

    rows = [dict(r, set="mt_bench") for r in mt_bench()] + [dict(r, set="code") for r in code()]
    rows = [r for r in rows if r["set"] in sets.split(",")]
    if per_category:
        keep_code = max(1, per_category - 1)
        rows = [
            r
            for k, r in category_ranks(rows)
            if k <= (per_category if r["set"] == "mt_bench" else keep_code)
        ]
    return rows


def run_engine(model, ids, batch, lookahead, max_new):
    import lookahead_jax as lj

    if isinstance(lookahead, int):
        lookahead = lj.LookaheadConfig.for_tokens(lookahead)
    kw = dict(
        batch=batch,
        max_new_tokens=max_new,
        lookahead=lookahead,
        steps_per_call=64,
    )
    # warm-up: the same run once, untimed, so that every shape the timed run prefills and
    # decodes at is compiled (the admissions' shapes depend on which prompts arrive
    # together: a ragged prefill's on the sum of their lengths)
    list(lj.Engine(model, **kw).run(ids))
    engine = lj.Engine(model, **kw)
    t = time.perf_counter()
    results = list(engine.run(ids))
    seconds = time.perf_counter() - t
    tokens = [None] * len(ids)
    for r in results:
        tokens[r.id] = r.token_ids
    # a tree from before Stats was a dataclass (--before) gives a dict
    stats = engine.stats if isinstance(engine.stats, dict) else engine.stats.as_dict()
    config = stats["config"]
    return {
        "tokens": tokens,
        "seconds": seconds,
        "row_steps": stats["row_steps"],
        "rounds": stats["rounds"],
        "compression": stats["compression"],
        "compile_s_in_timing": stats["compile_s"],
        "prefill_s": stats["prefill_s"],
        "decode_s": stats["decode_s"],
        "prompt_tokens": sum(map(len, ids)),
        "prefill_positions": stats["prefill_positions"],  # padding included
        "lookahead": config["lookahead"] and config["lookahead"]["name"],
        "auto": config.get("lookahead_auto"),
        "switched_to_plain_after_steps": (config.get("lookahead_auto") or {}).get(
            "switched_to_plain_after_steps"
        ),
    }


def run_before(tree: str, ids, batch: int, max_new: int) -> dict:
    """engine_plain with the lookahead_jax of another source tree (`--before`), in a
    process of its own: the same prompts, budget and warm-up."""
    with tempfile.NamedTemporaryFile("w", suffix=".json", delete=False) as f:
        json.dump({"ids": ids, "batch": batch, "max_new": max_new}, f)
    env = dict(os.environ, PYTHONPATH=str(Path(tree).resolve()))
    cmd = [sys.executable, __file__, "--child", f.name, "--out", "-"]
    done = subprocess.run(cmd, env=env, check=True, stdout=subprocess.PIPE, text=True)
    os.unlink(f.name)
    return json.loads(done.stdout.splitlines()[-1])


def child(path: str) -> None:
    import lookahead_jax as lj

    job = json.loads(Path(path).read_text())
    model = lj.load("smollm2-135m")
    print(json.dumps(run_engine(model, job["ids"], job["batch"], None, job["max_new"])))


def run_static(model, ids, batch, max_new):
    import lookahead_jax as lj

    tokens, seconds, steps = [], 0.0, 0
    for i in range(0, len(ids), batch):
        out = lj.generate(model, ids[i : i + batch], max_new_tokens=max_new, lookahead=None)
        tokens += out.token_ids
        seconds += out.stats.prefill_s + out.stats.decode_s
        steps += max(out.steps)
    return {"tokens": tokens, "seconds": seconds, "batch_steps": steps}


def run_hf(hf, ids, batch, max_new, pad_id, eos_ids):
    import torch

    tokens, seconds = [], 0.0
    for i in range(0, len(ids), batch):
        rows = ids[i : i + batch]
        width = max(map(len, rows))
        x = torch.full((len(rows), width), pad_id, dtype=torch.long)
        mask = torch.zeros((len(rows), width), dtype=torch.long)
        for b, p in enumerate(rows):  # left padding
            x[b, width - len(p) :] = torch.as_tensor(p)
            mask[b, width - len(p) :] = 1
        t = time.perf_counter()
        with torch.no_grad():
            out = hf.generate(
                x, attention_mask=mask, max_new_tokens=max_new, do_sample=False, pad_token_id=pad_id
            )
        seconds += time.perf_counter() - t
        for b in range(len(rows)):
            new = out[b, width:].tolist()
            cut = next((j for j, t in enumerate(new) if t in eos_ids), len(new))
            tokens.append(new[:cut])
    return {"tokens": tokens, "seconds": seconds}


def agreement(model, prompts_ids, got, want) -> dict:
    """Rows identical to the static plain rows; the others must first differ at a
    near-tie of the plain model (float32), else the row is counted as a mismatch."""
    import numpy as np

    from lookahead_jax.engine.testing import first_divergence, top2_gap
    from tests.helpers import teacher_forced_logits

    same, near_tie, mismatch = 0, 0, []
    for i, (g, w) in enumerate(zip(got, want, strict=True)):
        j = first_divergence(g, w)
        if j is None:
            same += 1
            continue
        if j < min(len(g), len(w)):
            gap = top2_gap(np.asarray(teacher_forced_logits(model, prompts_ids[i] + w[:j])[-1]))
            if gap < 1e-4:
                near_tie += 1
                continue
        mismatch.append(i)
    return {"identical": same, "near_tie": near_tie, "mismatch": mismatch}


def summary(results: dict) -> dict:
    out = {}
    for B, systems in results["runs"].items():
        row = {}
        for name, r in systems.items():
            new = sum(len(t) for t in r["tokens"])
            row[name] = {
                "tokens_per_s": new / r["seconds"],
                "new_tokens": new,
                **{k: v for k, v in r.items() if k not in ("tokens",)},
            }
        out[B] = row
    return out


def markdown(results: dict) -> str:
    s = summary(results)
    lines = [
        "# Dataset engine: continuous batching vs static batches vs HF (issue 25)",
        "",
        f"CPU: {results['cpu']} ({os.cpu_count()} cores), JAX {results['jax']}, float32, "
        f"SmolLM2-135M-Instruct, greedy, {results['prompts']} prompts "
        f"({results['sets']}), at most {results['max_new_tokens']} new tokens, 1 run each.",
        "",
        f"Command: `{results['command']}`",
        "",
        "Tokens/s (all new tokens / seconds of the whole set):",
        "",
        "| B | " + " | ".join(SYSTEMS) + " | engine plain / static | auto / engine plain "
        "| best engine / HF |",
        "|---|" + "---|" * (len(SYSTEMS) + 3),
    ]
    for B, row in s.items():
        tps = {k: row[k]["tokens_per_s"] for k in row}
        cells = [f"{tps[k]:.1f}" if k in tps else "–" for k in SYSTEMS]

        def ratio(a, b, tps=tps):
            return f"{tps[a] / tps[b]:.2f}x" if a in tps and b in tps else "–"

        engines = [k for k in tps if k.startswith("engine")]
        best = max(engines, key=tps.get) if engines else None
        best_hf = f"{tps[best] / tps['hf']:.2f}x ({best})" if best and "hf" in tps else "–"
        lines.append(
            f"| {B} | " + " | ".join(cells) + f" | {ratio('engine_plain', 'static_plain')} | "
            f"{ratio('engine_auto', 'engine_plain')} | {best_hf} |"
        )
    lines += ["", "Engine details (compression = new tokens / row steps; auto's choice):", ""]
    lines += ["| B | system | compression | rounds | auto chose | switched to plain after |"]
    lines += ["|---|---|---|---|---|---|"]
    for B, row in s.items():
        for k in SYSTEMS:
            if k in row and k.startswith("engine"):
                r = row[k]
                lines.append(
                    f"| {B} | {k} | {r['compression']:.2f} | {r['rounds']} | "
                    f"{r['lookahead'] or 'plain'} | {r['switched_to_plain_after_steps'] or '–'} |"
                )
    lines += ["", "Engine prefill (prompt tokens against the positions run, padding included):", ""]
    lines += ["| B | system | prefill s | decode s | prompt tokens | positions run | padding "
              "| prompt tokens / prefill s |", "|---|---|---|---|---|---|---|---|"]  # fmt: skip
    for B, row in s.items():
        for k in SYSTEMS:
            r = row.get(k, {})
            if k.startswith("engine") and "prefill_positions" in r:
                pad = 1 - r["prompt_tokens"] / max(1, r["prefill_positions"])
                lines.append(
                    f"| {B} | {k} | {r['prefill_s']:.2f} | {r['decode_s']:.2f} | "
                    f"{r['prompt_tokens']} | {r['prefill_positions']} | {pad:.0%} | "
                    f"{r['prompt_tokens'] / max(r['prefill_s'], 1e-9):.0f} |"
                )
    lines += [
        "",
        "Exactness (engine rows against a plain decode of each prompt alone: the static "
        "plain rows, or engine plain at B = 1; float32):",
        "",
    ]
    for B, ag in results.get("agreement", {}).items():
        for k, a in ag.items():
            lines.append(
                f"* B={B} {k}: {a['identical']} identical, {a['near_tie']} differ from a "
                f"near-tie on, mismatches {a['mismatch']}"
            )
    return "\n".join(lines) + "\n"


def plot(results: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    s = summary(results)
    Bs = list(s)
    fig, ax = plt.subplots(figsize=(8, 4.5))
    width = 0.8 / len(SYSTEMS)
    for j, k in enumerate(SYSTEMS):
        ys = [s[B][k]["tokens_per_s"] if k in s[B] else 0 for B in Bs]
        ax.bar([i + j * width for i in range(len(Bs))], ys, width, label=k)
    ax.set_xticks([i + 0.4 - width / 2 for i in range(len(Bs))], [f"B={B}" for B in Bs])
    ax.set_ylabel("new tokens / s")
    ax.set_title(f"SmolLM2-135M, {results['prompts']} prompts, {results['cpu']}", fontsize=9)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=120)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--batches", default="1,4,8,16")
    ap.add_argument("--systems", default=",".join(SYSTEMS))
    ap.add_argument("--per-category", type=int, default=3, help="0: every prompt")
    ap.add_argument("--max-new-tokens", type=int, default=256)
    ap.add_argument("--sets", default="mt_bench,code", help="prompt sets: mt_bench,code")
    ap.add_argument("--cache-dir", default=None, help="default: a new temporary directory")
    ap.add_argument("--out", required=True)
    ap.add_argument(
        "--before",
        default=None,
        metavar="TREE",
        help="source tree of an earlier version, measured as engine_plain_before",
    )
    ap.add_argument("--child", default=None, help=argparse.SUPPRESS)
    ap.add_argument(
        "--reuse",
        default=None,
        metavar="FILE.json:SYSTEM,...",
        help="take these systems' runs from an earlier result file of the same prompts "
        "instead of measuring them again (e.g. hf, which no engine change affects)",
    )
    args = ap.parse_args()
    if args.child:
        return child(args.child)
    reused = {}
    if args.reuse:
        path, names = args.reuse.rsplit(":", 1)
        earlier = json.loads(Path(path).read_text())
        reused = {
            B: {k: r for k, r in runs.items() if k in names.split(",")}
            for B, runs in earlier["runs"].items()
        }
    os.environ["LOOKAHEAD_JAX_CACHE"] = args.cache_dir or tempfile.mkdtemp(prefix="engine_")

    import jax
    from machine import cpu_model
    from results import write_results

    import lookahead_jax as lj

    sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # tests.helpers
    rows = pick_prompts(args.per_category, args.sets)
    model = lj.load("smollm2-135m")
    ids = [model.tokenizer.encode_prompt(r["prompt"], chat=True) for r in rows]
    systems = args.systems.split(",")
    hf = None
    if "hf" in systems:
        from bench import load_hf

        hf = load_hf(model)
    results = {
        "command": "python " + " ".join(sys.argv),
        "cpu": cpu_model(),
        "jax": jax.__version__,
        "prompts": len(rows),
        "sets": ", ".join(f"{n} {sum(r['set'] == n for r in rows)}" for n in ("mt_bench", "code")),
        "max_new_tokens": args.max_new_tokens,
        "prompt_ids": [r["id"] for r in rows],
        "runs": {},
        "agreement": {},
    }
    out = Path(args.out)
    for B in map(int, args.batches.split(",")):
        runs = results["runs"].setdefault(str(B), {})
        for name in systems:
            if name in reused.get(str(B), {}):
                runs[name] = {**reused[str(B)][name], "reused_from": args.reuse}
                print(f"B={B} {name}: reused from {args.reuse}", flush=True)
                continue
            t = time.perf_counter()
            if name == "static_plain":
                runs[name] = run_static(model, ids, B, args.max_new_tokens)
            elif name == "engine_plain_before":
                if not args.before:
                    raise SystemExit("engine_plain_before needs --before TREE")
                runs[name] = run_before(args.before, ids, B, args.max_new_tokens)
            elif name == "hf":
                eos = set(model.eos_ids)
                runs[name] = run_hf(hf, ids, B, args.max_new_tokens, min(eos), eos)
            else:
                runs[name] = run_engine(model, ids, B, LOOKAHEAD[name], args.max_new_tokens)
            new = sum(len(x) for x in runs[name]["tokens"])
            print(
                f"B={B} {name}: {new / runs[name]['seconds']:.1f} tokens/s "
                f"({time.perf_counter() - t:.0f} s with warm-up)",
                flush=True,
            )
            write_results(out, results)
        # each engine row against a plain decode of its prompt alone: the static plain
        # rows of this batch size, or else engine plain at B = 1 (one prompt at a time)
        alone = runs.get("static_plain") or results["runs"].get("1", {}).get("engine_plain")
        if alone is not None:
            results["agreement"][str(B)] = {
                k: agreement(model, ids, runs[k]["tokens"], alone["tokens"])
                for k in runs
                if k.startswith("engine")
            }
    write_results(out, results, markdown(results))
    plot(results, out.with_name(out.name + ".png"))


if __name__ == "__main__":
    main()
