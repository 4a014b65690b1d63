"""Prompt sets for the benchmarks: MT-bench first turns (by category) and a code set."""

from __future__ import annotations

import json
from pathlib import Path

# a copy of ../shared/prompts/mt_bench.jsonl (80 MT-bench first turns, Apache-2.0, from
# FastChat's llm_judge), committed so that every figure can be re-run from a clone
MT_BENCH = Path(__file__).resolve().parents[2] / "benchmarks" / "prompts" / "mt_bench.jsonl"


def mt_bench(path: Path | None = None) -> list[dict]:
    """[{'id', 'category', 'prompt'}] for the 80 first turns."""
    path = Path(path or MT_BENCH)
    if not path.is_file():
        raise SystemExit(f"MT-bench prompts not found at {path} (pass --mt-bench PATH)")
    rows = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    return [
        {"id": r["question_id"], "category": r["category"], "prompt": r["turns"][0]} for r in rows
    ]


CODE = Path(__file__).resolve().parents[2] / "benchmarks" / "prompts" / "code.jsonl"


def code(path: Path | None = None) -> list[dict]:
    """[{'id', 'category', 'prompt'}]: 20 coding prompts (write / edit / explain / fix); the
    edit and fix ones quote code that the answer repeats, as real coding requests do."""
    rows = [json.loads(line) for line in Path(path or CODE).read_text().splitlines() if line]
    return [{"id": r["id"], "category": r["category"], "prompt": r["prompt"]} for r in rows]


def prompt_set(name: str) -> list[dict]:
    return {"mt_bench": mt_bench, "code": code}[name]()


def category_ranks(rows: list[dict]) -> list[tuple[int, dict]]:
    """[(k, row)]: row is the k-th (from 1) of its category, in the order given; for
    options like --per-category K (keep rows with k <= K)."""
    seen: dict[str, int] = {}
    out = []
    for r in rows:
        seen[r["category"]] = seen.get(r["category"], 0) + 1
        out.append((seen[r["category"]], r))
    return out


def select(names: list[str], per_category: int = 0, limit: int | None = None) -> list[dict]:
    """The rows of each named set in order, each tagged with its set ('set'): the first
    `limit` of each set, then the first `per_category` of each category (0 = all). The
    scripts that seed a batch by its first row's index (step_compression.py,
    sampling_agreement.py) get the same rows in the same order from the same options."""
    return [
        dict(r, set=name)
        for name in names
        for rank, r in category_ranks(prompt_set(name)[:limit])
        if not per_category or rank <= per_category
    ]
