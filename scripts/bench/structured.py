"""Structured output over benchmarks/prompts/schemas.jsonl (22 JSON schemas, a chat prompt
each) on the bundled SmolLM2-135M float32: every answer that ends validates (jsonschema),
lookahead emits plain's tokens under each schema, and what each costs.

* library: one `lj.generate` a schema (batch 1), plain and auto, temperature 0 and 1.0
  (seed: the schema's line), the second of two passes (the first compiles); and the step
  of 4 free rows against 3 free rows beside one under a schema (lj.Engine, plain, 3 runs
  interleaved, min): what the mask costs rows that have no grammar.
* --server: `serve --batch 4`, plain (--no-lookahead) and auto, both up, the 22 requests
  4 at a time, temperature 0 and 1.0 (seeded), passes interleaved (the median of --passes after
  a pass of each temperature that compiles).

    python scripts/bench/structured.py --out benchmarks/cpu/structured_schemas [--server]
"""

import argparse
import concurrent.futures as cf
import json
import time
from pathlib import Path

import jsonschema
from machine import run_header
from results import write_results
from server_load import running

import lookahead_jax as lj

SCHEMAS = Path(__file__).resolve().parents[2] / "benchmarks" / "prompts" / "schemas.jsonl"
N = 96  # new tokens at most
SERVERS = ("plain", "auto")  # start_server's modes


def valid(text, schema) -> bool:
    try:
        jsonschema.validate(json.loads(text), schema)
        return True
    except (ValueError, jsonschema.ValidationError):
        return False


def library(model, rows) -> dict:
    out = {}
    for t in (0.0, 1.0):
        for mode, la in (("plain", None), ("auto", "auto")):
            for _ in range(2):  # (the second pass's figures)
                runs = [
                    lj.generate(
                        model, [r["prompt"]], N, la, t, seed=i, chat=True, json_schema=r["schema"]
                    )
                    for i, r in enumerate(rows)
                ]
            counts = {
                "steps": sum(x.steps[0] for x in runs),
                "tokens": sum(len(x.token_ids[0]) for x in runs),
                "decode_s": sum(x.stats.decode_s for x in runs),
                "prefill_s": sum(x.stats.prefill_s for x in runs),
            }
            texts = [x.texts[0] for x in runs]
            ends = ["length" if len(x.token_ids[0]) >= N else "stop" for x in runs]
            out[f"{mode} t={t}"] = summary(texts, ends, rows, counts)
    free = [lj.Request(r["prompt"], max_new_tokens=64) for r in rows[:4]]
    under = lj.Request(rows[3]["prompt"], max_new_tokens=64, json_schema=rows[3]["schema"])
    step_ms = {"free": [], "beside": []}
    for _ in range(3):
        for name, batch in (("free", free), ("beside", [*free[:3], under])):
            engine = lj.Engine(model, batch=4, lookahead=None, max_new_tokens=64, chat=True)
            results, _ = engine.run_batch(batch)
            step_ms[name].append(1000 * engine.stats.decode_s / max(r.steps for r in results))
    out["step_ms_4_rows"] = {k: min(v) for k, v in step_ms.items()} | {"runs": step_ms}
    return out


def summary(texts, finishes, rows, counts) -> dict:
    ended = [i for i, f in enumerate(finishes) if f != "length"]
    good = sum(valid(texts[i], rows[i]["schema"]) for i in ended)
    return {**counts, "ended": len(ended), "valid": good, "texts": texts}


def ask(url: str, job) -> tuple:
    import openai

    (i, r), t = job
    client = openai.OpenAI(base_url=url + "/v1", api_key="x", max_retries=0)
    fmt = {"type": "json_schema", "json_schema": {"name": r["name"], "schema": r["schema"]}}
    got = client.chat.completions.create(
        model="smollm2-135m", messages=[{"role": "user", "content": r["prompt"]}], max_tokens=N,
        temperature=t, seed=i, response_format=fmt,
    )  # fmt: skip
    return got.choices[0].message.content, got.choices[0].finish_reason, got.usage.completion_tokens


