"""An exactness harness for any model behind the seam (a checkpoint from lj.load, or a
researcher's own model through lj.from_nnx).

Lookahead decoding is exact when the tokens it accepts are the ones plain decoding would
produce. That holds for a model whose predictions for a token do not depend on how many
other tokens share its forward pass: a lookahead step feeds T tokens at once where plain
decoding feeds one, so the model's T-token pass must agree with its 1-token passes.
Dense attention and matmuls do — bit for bit in float64; in float32 and bfloat16 they
agree only to rounding (the matmul kernels tile T differently), so a near-tie between
the two best tokens can flip. Hence two checks:

* `pass_agreement(model, ids)`: the largest logit difference between one T-token pass
  over `ids` and token-by-token passes with the cache — 0 or tiny for a consistent
  model, large for one that mixes the tokens of a pass;
* `assert_lookahead_matches_plain(model, prompts, configs)`: lookahead == plain, token
  for token, for each config and batch size (greedy and seeded sampling alike); with
  `near_tie` (float32), a divergence is allowed only where plain decoding's top-2 logits
  were within `near_tie` of each other. A config that accepted no guess fails it too:
  such a run equals plain decoding whatever the model does. With `logprobs`, each
  token's logprob and its alternatives' must equal plain decoding's within
  `logprob_tol` too.

    with jax.enable_x64(True):   # float64 params: no rounding, no excuse
        lj.testing.assert_lookahead_matches_plain(model64, prompts)
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

from lookahead_jax.decoding.programs import precision_scope
from lookahead_jax.engine.generate import generate
from lookahead_jax.engine.inputs import encode_prompts
from lookahead_jax.guesses.lookahead_config import LookaheadConfig
from lookahead_jax.models import kv_cache, seam

DEFAULT_CONFIGS = (
    LookaheadConfig.for_tokens(8),
    LookaheadConfig.for_tokens(16),
    LookaheadConfig(4, 3, 3),
)


def full_pass_logits(model, ids: list[int]) -> np.ndarray:
    """Logits [T, V] of one causal pass over `ids` (float64 numpy)."""
    T = len(ids)
    x = jnp.asarray([ids], jnp.int32)
    with precision_scope(model.dtype):  # as the decode programs run
        logits, _, _ = jax.jit(model.lm.apply)(
            model.params, x, jnp.arange(T, dtype=jnp.int32)[None], seam.causal_mask(T), None, None
        )
    return np.asarray(logits[0], np.float64)


def pass_agreement(model, ids: list[int]) -> float:
    """Max |logit| difference between one pass over `ids` and 1-token passes over the
    same context (each token with the cache of the ones before it)."""
    full = full_pass_logits(model, ids)
    lm, params = model.lm, model.params
    cache = lm.init_cache(1, len(ids), model.dtype)
    one = jax.jit(lm.apply)
    worst = 0.0
    for t, token in enumerate(ids):
        with precision_scope(model.dtype):
            logits, k, v = one(
                params,
                jnp.asarray([[token]], jnp.int32),
                jnp.asarray([[t]], jnp.int32),
                jnp.ones((1, 1, 1), bool),
                cache,
                None,
            )
        cache = kv_cache.commit(cache, k, v, jnp.zeros((1, 1), jnp.int32), jnp.ones(1, jnp.int32))
        worst = max(worst, float(np.abs(np.asarray(logits[0, 0], np.float64) - full[t]).max()))
    return worst


def top2_gap(logits_v: np.ndarray) -> float:
    """How far the best logit is ahead of the second best."""
    top = np.sort(logits_v)[-2:]
    return float(top[1] - top[0])


def first_divergence(a: list[int], b: list[int]) -> int | None:
    """The first index where two token lists differ (None: equal)."""
    for i, (x, y) in enumerate(zip(a, b, strict=False)):
        if x != y:
            return i
    return None if len(a) == len(b) else min(len(a), len(b))


def assert_lookahead_matches_plain(
    model,
    prompts: list,  # token-id lists, or strings (through the chat template if `chat`)
    configs=DEFAULT_CONFIGS,
    max_new_tokens: int = 24,
    batch_sizes: tuple[int, ...] | None = None,
    near_tie: float | None = None,
    allow_no_acceptance: bool = False,
    chat: bool = False,
    logprobs: int | None = None,
    logprob_tol: float = 1e-5,
    **sampling,
) -> dict:
    """Lookahead == plain decoding, token for token, for every config and batch size
    (default: the whole list at once, and one prompt at a time).

    near_tie: allow a divergence where plain decoding's top-2 logits were within this
        (for float32/bfloat16 models, greedy only; leave None for float64).
    allow_no_acceptance: pass a config that accepted no guessed token (by default that
        fails: lookahead that never accepts emits plain decoding's tokens by construction,
        so the comparison proved nothing; pick prompts, budgets or a model that repeat).
    chat: text prompts through the model's chat template (as lj.generate's chat).
    logprobs: also compare each token's logprob and its `logprobs` alternatives (ids and
        logprobs) with plain decoding's, within `logprob_tol`, up to a divergence.
    sampling: temperature / top_k / top_p / seed, passed to both decodes.

    Returns {config name: guessed tokens accepted}. Raises AssertionError naming the
    config, batch size, prompt and position of a real divergence, or the configs that
    accepted nothing.
    """
    if near_tie is not None and sampling.get("temperature", 0.0) > 0:
        # a sampled token is the argmax of processed logits plus noise: the raw top-2
        # gap says nothing about how close that choice was
        raise ValueError("near_tie applies to greedy decoding only")
    ids = encode_prompts(model, prompts, chat)
    sizes = batch_sizes or tuple(sorted({len(ids), 1}, reverse=True))
    kw = dict(max_new_tokens=max_new_tokens, logprobs=logprobs, **sampling)
    plain_out = generate(model, ids, lookahead=None, **kw)
    plain = plain_out.token_ids
    accepted = {}
    for config in configs:
        accepted[config.name] = 0
        for size in sizes:
            for start in range(0, len(ids), size):
                chunk = ids[start : start + size]
                out = generate(model, chunk, lookahead=config, **kw)
                hist = out.stats.accepted_hist
                accepted[config.name] += sum((int(k) - 1) * c for k, c in hist.items())
                for row, got in enumerate(out.token_ids):
                    want = plain[start + row]
                    i = first_divergence(got, want)
                    if logprobs is not None:
                        _assert_logprobs_match(
                            out.logprobs[row][:i],
                            plain_out.logprobs[start + row][:i],
                            logprob_tol,
                            f"{config.name}, batch {size}, prompt {start + row}",
                        )
                    if i is None:
                        continue
                    where = f"{config.name}, batch {size}, prompt {start + row}, new token {i}"
                    if near_tie is None or i >= min(len(got), len(want)):
                        raise AssertionError(f"lookahead != plain ({where}): {got} vs {want}")
                    gap = top2_gap(full_pass_logits(model, chunk[row] + want[:i])[-1])
                    if gap >= near_tie:
                        raise AssertionError(
                            f"lookahead != plain ({where}) where the top-2 logit gap is "
                            f"{gap:.3g}, not a near-tie: {got} vs {want}"
                        )
    idle = [name for name, n in accepted.items() if n == 0]
    if idle and not allow_no_acceptance:
        raise AssertionError(
            f"lookahead accepted no guessed token with {', '.join(idle)}: equal to plain "
            "decoding by construction, so this proves nothing (use prompts or a budget where "
            "guesses land, or allow_no_acceptance=True)"
        )
    return accepted


def _assert_logprobs_match(got, want, tol: float, where: str) -> None:
    """Two decodes' TokenLogprobs of the same tokens agree within `tol`: each token's
    logprob, the alternatives' logprobs in order, and their ids wherever an alternative's
    logprob is more than 2 tol from its neighbours' (within that, two near-equal
    alternatives may come in either order; the last may tie with one not listed)."""
    for i, (g, w) in enumerate(zip(got, want, strict=True)):
        at = f"lookahead's logprobs != plain's ({where}, new token {i})"
        if abs(g.logprob - w.logprob) > tol:
            raise AssertionError(f"{at}: {g.logprob} vs {w.logprob}")
        g_lp, w_lp = np.array([lp for _, lp in g.top]), np.array([lp for _, lp in w.top])
        if g_lp.shape != w_lp.shape or np.abs(g_lp - w_lp).max(initial=0) > tol:
            raise AssertionError(f"{at}: alternatives {g.top} vs {w.top}")
        gaps = np.abs(np.diff(w_lp))
        apart = np.ones(len(w_lp), bool)
        apart[:-1] &= gaps > 2 * tol
        apart[1:] &= gaps > 2 * tol
        apart[-1:] = False  # the last may tie with the first one not listed
        g_ids, w_ids = np.array([t for t, _ in g.top]), np.array([t for t, _ in w.top])
        if (g_ids[apart] != w_ids[apart]).any():
            raise AssertionError(f"{at}: alternatives {g.top} vs {w.top}")
