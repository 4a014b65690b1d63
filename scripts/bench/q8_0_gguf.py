"""A Q8_0 GGUF kept as int8: SmolLM2 written as a Q8_0 GGUF (every matrix requantized from
the bundled Q4_1, as `llama-quantize --allow-requantize` would), converted, and loaded
three ways: float32 (the file's values, dequantized exactly), `--weights q8_0` (the
file's own int8 values and block scales) and `--weights int8` (per-channel requantized).
Measures whether q8_0 holds the file's weights exactly, per-token plain decoding time
(batch 1, interleaved repeats), per-token NLL of held-out text, greedy agreement with
the float32 model and parameter bytes.

    python scripts/bench/q8_0_gguf.py --out benchmarks/cpu/q8_0_gguf

Writes OUT.json and OUT.md (the GGUF and its checkpoint go to a temporary directory).
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

import jax
import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from agreement import agreement, greedy_on_set  # noqa: E402
from int8_quality import held_out_texts, nll  # noqa: E402
from machine import cpu_model  # noqa: E402
from results import write_results  # noqa: E402

import lookahead_jax as lj  # noqa: E402
from lookahead_jax.models.llama import flat_names  # noqa: E402
from lookahead_jax.models.quantize import CONTRACTED, Int8Weight, dequantize  # noqa: E402

WEIGHTS = ("float", "q8_0", "int8")
PROMPT = "Write a long story about a lighthouse keeper and a storm, in ten paragraphs."


def requantize_gguf(src: Path, dst: Path) -> dict[str, int]:
    """Copy a GGUF with every 2-D tensor quantized to Q8_0 (metadata kept, file type set
    to MOSTLY_Q8_0); returns how many tensors of each source type were requantized."""
    import gguf

    reader = gguf.GGUFReader(str(src))
    arch = reader.fields["general.architecture"].contents()
    writer = gguf.GGUFWriter(str(dst), arch)
    for field in reader.fields.values():
        if field.name == "general.architecture" or field.name.startswith("GGUF."):
            continue  # written by GGUFWriter itself
        kind = field.types[0]
        sub = field.types[-1] if kind == gguf.GGUFValueType.ARRAY else None
        value = field.contents()
        if field.name == "general.file_type":
            value = int(gguf.LlamaFileType.MOSTLY_Q8_0)
        writer.add_key_value(field.name, value, kind, sub_type=sub)
    sources: dict[str, int] = {}
    for t in reader.tensors:
        w = gguf.quants.dequantize(t.data, t.tensor_type).astype(np.float32)
        w = w.reshape([int(x) for x in reversed(t.shape)])
        if w.ndim == 2:
            sources[t.tensor_type.name] = sources.get(t.tensor_type.name, 0) + 1
            q8 = gguf.GGMLQuantizationType.Q8_0
            writer.add_tensor(t.name, gguf.quants.quantize(w, q8), raw_dtype=q8)
        else:
            writer.add_tensor(t.name, w)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return sources


def exact_matrices(q8, floats) -> dict[str, bool]:
    """Per quantized matrix: do q8_0's int8 values times its block scales give back the
    float32 checkpoint (the GGUF's dequantized values) bit for bit?"""
    flat = flat_names(q8.params, is_leaf=lambda x: isinstance(x, Int8Weight))
    want = flat_names(floats.params)
    return {
        name: bool(np.array_equal(np.asarray(dequantize(flat[name])), np.asarray(want[name])))
        for name in CONTRACTED
        if name in flat
    }


def param_bytes(model) -> int:
    return int(sum(x.nbytes for x in jax.tree.leaves(model.params)))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeats", type=int, default=10, help="timing repeats (interleaved)")
    ap.add_argument("--max-new-tokens", type=int, default=64, help="per timing run")
    ap.add_argument("--tokens", type=int, default=512, help="tokens per held-out text")
    ap.add_argument("--greedy-prompts", type=int, default=20, help="per prompt set")
    ap.add_argument("--greedy-tokens", type=int, default=128)
    ap.add_argument("--out", default="benchmarks/cpu/q8_0_gguf")
    args = ap.parse_args()

    from lookahead_jax.checkpoints.convert.convert import convert
    from lookahead_jax.checkpoints.default_model import gguf_path

    with tempfile.TemporaryDirectory(prefix="q8_0_gguf.") as d:  # removed once loaded
        tmp = Path(d)
        t0 = time.perf_counter()
        sources = requantize_gguf(gguf_path(), tmp / "smollm2-q8_0.gguf")
        convert(tmp / "smollm2-q8_0.gguf", tmp / "ckpt", progress=False)
        print(f"wrote and converted the Q8_0 GGUF in {time.perf_counter() - t0:.0f} s", flush=True)
        # every format through XLA's matmuls (cpu_kernel=False: Q8_0 has no kernel path,
        # and exact_matrices reads the weights by their checkpoint names)
        models = {w: lj.load(tmp / "ckpt", weights=w, cpu_kernel=False) for w in WEIGHTS}
    exact = exact_matrices(models["q8_0"], models["float"])
    print("q8_0 exact:", exact, flush=True)

    ids = [models["float"].tokenizer.encode_prompt(PROMPT, chat=True)]
    timers = {}
    for w, model in models.items():

        def per_token(model=model):
            out = lj.generate(model, ids, max_new_tokens=args.max_new_tokens, lookahead=None)
            return out.stats["decode_s"] / max(out.steps[0], 1)

        per_token()  # compile
        timers[w] = per_token
    times = {w: [] for w in WEIGHTS}
    for _ in range(args.repeats):  # interleaved: noise hits every system alike
        for w, f in timers.items():
            times[w].append(f())
    timing = {
        w: {"min_ms": 1e3 * min(t), "median_ms": 1e3 * float(np.median(t))}
        for w, t in times.items()
    }
    print(timing, flush=True)

    tok = models["float"].tokenizer
    nlls, n_tokens = {w: [] for w in WEIGHTS}, 0
    for text in held_out_texts().values():
        ids_text = tok.encode(text)[: args.tokens]
        n_tokens += len(ids_text) - 1
        for w, m in models.items():
            nlls[w].append(nll(m, ids_text))
    nll_mean = {w: float(np.concatenate(v).mean()) for w, v in nlls.items()}
    print(nll_mean, flush=True)

    greedy = {}
    for set_name in ("mt_bench", "code"):
        outs = greedy_on_set(models, tok, set_name, args.greedy_prompts, args.greedy_tokens)
        greedy[set_name] = {w: agreement(outs["float"], outs[w]) for w in ("q8_0", "int8")}
        print(set_name, greedy[set_name], flush=True)

    result = {
        "command": " ".join(["python", *sys.argv]),
        "cpu": cpu_model(),
        "gguf_requantized_from": sources,
        "q8_0_exact_matrices": exact,
        "per_token_plain": timing,
        "repeats": args.repeats,
        "max_new_tokens": args.max_new_tokens,
        "nll_tokens": n_tokens,
        "nll_mean": nll_mean,
        "greedy_agreement_with_float32": greedy,
        "greedy_tokens": args.greedy_tokens,
        "param_bytes": {w: param_bytes(m) for w, m in models.items()},
    }
    write_results(args.out, result, markdown(result))


def markdown(r: dict) -> str:
    names = {"float": "float32 (the GGUF's values)", "q8_0": "q8_0", "int8": "int8 (per channel)"}
    n_exact = sum(r["q8_0_exact_matrices"].values())
    lines = [
        f"# A Q8_0 GGUF kept as int8 ({r['cpu']})",
        "",
        f"`{r['command']}`: SmolLM2-135M requantized to Q8_0 "
        f"({', '.join(f'{n} {k}' for k, n in r['gguf_requantized_from'].items())} matrices), "
        f"converted, loaded three ways. `--weights q8_0` holds the file's own int8 values and "
        f"scales exactly for {n_exact}/{len(r['q8_0_exact_matrices'])} matrix kinds "
        "(every layer).",
        "",
        f"| weights | ms/token plain, min | median | NLL ({r['nll_tokens']} held-out tokens) "
        "| vs float32 | params |",
        "|---|---|---|---|---|---|",
    ]
    base = r["nll_mean"]["float"]
    for w, name in names.items():
        t, v = r["per_token_plain"][w], r["nll_mean"][w]
        lines.append(
            f"| {name} | {t['min_ms']:.1f} | {t['median_ms']:.1f} | {v:.4f} | "
            f"{v / base - 1:+.3%} | {r['param_bytes'][w] / 1e6:.1f} MB |"
        )
    lines += ["", f"Greedy outputs ({r['greedy_tokens']} tokens) against float32:", ""]
    lines += ["| prompts | weights | identical | mean common prefix |", "|---|---|---|---|"]
    for set_name, by_weights in r["greedy_agreement_with_float32"].items():
        for w, g in by_weights.items():
            lines.append(
                f"| {set_name} ({g['prompts']}) | {w} | {g['identical']} | "
                f"{g['mean_common_prefix']:.1f} |"
            )
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    main()