def one_pass(url: str, rows, t: float) -> tuple[list, float]:
    jobs = [(x, t) for x in enumerate(rows)]
    start = time.perf_counter()
    with cf.ThreadPoolExecutor(4) as pool:
        got = list(pool.map(ask, [url] * len(jobs), jobs))
    return got, time.perf_counter() - start


def server(rows, passes: int = 3) -> dict:
    """Both servers up at once, their passes interleaved (the first started may read less),
    after a pass of each temperature that compiles: the figures are the passes' median."""
    import httpx

    starts = [((None, 4, mode, 256), dict(name="smollm2-135m")) for mode in SERVERS]
    with running(starts) as up:  # (256: the server's default --max-new-tokens)
        servers = dict(zip(SERVERS, up, strict=True))
        for t in (0.0, 1.0):  # warm: programs and grammars compiled (some in the background)
            for _, url in servers.values():
                one_pass(url, rows, t)
        out = {}
        for t in (0.0, 1.0):
            walls: dict = {mode: [] for mode in servers}
            last = {}
            for _ in range(passes):
                for mode, (_, url) in servers.items():
                    last[mode], wall = one_pass(url, rows, t)
                    walls[mode].append(wall)
            for mode in servers:
                texts, finishes, tokens = zip(*last[mode], strict=True)
                counts = {"tokens": sum(tokens), "wall_s": sorted(walls[mode])[passes // 2]}
                counts["walls"] = walls[mode]
                out[f"{mode} t={t}"] = summary(texts, finishes, rows, counts)
        metrics = httpx.get(servers["auto"][1] + "/metrics").text.splitlines()
        out["auto_metrics"] = [m for m in metrics if m.startswith("lookahead_auto")]
        return out


def table(result: dict) -> str:
    lines = [
        "| where | mode | tokens | ended | valid | tokens/s | over plain | same as plain |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for where in ("library", "server"):
        runs = {k: r for k, r in result.get(where, {}).items() if " t=" in k}
        rate = {
            k: r["tokens"] / (r.get("wall_s") or r["decode_s"] + r["prefill_s"])
            for k, r in runs.items()
        }
        for key, r in runs.items():
            plain = key.replace("auto", "plain")
            same = sum(a == b for a, b in zip(r["texts"], runs[plain]["texts"], strict=True))
            lines.append(
                f"| {where} | {key} | {r['tokens']} | {r['ended']} | {r['valid']} | "
                f"{rate[key]:.1f} | {rate[key] / rate[plain]:.2f}x | {same}/{len(r['texts'])} |"
            )
    if "library" in result:
        s = result["library"]["step_ms_4_rows"]
        lines.append(
            f"\nA plain step of 4 rows: {s['free']:.1f} ms free, {s['beside']:.1f} ms with one "
            f"under a schema ({s['beside'] / s['free']:.3f}x)."
        )
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    p = argparse.ArgumentParser()
    p.add_argument("--out", default="benchmarks/cpu/structured_schemas")
    p.add_argument("--server", action="store_true", help="also through the server")
    p.add_argument("--server-only", action="store_true", help="the server's figures only")
    p.add_argument("--passes", type=int, default=3, help="the server's measured passes")
    args = p.parse_args()
    rows = [json.loads(line) for line in SCHEMAS.read_text().splitlines() if line.strip()]
    if args.server_only:  # (the library's figures kept from OUT.json)
        result = json.loads(Path(args.out + ".json").read_text()) | run_header()
    else:
        result = {**run_header(), "library": library(lj.load("smollm2-135m"), rows)}
        write_results(args.out, result, table(result))
    if args.server or args.server_only:
        result["server"] = server(rows, args.passes)
        write_results(args.out, result, table(result))
