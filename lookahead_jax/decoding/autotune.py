"""`--lookahead auto`: choose the tokens per step for this machine and model, or plain
decoding.

A lookahead layout (LookaheadConfig.for_tokens) pays when the tokens it emits per step
(its compression c) outgrow how much slower its step is than a plain one (the cost ratio
r). Both are estimated, never assumed:

* r — a short cost curve measured on this device for this model: the latency of
  one forward step of T tokens (with logits for all of them) at each candidate's T
  (cost_curve.py: measured once, cached); on accelerators of a whole decode step of the
  layout run at T tokens (step_curve.py).
* c — a prior per config (measured on MT-bench and a code set with SmolLM2-135M,
  see benchmarks/), times this model's running acceptance factor: after each
  lookahead generation, observed / prior compression, averaged (EMA) and cached
  per model and per decoding mode (greedy, or sampling at a temperature rounded to
  0.1: sampling accepts far less, and must not drag the greedy factor down). A model
  that repeats itself more than SmolLM2 gets bigger configs.

The choice is argmax c / r over the candidates; if no candidate is expected to
beat plain decoding by MARGIN, plain decoding is chosen. The last choice (per model,
decoding mode and batch) stays while the best is expected to beat it by less than STICKY:
the same layout, and the same compiled programs, run to run on one machine. A run that
chooses plain decoding for a low factor moves it back toward the prior (`_recover`):
plain runs measure nothing, so a factor once low would otherwise hold for good. While
generating, the `Guard` watches the real acceptance and switches to plain decoding for
the rest of the generation if it is too low for the config's cost ratio.
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import jax.numpy as jnp
import numpy as np

from lookahead_jax.cache_dir import write_atomic
from lookahead_jax.decoding.cost_curve import (
    cached_curve,
    cost_ratio,
    device_key,
    model_fingerprint,
    tune_dir,
)
from lookahead_jax.guesses.lookahead_config import LookaheadConfig

# tokens per step (a LookaheadConfig.for_tokens layout): prior compression (new tokens per
# step) on MT-bench first turns (2 per category), greedy, 256 new tokens, SmolLM2-135M
# (benchmarks/cpu/budgets.md; 64 and 128: one per category, budgets_large.md). Measured
# before the acceptance record (adapt), which adds about 1 % at 16 (benchmarks/cpu/
# adapt.md); the running acceptance factor absorbs such differences.
PRIORS: dict[int, float] = {
    2: 1.36,
    4: 1.70,
    8: 2.02,
    12: 2.25,
    16: 2.39,
    32: 2.80,
    64: 3.34,
    128: 3.61,
}
MARGIN = 1.03  # expected speedup needed to prefer lookahead over plain decoding
# the last choice (per model, decoding mode and batch: kept beside the acceptance factors)
# stays while the best's expected speedup is within this factor of its own: run to run on
# one machine auto keeps its layout (and its compiled programs) unless another is clearly
# better, rather than flipping between two near-equal ones as the factor moves
STICKY = 1.05
# probe exactly the candidates' step sizes: XLA's speed is not smooth in T on every device
PROBE_TOKENS = tuple(sorted({1} | {LookaheadConfig.for_tokens(t).tokens_per_step for t in PRIORS}))
FACTOR_EMA = 0.3
RECOVER = 0.15  # a plain choice's step back toward the prior's acceptance (_recover)


@dataclasses.dataclass
class Choice:
    config: LookaheadConfig | None  # None: plain decoding
    expected_speedup: float
    cost_ratio: float
    expected_compression: float
    table: dict  # config -> expected speedup, for the report
    # the model's running observed / prior compression the priors were scaled by: what
    # earlier runs on this machine saw (1.0 until one was recorded), so a run's choice can
    # depend on earlier runs; reported with every choice
    acceptance_factor: float = 1.0
    # with plain decoding chosen: the lookahead candidate that came closest, so a user
    # sees why none was taken (its step's cost ratio beside the compression it expects)
    runner_up: Choice | None = None
    kept: bool = False  # the last choice, kept: the best was expected to beat it by < STICKY

    def summary(self) -> dict:
        """The candidate's name, step cost ratio, expected compression and speedup."""
        return {
            "chosen": None if self.config is None else self.config.name,
            "cost_ratio": round(self.cost_ratio, 3),
            "expected_compression": round(self.expected_compression, 3),
            "expected_speedup": round(self.expected_speedup, 3),
        }

    def describe(self) -> dict:
        return {
            "auto": True,
            **self.summary(),
            "runner_up": None if self.runner_up is None else self.runner_up.summary(),
            "acceptance_factor": round(self.acceptance_factor, 3),
            "kept": self.kept,
        }


