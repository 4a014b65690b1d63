"""Where a benchmark's result goes: OUT.json (the numbers) and OUT.md (the table), OUT
being a path without suffix that may contain dots (e.g. sampling_t0.7)."""

from __future__ import annotations

import json
from pathlib import Path


def write_results(out: str | Path, result: dict, md: str | None = None) -> Path:
    """Write `result` to OUT.json and `md` (if given) to OUT.md, print `md`; return
    OUT.json's path."""
    out = Path(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    path = out.with_name(out.name + ".json")
    path.write_text(json.dumps(result, indent=2) + "\n")
    if md is not None:
        out.with_name(out.name + ".md").write_text(md)
        print(md)
    return path
