"""`Stats`: what a decode counted and timed — one type for `lj.generate`'s output and
`lj.Engine.stats`, since both run through the engine's host loop (continuous.py).

A TypedDict rather than a dataclass: the CLI writes it out as JSON as it is, and every
caller reads it by key. The counts are summed as each request's result is read (the
engine's `_deliver` and `count_sources`), so an online engine's stats are exact at any
point between rounds.
"""

from __future__ import annotations

from typing import TypedDict


class SourceStats(TypedDict, total=False):
    """One guess source's share of a decode (Stats.sources)."""

    proposed: int  # well-formed draft nodes it proposed
    paths: int  # steps whose accepted path was credited to it (its node, best proposed)
    tokens: int  # guessed tokens credited to it
    weight_by_depth: list[float]  # with `adapt`: the finished rows' last record weights,
    # averaged


class Stats(TypedDict, total=False):
    """A decode's stats: a dict with these keys."""

    prompts: int  # requests finished (an interrupted one counts too)
    new_tokens: int  # all requests
    row_steps: int  # forward passes after the prefill, summed over rows
    compression: float  # new_tokens / row_steps (the prefill's token counts too)
    accepted_hist: dict[str, int]  # steps that emitted "1", "2", ... tokens (after auto's
    # hand-over to plain decoding, its steps count under "1")
    sources: dict[str, SourceStats]  # lookahead only: by source name, then "window"
    batch: int  # rows decoded together (lj.generate: the prompts)
    interrupted: bool  # Ctrl-C ended it (lj.generate's GenerationInterrupted.partial)
    config: dict  # lookahead (LookaheadConfig.describe() or None), dtype, sampled, the
    # default sampling settings; with auto, lookahead_auto: what it chose and why, and
    # switched_to_plain_after_steps
    rounds: int  # device calls of the decode loop
    prefill_calls: int
    prompt_buckets: list[int]  # prompt sides P the state was shaped for, in order
    cache_positions: list[int]  # cache sizes S the loop was compiled for, in order
    compile_s: float  # waiting for the prefill and loop programs to compile in this run
    # (the loop compiles in the background beside the prefill's; 0 when every one was
    # compiled already; the small insert / retire programs are left out)
    prefill_s: float  # prefills and inserts, their compile_s left out
    decode_s: float  # decode loop calls, their compile_s left out
    wall_s: float  # the whole run: compiling, reading results back and auto's choice too
    tokens_per_s: float  # new_tokens / (prefill_s + decode_s)
    step_ms: float  # lj.generate: decode_s / the longest row's steps
    load_s: float  # the CLI: lj.load's time (converting the bundled model included)


def fresh(batch: int) -> Stats:
    """The stats of a run that has not started."""
    return {
        "prompts": 0,
        "new_tokens": 0,
        "row_steps": 0,
        "rounds": 0,
        "prefill_calls": 0,
        "prompt_buckets": [],
        "cache_positions": [],
        "compile_s": 0.0,
        "prefill_s": 0.0,
        "decode_s": 0.0,
        "batch": batch,
        "interrupted": False,
    }


def count_sources(
    stats: Stats, names: tuple[str, ...], nodes_n, paths_n, tokens_n, weights_na=None
):
    """Add finished rows' per-source counts [n_sources], summed: nodes proposed
    ("proposed"), accepted paths and guessed tokens credited ("paths", "tokens");
    weights_na [n_sources, A]: the finished rows' record weights by depth, averaged so far."""
    sources = stats.setdefault("sources", {})
    for i, name in enumerate(names):
        entry = sources.setdefault(name, {"proposed": 0, "paths": 0, "tokens": 0})
        entry["proposed"] += int(nodes_n[i])
        entry["paths"] += int(paths_n[i])
        entry["tokens"] += int(tokens_n[i])
        if weights_na is not None:
            entry["weight_by_depth"] = [round(float(w), 4) for w in weights_na[i]]


def totals(stats: Stats, wall_s: float, hist_e=None) -> None:
    """Totals of an offline run (or of lj.generate's); `hist_e` [E]: the finished rows'
    steps by tokens emitted."""
    if hist_e is not None:
        stats["accepted_hist"] = {str(i + 1): int(c) for i, c in enumerate(hist_e)}
    stats["wall_s"] = wall_s
    derive_rates(stats)


def derive_rates(stats: Stats) -> None:
    """tokens_per_s (new tokens over prefill + decode time, compilation left out) and
    compression (new tokens per row step), from the counts as they are now: whoever
    changes the counts (lj.generate keeps a process's own rows') derives them again."""
    busy = stats["prefill_s"] + stats["decode_s"]
    stats["tokens_per_s"] = stats["new_tokens"] / busy if busy > 0 else 0.0
    stats["compression"] = stats["new_tokens"] / max(stats["row_steps"], 1)