def _factor_file(model) -> Path:
    return tune_dir() / f"acceptance-{model_fingerprint(model)}.json"


def sampling_bucket(sampling) -> str:
    """The key a running acceptance factor is kept under: 'greedy' or e.g. 't0.7'.

    `sampling` is a SamplingConfig (or None: greedy). top-k/top-p are not part of the
    key: the temperature moves acceptance most."""
    if sampling is None or sampling.greedy:
        return "greedy"
    return f"t{round(sampling.temperature, 1):.1f}"


def _record(model) -> dict:
    """The model's acceptance file: {"factors": {mode: factor}, "chosen": {mode-bBATCH:
    tuning key or None}} ({} where there is none or it cannot be read)."""
    try:
        data = json.loads(_factor_file(model).read_text())
        return data if isinstance(data, dict) else {}
    except (OSError, ValueError):
        return {}


def _factors(model) -> dict[str, float]:
    try:
        return {str(k): float(v) for k, v in _record(model)["factors"].items()}
    except (KeyError, TypeError, ValueError, AttributeError):
        return {}


def _last_choices(model) -> dict:
    chosen = _record(model).get("chosen")
    return chosen if isinstance(chosen, dict) else {}


def _write_record(model, **parts: dict) -> None:
    """Write the acceptance file with the parts given (`factors`, `chosen`) replaced."""
    write_atomic(_factor_file(model), json.dumps({**_record(model), **parts}))


def acceptance_factor(model, sampling=None) -> float:
    """This model's running observed / prior compression for a decoding mode (1.0 until
    a generation has been recorded)."""
    return _factors(model).get(sampling_bucket(sampling), 1.0)


def record_acceptance(
    model, config: LookaheadConfig, compression: float, steps: int, sampling=None
) -> None:
    """Fold one generation's observed compression into the running factor of its model
    and decoding mode."""
    prior = PRIORS.get(config.tuning_key)
    if prior is None or steps < 16:
        return
    observed = (compression - 1.0) / (prior - 1.0) if prior > 1 else 1.0
    factors = _factors(model)
    key = sampling_bucket(sampling)
    factors[key] = (1 - FACTOR_EMA) * factors.get(key, 1.0) + FACTOR_EMA * max(observed, 0.05)
    _write_record(model, factors=factors)


def _recover(model, sampling, factor: float) -> None:
    """A run that chose plain decoding because earlier runs accepted little (a layout
    would win at the prior's acceptance) moves the factor RECOVER of the way back to
    1.0: plain runs measure no acceptance, so without this a low factor would hold
    forever, whatever the prompts became (seen: six 64-token prose answers took the CLI's
    factor to where every later run chose plain, code prompts that gain 1.5x included).
    After a few such runs lookahead runs again, and is measured; where it still loses,
    its guard hands the run over to plain decoding."""
    factors = _factors(model)
    factors[sampling_bucket(sampling)] = factor + RECOVER * (1.0 - factor)
    _write_record(model, factors=factors)


def expected_compression(config_key, factor: float) -> float:
    """The prior's gain over one token per step, scaled by the model's factor."""
    return 1.0 + (PRIORS[config_key] - 1.0) * factor


