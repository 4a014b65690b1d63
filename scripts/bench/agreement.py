"""How often two models' greedy outputs agree (the benchmarks' check beside NLL): whole
outputs identical, and the mean length of the common prefix."""

from __future__ import annotations

import numpy as np
from prompts import prompt_set

import lookahead_jax as lj
from lookahead_jax.engine.testing import first_divergence


def agreement(reference: list[list[int]], other: list[list[int]]) -> dict:
    """{"prompts", "identical", "mean_common_prefix"} of two lists of output token ids."""
    pairs = list(zip(reference, other, strict=True))
    prefix = [len(a) if (i := first_divergence(a, b)) is None else i for a, b in pairs]
    return {
        "prompts": len(pairs),
        "identical": sum(a == b for a, b in pairs),
        "mean_common_prefix": float(np.mean(prefix)),
    }


def greedy_on_set(models: dict, tok, set_name: str, n: int, max_new_tokens: int) -> dict:
    """{name: token ids}: each model's greedy outputs on the first `n` prompts of a
    benchmark set, chat template applied."""
    prompts = [tok.encode_prompt(r["prompt"], chat=True) for r in prompt_set(set_name)[:n]]
    return {
        w: lj.generate(m, prompts, max_new_tokens=max_new_tokens, lookahead=None).token_ids
        for w, m in models.items()
    }
