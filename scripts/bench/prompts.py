"""Prompt sets for the benchmarks: MT-bench first turns (by category) and a code set."""

from __future__ import annotations

from pathlib import Path

from lookahead_jax import prompts_jsonl
from lookahead_jax.errors import UserInputError

# a copy of ../shared/prompts/mt_bench.jsonl (80 MT-bench first turns, Apache-2.0, from
# FastChat's llm_judge), committed so that every figure can be re-run from a clone
MT_BENCH = Path(__file__).resolve().parents[2] / "benchmarks" / "prompts" / "mt_bench.jsonl"


def mt_bench(path: Path | None = None) -> list[dict]:
    """[{'id', 'category', 'prompt'}] for the 80 first turns."""
    path = Path(path or MT_BENCH)
    if not path.is_file():
        raise SystemExit(f"MT-bench prompts not found at {path} (pass --mt-bench PATH)")
    return read(path)


CODE = Path(__file__).resolve().parents[2] / "benchmarks" / "prompts" / "code.jsonl"


def code(path: Path | None = None) -> list[dict]:
    """[{'id', 'category', 'prompt'}]: 20 coding prompts (write / edit / explain / fix); the
    edit and fix ones quote code that the answer repeats, as real coding requests do."""
    return read(Path(path or CODE))


def read(path: Path) -> list[dict]:
    """[{'id', 'category', 'prompt'}] of a prompt file, read as generate --prompts and
    training read theirs (lookahead_jax/prompts_jsonl.py: `turns` gives the first turn,
    `question_id` the id); a bad line exits with `FILE line N: ...`."""
    try:
        records = prompts_jsonl.parse(path.read_text(encoding="utf-8"), str(path))
    except UserInputError as e:
        raise SystemExit(f"error: {e}") from None
    return [{"id": r.id, "category": r.category, "prompt": r.prompt} for r in records]


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