def choose(model, max_step_tokens: int | None = None, sampling=None, batch: int = 1) -> Choice:
    """The config with the best expected speedup for this model, device, decoding
    mode (`sampling`: a SamplingConfig, None = greedy) and batch size, or plain decoding."""
    factor = acceptance_factor(model, sampling)
    # a config costing more than its best-case compression cannot win: stop probing there
    best_case = max(expected_compression(k, max(factor, 1.0)) for k in PRIORS)
    curve = cached_curve(model, PROBE_TOKENS, stop_above=best_case, batch=batch)
    best, table, choices = None, {}, {}
    for key in PRIORS:
        cfg = LookaheadConfig.for_tokens(key)
        if max_step_tokens is not None and cfg.tokens_per_step > max_step_tokens:
            continue
        r = cost_ratio(curve, cfg.tokens_per_step)
        c = expected_compression(key, factor)
        table[key] = c / r
        choices[key] = Choice(cfg, c / r, r, c, table, factor)
        if best is None or c / r > best.expected_speedup:
            best = choices[key]
    # plain scores MARGIN: what a layout must be expected to beat to be chosen
    score = {None: MARGIN, **table}
    chosen = None if best is None or best.expected_speedup < MARGIN else best.config.tuning_key
    # per machine (the device key names the CPU model, dtype and weights), mode and batch
    mode = f"{device_key(model)}-{sampling_bucket(sampling)}-b{batch}"
    last = _last_choices(model)
    kept = last.get(mode, chosen)
    # the last choice stays while it still qualifies (a layout: expected to beat plain by
    # MARGIN) and the best is expected to beat it by less than STICKY
    still = kept in score and (kept is None or score[kept] >= MARGIN)
    sticky = still and kept != chosen and score[kept] * STICKY >= score[chosen]
    if sticky:
        chosen = kept
    if last.get(mode, "unset") != chosen:
        _write_record(model, chosen={**last, mode: chosen})
    if chosen is None:
        at_prior = [expected_compression(k, 1.0) / choices[k].cost_ratio for k in table]
        if factor < 1.0 and max(at_prior, default=0.0) >= MARGIN:
            _recover(model, sampling, factor)  # (plain for what earlier runs accepted)
        return Choice(None, 1.0, 1.0, 1.0, table, factor, runner_up=best, kept=sticky)
    return dataclasses.replace(choices[chosen], kept=sticky)


def why(auto: dict) -> str:
    """A few words on an auto choice (a Choice.describe()) for the stats line: the chosen
    step's cost over a plain step and the gain expected, or why plain decoding won."""
    better = f"{(STICKY - 1) * 100:.0f} %"
    kept = (
        f" (the last choice, kept: no other expected {better} better)" if auto.get("kept") else ""
    )
    if auto.get("chosen") is not None:
        return (
            f"a step costs {auto['cost_ratio']:.2f}x a plain one for "
            f"~{auto['expected_compression']:.2f} tokens: {auto['expected_speedup']:.2f}x "
            f"expected{kept}"
        )
    best = auto.get("runner_up")
    if best is None:
        return "no lookahead step fits"
    if kept:
        return (
            f"plain{kept}: {best['chosen']} would cost {best['cost_ratio']:.2f}x a plain step "
            f"for ~{best['expected_compression']:.2f} tokens: {best['expected_speedup']:.2f}x"
        )
    return (
        f"{best['chosen']} would cost {best['cost_ratio']:.2f}x a plain step for "
        f"~{best['expected_compression']:.2f} tokens: {best['expected_speedup']:.2f}x, "
        f"under {MARGIN}x"
    )


@dataclasses.dataclass
class Guard:
    """Calls off a lookahead generation whose acceptance is too low to pay for its step.

    Acceptance starts low while the pool fills (on MT-bench with (5,1,1): 1.3 tokens per
    step over the first 16 steps, 1.9 after 64), so nothing is judged before
    `warmup_steps`; after that, every `window_steps` steps the compression so far (the
    whole lookahead phase: a single dry window is common even in a winning run) over the
    config's cost ratio must stay above `give_up_below`.

    The cost ratio is the cost curve's (lookahead step / one-token step, both timed
    round-robin in one measurement), not a ratio of wall times taken during decoding:
    there is no plain step to time then, and comparing a decode-loop step (with its
    sampling, cache and bookkeeping work, on a machine whose load changes) to the bare
    one-token forward of the curve made the guard give up on configs that were winning.
    """

    # Loose on purpose: in benchmarks/cpu/bench_auto_final.md a guard at (64 steps, 0.9)
    # still cut 9 of 24 winning (4,1,2) runs (auto 1.14x vs fixed 1.30x on MT-bench);
    # it is there for the run that clearly loses, not to trim marginal ones.
    cost_ratio: float
    warmup_steps: int = 128
    window_steps: int = 32
    give_up_below: float = 0.8

    def keep_going(self, compression: float, steps: int) -> bool:
        if steps < self.warmup_steps:
            return True
        return compression / self.cost_ratio >= self.give_up_below


