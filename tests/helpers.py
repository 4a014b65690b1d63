"""Shared test helpers: teacher-forced references, the near-tie check, memory mappings."""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np

from lookahead_jax.engine.testing import first_divergence, top2_gap
from lookahead_jax.models import cpu_kernel
from lookahead_jax.models.llama import forward
from lookahead_jax.models.seam import causal_mask

NEAR_TIE = 1e-4


def teacher_forced_logits(model, ids: list[int]) -> np.ndarray:
    """Logits [T, V] of one full causal forward over `ids` (float64 numpy)."""
    T = len(ids)
    x = jnp.asarray([ids], jnp.int32)
    logits, _, _ = jax.jit(forward, static_argnums=1)(
        model.params, model.cfg, x, jnp.arange(T, dtype=jnp.int32)[None], causal_mask(T)
    )
    return np.asarray(logits[0], np.float64)


def assert_same_or_near_tie(
    model, prompt: list[int], got: list[int], want: list[int], tie: float = NEAR_TIE
) -> bool:
    """got == want, or they first differ where the model's top-2 logits are within `tie`.

    Returns True when the sequences were identical.
    """
    i = first_divergence(got, want)
    if i is None:
        return True
    if i >= min(len(got), len(want)):
        raise AssertionError(f"one output stops early at {i}: {got} vs {want}")
    logits = teacher_forced_logits(model, prompt + want[:i])[-1]
    gap = top2_gap(logits)
    assert gap < tie, (
        f"outputs diverge at new token {i} ({got[i]} vs {want[i]}) where the top-2 logit gap "
        f"is {gap:.3g} (not a near-tie): a real bug\n got={got}\nwant={want}"
    )
    return False


def engine_packs_ragged() -> bool:
    """Whether the engine packs an admission's prompts in ragged passes here: on one CPU
    only (engine/device_slots.py; on a GPU or TPU the attention's loop would read its
    predicate back every iteration). The pass itself runs anywhere."""
    return jax.default_backend() == "cpu"


def cpu_kernel_runs() -> bool:
    """Whether the CPU kernel runs on this process's default device: built here and a CPU
    backend (on a GPU machine it builds for the host, but arrays live on the GPU, where its
    FFI targets are not registered; the product packs only on a CPU, models/packed.py)."""
    return jax.default_backend() == "cpu" and cpu_kernel.available()


def with_eos(model, eos_ids: tuple[int, ...]):
    """The same model with different EOS ids."""
    return dataclasses.replace(model, eos_ids=tuple(eos_ids), tokenizer=None)


def accepted_guesses(stats) -> int:
    """Tokens that steps emitted beyond one a step (`accepted_hist` of lj.generate's or
    lj.Engine's stats): guesses accepted."""
    return sum((int(k) - 1) * c for k, c in stats.accepted_hist.items())


def random_prompts(n: int, vocab: int, low: int, high: int, seed: int) -> list[list[int]]:
    rng = np.random.default_rng(seed)
    # avoid ids 0..2 (pad/bos/eos of the tiny models) inside prompts
    return [rng.integers(3, vocab, rng.integers(low, high + 1)).tolist() for _ in range(n)]


def memory_maps() -> int:
    """How many memory mappings this process has (0 where /proc is missing: not Linux)."""
    try:
        with open("/proc/self/maps", "rb") as f:
            return sum(1 for _ in f)
    except OSError:
        return 0
