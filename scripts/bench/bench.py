"""Side-by-side decoding benchmark: Hugging Face greedy, Hugging Face prompt lookup, this
project's plain decoding, its lookahead default and a sweep of (N, W, G) — one run, the
same prompts, repeats interleaved so machine noise hits every system alike.

    python scripts/bench/bench.py --out benchmarks/cpu/bench            # the full run
    python scripts/bench/bench.py --quick --out /tmp/bench_quick        # a smoke check

Writes OUT.json (every measurement), OUT.md (tables) and OUT_speedup.png /
OUT_categories.png. Times exclude compilation (reported separately) and include
the prefill; tokens/s = new tokens / seconds, summed over the prompts of a set or
category, reported as min and median over the repeats.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
os.environ.setdefault("HF_HUB_OFFLINE", "1")

import numpy as np  # noqa: E402
from machine import cpu_model  # noqa: E402
from prompts import category_ranks, prompt_set  # noqa: E402
from tqdm import tqdm  # noqa: E402

import lookahead_jax as lj  # noqa: E402
from lookahead_jax.engine.inputs import bucket  # noqa: E402

# layouts by tokens per step, then the paper's (N, W, G) for comparison
SWEEP = ["tokens=8", "tokens=12", "tokens=16", "4,1,2", "5,1,1"]


class Ours:
    def __init__(self, model, lookahead, temperature: float = 0.0):
        self.model, self.lookahead, self.temperature = model, lookahead, temperature

    def __call__(self, ids: list[int], max_new_tokens: int, seed: int = 0) -> dict:
        out = lj.generate(
            self.model,
            [ids],
            max_new_tokens=max_new_tokens,
            lookahead=self.lookahead,
            temperature=self.temperature,
            seed=seed,
        )
        s = out.stats
        return {
            "tokens": out.token_ids[0],
            "seconds": s.prefill_s + s.decode_s,
            "steps": out.steps[0],
            "compile_s": s.compile_s,
            "lookahead": s.as_dict()["config"]["lookahead"],
            "auto": s.as_dict()["config"].get("lookahead_auto"),
        }


class HF:
    def __init__(self, hf_model, prompt_lookup: int | None, temperature: float = 0.0):
        self.model, self.prompt_lookup, self.temperature = hf_model, prompt_lookup, temperature

    def __call__(self, ids: list[int], max_new_tokens: int, seed: int = 0) -> dict:
        import torch

        torch.manual_seed(seed)
        x = torch.as_tensor([ids])
        kw = {"prompt_lookup_num_tokens": self.prompt_lookup} if self.prompt_lookup else {}
        if self.temperature > 0:
            kw.update(do_sample=True, temperature=self.temperature, top_k=0)
        t = time.perf_counter()
        with torch.no_grad():
            out = self.model.generate(
                x,
                attention_mask=torch.ones_like(x),
                max_new_tokens=max_new_tokens,
                **{"do_sample": False, **kw},
            )
        seconds = time.perf_counter() - t
        new = out[0, len(ids) :].tolist()
        eos = self.model.generation_config.eos_token_id
        eos = set(eos if isinstance(eos, list) else [eos])
        cut = next((i for i, t in enumerate(new) if t in eos), len(new))
        return {"tokens": new[:cut], "seconds": seconds, "steps": None}


def load_hf(model: lj.Model):
    import torch
    from transformers import AutoModelForCausalLM

    from lookahead_jax.checkpoints import default_model

    src = Path(str(model.path))
    if str(model.path) == str(default_model.checkpoint_path()):
        gguf = default_model.gguf_path()
        hf = AutoModelForCausalLM.from_pretrained(
            str(gguf.parent), gguf_file=gguf.name, dtype=torch.float32
        )
    else:
        manifest = json.loads((src / "manifest.json").read_text())
        origin = Path(manifest["source"]["path"])
        if manifest["source"]["kind"] == "gguf":
            hf = AutoModelForCausalLM.from_pretrained(
                str(origin.parent), gguf_file=origin.name, dtype=torch.float32
            )
        else:
            hf = AutoModelForCausalLM.from_pretrained(str(origin), dtype=torch.float32)
    torch.set_num_threads(os.cpu_count() or 1)
    return hf.eval()


def summarize(records: list[dict], systems: list[str], repeats: int) -> dict:
    """tokens/s per system: min/median over repeats of (sum tokens / sum seconds)."""
    out = {}
    for name in systems:
        recs = [r for r in records if r["system"] == name]
        if not recs:
            continue
        per_repeat = []
        for k in range(repeats):
            rr = [r for r in recs if r["repeat"] == k]
            if rr:
                per_repeat.append(sum(len(r["tokens"]) for r in rr) / sum(r["seconds"] for r in rr))
        steps = [r["steps"] for r in recs if r["steps"] is not None and r["repeat"] == 0]
        toks = [len(r["tokens"]) for r in recs if r["repeat"] == 0]
        secs = [r["seconds"] for r in recs]
        out[name] = {
            "tokens_per_s_median": float(np.median(per_repeat)),
            "tokens_per_s_min": float(np.min(per_repeat)),
            "tokens_per_s_max": float(np.max(per_repeat)),
            "new_tokens": int(sum(toks)),
            "steps": int(sum(steps)) if steps else None,
            "compression": sum(toks) / sum(steps) if steps else None,
            "step_ms": 1000 * sum(secs) / repeats / sum(steps) if steps else None,
        }
    return out


def auto_choices(records) -> dict:
    """How often auto chose each config, and how often it switched to plain mid-way."""
    out: dict[str, int] = {}
    for r in records:
        if r["system"].startswith("lookahead_default") and r.get("auto"):
            chosen = r["auto"]["chosen"]
            if chosen is None:
                key = "plain"
            else:  # a layout's name ("tokens=12") or an old (N, W, G) list
                key = chosen if isinstance(chosen, str) else ",".join(map(str, chosen))
            if r["system"] != "lookahead_default":
                key = f"{r['system'].removeprefix('lookahead_default_')}: {key}"
            if r["auto"].get("switched_to_plain_after_steps") is not None:
                key += " -> plain"
            out[key] = out.get(key, 0) + 1
    return out


def geomean(xs):
    return float(math.exp(np.mean(np.log(xs)))) if xs else None


def plain_of(system: str) -> str:
    """The plain system a lookahead system must equal: 'plain' or e.g. 'plain_int8'."""
    return "plain_int8" if system.endswith("_int8") else "plain"


def per_prompt_speedups(records, system, base="plain"):
    """{prompt key: median-seconds(base) / median-seconds(system)} (same tokens, so a
    ratio of times is a ratio of tokens/s)."""

    def med(sysname, key):
        return np.median(
            [r["seconds"] for r in records if r["system"] == sysname and (r["set"], r["id"]) == key]
        )

    keys = {(r["set"], r["id"]) for r in records if r["system"] == system}
    return {k: med(base, k) / med(system, k) for k in keys}


def plot(results: dict, out: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    sets = list(results["sets"])
    fig, axes = plt.subplots(1, len(sets), figsize=(6 * len(sets), 4.5), squeeze=False)
    for ax, name in zip(axes[0], sets, strict=True):
        summ = results["sets"][name]["summary"]
        base = summ["plain"]["tokens_per_s_median"]
        names = [s for s in summ if s != "plain"]
        vals = [summ[s]["tokens_per_s_median"] / base for s in names]
        colors = ["tab:gray" if s.startswith("hf") else "tab:blue" for s in names]
        ax.barh(names, vals, color=colors)
        ax.axvline(1.0, color="k", lw=1)
        ax.set_xlabel("tokens/s relative to this project's plain decoding (median)")
        ax.set_title(f"{name}: {results['model']} ({results['device']})", fontsize=9)
    fig.tight_layout()
    fig.savefig(out.with_name(out.name + "_speedup.png"), dpi=110)

    cats = results["sets"].get("mt_bench", {}).get("categories")
    if cats:
        systems = [
            s
            for s in ("hf_greedy", "hf_prompt_lookup", "plain", "lookahead_default")
            if s in next(iter(cats.values()))
        ]
        fig, ax = plt.subplots(figsize=(10, 4.5))
        names = sorted(cats)
        width = 0.8 / len(systems)
        for i, s in enumerate(systems):
            ax.bar(
                np.arange(len(names)) + i * width,
                [cats[c][s]["tokens_per_s_median"] for c in names],
                width,
                label=s,
            )
        ax.set_xticks(np.arange(len(names)) + 0.4 - width / 2, names)
        ax.set_ylabel("tokens/s (median of repeats)")
        ax.set_title(f"MT-bench by category: {results['model']} ({results['device']})", fontsize=9)
        ax.legend(fontsize=8)
        fig.tight_layout()
        fig.savefig(out.with_name(out.name + "_categories.png"), dpi=110)


def markdown(results: dict) -> str:
    lines = [
        f"# Decoding benchmark: {results['model']} on {results['device']}",
        "",
        f"Command: `{results['command']}`",
        "",
        f"{results['max_new_tokens']} new tokens, "
        + ("greedy" if not results["temperature"] else f"temperature {results['temperature']}")
        + f", {results['dtype']}, "
        f"lookahead_default = the CLI default, auto (its choices: {results['auto_choices']}), "
        f"{results['repeats']} repeats (tokens/s min / median over repeats; speedup = "
        "ratio of medians). Lookahead rows equal plain rows token for token: "
        f"{results['exact_rows']}.",
        "",
    ]
    for name, data in results["sets"].items():
        summ = data["summary"]
        base = summ["plain"]["tokens_per_s_median"]
        hf = summ.get("hf_greedy", {}).get("tokens_per_s_median")
        lines += [
            f"## {name} ({data['prompts']} prompts)",
            "",
            "| system | tokens/s median | min | vs plain | vs HF greedy | compression | step ms |",
            "|---|---|---|---|---|---|---|",
        ]
        for s, r in summ.items():
            comp = f"{r['compression']:.2f}" if r["compression"] else ""
            step = f"{r['step_ms']:.1f}" if r["step_ms"] else ""
            vs_hf = f"{r['tokens_per_s_median'] / hf:.2f}x" if hf else ""
            lines.append(
                f"| {s} | {r['tokens_per_s_median']:.1f} | {r['tokens_per_s_min']:.1f} "
                f"| {r['tokens_per_s_median'] / base:.2f}x | {vs_hf} | {comp} | {step} |"
            )
        if data.get("geomean_speedup"):
            lines += [
                "",
                "Geometric mean of per-prompt speedups over plain: "
                + ", ".join(f"{k} {v:.2f}x" for k, v in data["geomean_speedup"].items()),
            ]
        if data.get("categories"):
            systems = list(next(iter(data["categories"].values())))
            lines += [
                "",
                "| category | "
                + " | ".join(f"{s} tok/s" for s in systems)
                + " | default vs plain |",
                "|---" * (len(systems) + 2) + "|",
            ]
            for c, rows in sorted(data["categories"].items()):
                ratio = (
                    (
                        rows["lookahead_default"]["tokens_per_s_median"]
                        / rows["plain"]["tokens_per_s_median"]
                    )
                    if "lookahead_default" in rows
                    else float("nan")
                )
                lines.append(
                    f"| {c} | "
                    + " | ".join(f"{rows[s]['tokens_per_s_median']:.1f}" for s in systems)
                    + f" | {ratio:.2f}x |"
                )
        lines.append("")
    return "\n".join(lines)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--ckpt", default="smollm2-135m")
    ap.add_argument("--sets", default="mt_bench,code")
    ap.add_argument("--max-new-tokens", type=int, default=256)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument(
        "--sweep",
        default=" ".join(SWEEP),
        help="space-separated configs: tokens=T, N,W,G or key=value,... ('' for none)",
    )
    ap.add_argument(
        "--sweep-prompts",
        type=int,
        default=2,
        help="per category, the first K prompts run the sweep (it is slow)",
    )
    ap.add_argument("--sweep-repeats", type=int, default=1, help="repeats for the sweep")
    ap.add_argument(
        "--per-category",
        type=int,
        default=0,
        help="only the first K prompts of each category (0 = every prompt)",
    )
    ap.add_argument("--no-hf", action="store_true", help="skip the Hugging Face systems")
    ap.add_argument(
        "--weights",
        default="float",
        help="comma-separated: float and/or int8 (adds plain_int8 and lookahead_default_int8)",
    )
    ap.add_argument(
        "--temperature",
        type=float,
        default=0.0,
        help="0 = greedy (default); > 0 samples (every system, a new seed per call)",
    )
    ap.add_argument(
        "--quick",
        action="store_true",
        help="smoke check: 1 prompt per set, 16 tokens, 1 repeat, one sweep config",
    )
    ap.add_argument("--out", default="benchmarks/cpu/bench")
    args = ap.parse_args()
    if args.quick:
        args.max_new_tokens, args.repeats, args.sweep = 16, 1, "3,1,1"

    model = lj.load(args.ckpt)
    # the default is the CLI's: lookahead "auto"
    temp = args.temperature
    systems = {"plain": Ours(model, None, temp), "lookahead_default": Ours(model, "auto", temp)}
    for weights in [w for w in args.weights.split(",") if w != "float"]:
        quantized = lj.load(args.ckpt, weights=weights)
        systems[f"plain_{weights}"] = Ours(quantized, None, temp)
        systems[f"lookahead_default_{weights}"] = Ours(quantized, "auto", temp)
    sweep = [s for s in args.sweep.split() if s]
    for s in sweep:
        systems[f"lookahead_{s}"] = Ours(model, lj.LookaheadConfig.parse(s), temp)
    in_sweep = {f"lookahead_{s}" for s in sweep}.__contains__
    if not args.no_hf:
        hf = load_hf(model)
        systems["hf_greedy" if temp == 0 else "hf_sampling"] = HF(hf, None, temp)
        if temp == 0:  # transformers' prompt lookup is greedy-only
            systems["hf_prompt_lookup"] = HF(hf, 10)

    prompts = []
    for name in args.sets.split(","):
        rows = prompt_set(name)
        if args.quick:
            rows = rows[:1]
        for rank, r in category_ranks(rows):
            if args.per_category and rank > args.per_category:
                continue
            ids = model.tokenizer.encode_prompt(r["prompt"], chat=True)
            prompts.append(
                {
                    **r,
                    "set": name,
                    "ids": ids,
                    "sweep": rank <= args.sweep_prompts or args.quick,
                }
            )

    records, compile_s = [], {}
    # warm up: compile every prompt-length bucket once for our systems (one prompt per
    # bucket is enough: shapes, not contents, decide what compiles), load kernels for HF
    by_bucket: dict[tuple[int, bool], dict] = {}
    for p in prompts:
        by_bucket.setdefault((bucket(len(p["ids"])), p["sweep"]), p)
    warm = list(by_bucket.values())
    for name, fn in tqdm(systems.items(), desc="warm-up", leave=False):
        for p in warm if name.startswith(("plain", "lookahead")) else prompts[:1]:
            if in_sweep(name) and not p["sweep"]:
                continue
            r = fn(p["ids"], args.max_new_tokens)
            compile_s[name] = compile_s.get(name, 0.0) + r.get("compile_s", 0.0)
    total = sum(len(systems) for _ in prompts) * args.repeats
    bar = tqdm(total=total, desc="bench")
    t0 = time.time()
    for k in range(args.repeats):
        for i, p in enumerate(prompts):
            names = list(systems)
            names = names[i % len(names) :] + names[: i % len(names)]  # rotate the order
            for name in names:
                bar.update(1)
                if in_sweep(name) and (not p["sweep"] or k >= args.sweep_repeats):
                    continue
                # the same seed for every system on a prompt and repeat: under sampling our
                # plain and lookahead decoding then draw the same tokens (sampling.py)
                r = systems[name](p["ids"], args.max_new_tokens, seed=1000 * k + i)
                records.append(
                    {
                        "system": name,
                        "repeat": k,
                        "set": p["set"],
                        "id": p["id"],
                        "category": p["category"],
                        **r,
                    }
                )
        # after each repeat: what a run cut off at a time limit leaves (device runs)
        partial = Path(args.out).with_name(Path(args.out).name + ".partial.json")
        partial.parent.mkdir(parents=True, exist_ok=True)
        partial.write_text(json.dumps({"repeats_done": k + 1, "records": records}) + "\n")
    bar.close()

    plain_tokens = {  # each lookahead system against plain decoding of the same weights
        (r["system"], r["set"], r["id"]): r["tokens"]
        for r in records
        if r["system"].startswith("plain") and r["repeat"] == 0
    }
    ours = [r for r in records if r["system"].startswith("lookahead") and r["repeat"] == 0]
    exact = sum(
        r["tokens"] == plain_tokens[(plain_of(r["system"]), r["set"], r["id"])] for r in ours
    )
    import jax

    device = jax.devices()[0]
    results = {
        "command": " ".join(["python", *sys.argv]),
        "model": args.ckpt,
        "dtype": "float32",
        "temperature": temp,
        "max_new_tokens": args.max_new_tokens,
        "repeats": args.repeats,
        "seconds": time.time() - t0,
        "device": f"{device.platform} {cpu_model()} x{os.cpu_count()}"
        if device.platform == "cpu"
        else f"{device.platform}:{device.device_kind}",
        "default_lookahead": "auto",
        "auto_choices": auto_choices(records),
        "compile_s": compile_s,
        "exact_rows": f"{exact}/{len(ours)}",
        "sets": {},
    }
    for name in args.sets.split(","):
        recs = [r for r in records if r["set"] == name]
        data = {"prompts": len({r["id"] for r in recs})}
        sweep_ids = {p["id"] for p in prompts if p["set"] == name and p["sweep"]}
        full = [s for s in systems if not in_sweep(s)]
        data["summary"] = summarize(recs, full, args.repeats)
        sub = [r for r in recs if r["id"] in sweep_ids]
        sweep_summary = summarize(sub, list(systems), args.repeats)
        base = sweep_summary["plain"]["tokens_per_s_median"]
        data["sweep"] = {
            "prompts": len(sweep_ids),
            "summary": sweep_summary,
            "speedup_vs_plain": {
                s: v["tokens_per_s_median"] / base for s, v in sweep_summary.items()
            },
        }
        data["geomean_speedup"] = {
            s: geomean(list(per_prompt_speedups(recs, s).values())) for s in full if s != "plain"
        }
        cats = sorted({r["category"] for r in recs})
        data["categories"] = {
            c: summarize([r for r in recs if r["category"] == c], full, args.repeats) for c in cats
        }
        results["sets"][name] = data
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    # OUT may contain dots (sampling_t0.7): append suffixes rather than replace one
    out.with_name(out.name + ".json").write_text(json.dumps({**results, "records": records}) + "\n")
    md = markdown(results)
    for name, data in results["sets"].items():
        md += f"\n## sweep on {name} ({data['sweep']['prompts']} prompts)\n\n"
        md += "| system | tokens/s median | vs plain | compression |\n|---|---|---|---|\n"
        for s, v in data["sweep"]["summary"].items():
            comp = f"{v['compression']:.2f}" if v["compression"] else ""
            md += (
                f"| {s} | {v['tokens_per_s_median']:.1f} | "
                f"{data['sweep']['speedup_vs_plain'][s]:.2f}x | {comp} |\n"
            )
    out.with_name(out.name + ".md").write_text(md)
    plot(results, out)
    print(md)


if __name__ == "__main__":
    main()