def hist_compression(hist_be) -> tuple[float, int]:
    """(tokens per step, steps) from an accepted-length histogram [B, E]."""
    counts = np.asarray(hist_be).sum(0)
    steps = int(counts.sum())
    return float((counts * np.arange(1, len(counts) + 1)).sum()) / max(steps, 1), steps


class AutoRun:
    """The whole `lookahead="auto"` policy for one engine run: choose a layout (or plain
    decoding) for its batch, judge the acceptance between rounds (`gives_up`: then the
    engine hands the state to plain decoding, `to_plain`), and keep what was seen for
    `record_acceptance`.

    With several processes, process 0's choice is used (cost curves may differ) and the
    guard is off (a mid-way switch would need every process to agree); `guard=False`
    turns it off too (the engine's per-round choice judges instead: round_choice.py).
    """

    def __init__(
        self,
        model,
        sampling,
        max_step_tokens: int | None = None,
        batch: int = 1,
        guard: bool = True,
    ):
        from lookahead_jax.distributed import multihost

        choice = choose(model, max_step_tokens, sampling, batch)
        if multihost.is_multiprocess():
            choice = dataclasses.replace(choice, config=_agree_on(choice.config))
        self.model, self.sampling, self.choice = model, sampling, choice
        off = choice.config is None or multihost.is_multiprocess() or not guard
        self.guard = None if off else Guard(choice.cost_ratio)
        self.after_steps = None  # steps before the switch to plain decoding
        self.lookahead_hist = None  # the lookahead phase's accepted-length histogram
        self._last_steps = 0

    @property
    def config(self) -> LookaheadConfig | None:
        return self.choice.config

    @property
    def steps_per_call(self) -> int | None:
        """How many steps the device loop runs between checks (None: no checks)."""
        return self.guard.window_steps if self.guard else None

    @property
    def watching(self) -> bool:
        """Whether the guard still judges (lookahead chosen, guard on, no switch yet)."""
        return self.guard is not None and self.after_steps is None

    def gives_up(self, hist_be, steps: int) -> bool:
        """Whether to hand over to plain decoding, judged every `window_steps` steps from
        the lookahead phase's accepted-length histogram so far [B, E] (not the last
        window's: acceptance comes in bursts, and one dry window of 32 steps must not end
        a winning run) after `steps` steps."""
        if not self.watching or steps - self._last_steps < self.guard.window_steps:
            return False
        self._last_steps = steps
        compression, _ = hist_compression(hist_be)
        return not self.guard.keep_going(compression, steps)


def to_plain(state):
    """A lookahead DecodeState handed over to plain decoding: the same rows, lengths and
    buffers (a plain spec with min_slack = the lookahead's max_emit keeps their sizes),
    without the guess sources, with a fresh one-column accepted-length histogram."""
    B = state.accept_hist.shape[0]
    return dataclasses.replace(state, draft=None, accept_hist=jnp.zeros((B, 1), jnp.int32))


def _agree_on(config: LookaheadConfig | None) -> LookaheadConfig | None:
    """Process 0's choice, on every process."""
    from jax.experimental import multihost_utils

    choices = [None, *PRIORS]
    index = choices.index(None if config is None else config.tuning_key)
    index = int(multihost_utils.broadcast_one_to_all(np.int32(index)))
    return None if choices[index] is None else LookaheadConfig.for_tokens(choices[index])
