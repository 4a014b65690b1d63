"""What int8 weights cost in quality: per-token negative log-likelihood of held-out text
under float32 and int8 weights (teacher forced, one causal pass per text), and how often
greedy outputs agree on the benchmark prompts.

    python scripts/bench/int8_quality.py --out benchmarks/cpu/int8_quality

Held-out text: the source of Python standard-library modules and the long descriptions of
installed packages (English prose) — neither is a benchmark prompt or training data.
Writes OUT.json and OUT.md.
"""

from __future__ import annotations

import argparse
import email
import importlib.metadata
import inspect
import sys
from pathlib import Path

import jax
import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from agreement import agreement, greedy_on_set  # noqa: E402
from machine import cpu_model  # noqa: E402
from results import write_results  # noqa: E402

import lookahead_jax as lj  # noqa: E402
from lookahead_jax.engine.testing import full_pass_logits  # noqa: E402

STDLIB = [
    "argparse", "base64", "bisect", "calendar", "csv", "difflib", "fractions", "glob",
    "heapq", "json.decoder", "shlex", "statistics", "string", "textwrap", "uuid", "zipfile",
]  # fmt: skip
PACKAGES = ["numpy", "jax", "flax", "optax", "orbax-checkpoint", "tokenizers", "tqdm", "jinja2"]


def held_out_texts() -> dict[str, str]:
    texts = {}
    for name in STDLIB:
        module = __import__(name, fromlist=["_"])
        texts[f"code:{name}"] = inspect.getsource(module)
    for name in PACKAGES:
        try:
            meta = importlib.metadata.metadata(name)
        except importlib.metadata.PackageNotFoundError:
            continue
        body = meta.get_payload() if isinstance(meta, email.message.Message) else None
        body = body or meta.get("Description") or ""
        if len(body) > 2000:
            texts[f"prose:{name}"] = body
    return texts


def nll(model, ids: list[int]) -> np.ndarray:
    """-log p(ids[t] | ids[:t]) for t = 1 .. len-1 (float64)."""
    logits = full_pass_logits(model, ids)[:-1]
    logp = jax.nn.log_softmax(logits, axis=-1)
    return -np.asarray(logp)[np.arange(len(ids) - 1), ids[1:]]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--ckpt", default="smollm2-135m")
    ap.add_argument("--tokens", type=int, default=512, help="tokens per held-out text")
    ap.add_argument("--greedy-prompts", type=int, default=20, help="per prompt set")
    ap.add_argument("--max-new-tokens", type=int, default=128)
    ap.add_argument("--out", default="benchmarks/cpu/int8_quality")
    args = ap.parse_args()

    models = {w: lj.load(args.ckpt, weights=w) for w in ("float", "int8")}
    tok = models["float"].tokenizer
    per_text = {}
    for name, text in held_out_texts().items():
        ids = tok.encode(text)[: args.tokens]
        per_text[name] = {w: float(nll(m, ids).mean()) for w, m in models.items()}
        per_text[name]["tokens"] = len(ids)
        print(name, per_text[name], flush=True)

    def mean_nll(kind: str, w: str) -> float:
        rows = [v for k, v in per_text.items() if k.startswith(kind)]
        return sum(r[w] * r["tokens"] for r in rows) / sum(r["tokens"] for r in rows)

    greedy = {}
    for set_name in ("mt_bench", "code"):
        outs = greedy_on_set(models, tok, set_name, args.greedy_prompts, args.max_new_tokens)
        greedy[set_name] = agreement(outs["float"], outs["int8"])
        print(set_name, greedy[set_name], flush=True)

    summary = {kind: {w: mean_nll(kind, w) for w in models} for kind in ("code", "prose", "")}
    for v in summary.values():
        v["int8_vs_float"] = v["int8"] / v["float"] - 1
    result = {
        "command": " ".join(["python", *sys.argv]),
        "cpu": cpu_model(),
        "ckpt": args.ckpt,
        "tokens_per_text": args.tokens,
        "nll_per_text": per_text,
        "nll_mean": {"code": summary["code"], "prose": summary["prose"], "all": summary[""]},
        "greedy_agreement": greedy,
        "param_bytes": {
            name: param_bytes(args.ckpt, dtype, w)
            for name, dtype, w in (
                ("float32", "float32", "float"),
                ("bfloat16", "bfloat16", "float"),
                ("int8 (float32 scales, norms)", "float32", "int8"),
            )
        },
    }
    write_results(args.out, result, markdown(result))


def param_bytes(ckpt, dtype: str, weights: str) -> int:
    model = lj.load(ckpt, dtype=dtype, weights=weights)
    return int(sum(x.nbytes for x in jax.tree.leaves(model.params)))


def markdown(r: dict) -> str:
    lines = [
        f"# int8 weights: quality ({r['cpu']})",
        "",
        f"`{r['command']}` — per-token NLL (nats) of held-out text, the first "
        f"{r['tokens_per_text']} tokens of each text, teacher forced.",
        "",
        "| text | tokens | NLL float32 | NLL int8 | int8 vs float32 |",
        "|---|---|---|---|---|",
    ]
    for name, v in r["nll_mean"].items():
        n = sum(t["tokens"] for k, t in r["nll_per_text"].items() if name == "all" or
                k.startswith(name))  # fmt: skip
        lines.append(
            f"| {name} | {n} | {v['float']:.4f} | {v['int8']:.4f} | {v['int8_vs_float']:+.2%} |"
        )
    lines += ["", "Greedy outputs, int8 against float32:", ""]
    lines += ["| prompts | identical outputs | mean common prefix (tokens) |", "|---|---|---|"]
    for name, g in r["greedy_agreement"].items():
        lines.append(
            f"| {name} ({g['prompts']}) | {g['identical']} | {g['mean_common_prefix']:.1f} |"
        )
    lines += ["", "Parameter bytes on one device:", "", "| weights | bytes |", "|---|---|"]
    for name, n in r["param_bytes"].items():
        lines.append(f"| {name} | {n / 1e6:.1f} MB |")
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    main()
