"""--lookahead auto: the choice follows the measured cost curve and the running acceptance
factor, falls back to plain decoding, and a losing lookahead hands over to plain decoding
mid-generation — always with exactly the plain tokens."""

import dataclasses
import functools
import json
import subprocess
import sys

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import lookahead_jax as lj
from lookahead_jax.decoding import autotune, cost_curve, step_curve
from lookahead_jax.decoding.autotune import PROBE_TOKENS
from tests.helpers import random_prompts

FLAT = {t: 0.010 * (1 + t / 1e4) for t in (1, 2, 4, 8, 12, 16, 32, 64, 128)}
STEEP = {1: 0.010, 2: 0.020, 4: 0.040, 8: 0.070, 12: 0.100, 16: 0.120}


@pytest.fixture
def tmp_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("LOOKAHEAD_JAX_CACHE", str(tmp_path))
    return tmp_path


@pytest.fixture(scope="module")
def model(tiny_ckpts):
    return lj.load(tiny_ckpts["gqa"][1])


def test_choice_follows_the_cost_curve(model, tmp_cache, monkeypatch):
    monkeypatch.setattr(autotune, "cached_curve", lambda m, tokens, stop_above=None, batch=1: FLAT)
    flat = autotune.choose(model)
    # big steps are (nearly) free: the layout with the best prior compression wins
    assert flat.config is not None and flat.config.tuning_key == max(
        autotune.PRIORS, key=autotune.PRIORS.get
    )
    assert flat.expected_speedup == max(flat.table.values())
    monkeypatch.setattr(autotune, "cached_curve", lambda m, tokens, stop_above=None, batch=1: STEEP)
    steep = autotune.choose(model)
    assert steep.config is None and steep.expected_speedup == 1.0  # nothing can win
    assert all(v < autotune.MARGIN for v in steep.table.values())
    # the stats line says why: the closest candidate's cost ratio and expected gain
    best = max(steep.table, key=steep.table.get)
    assert steep.runner_up.config.tuning_key == best
    why = autotune.why(steep.describe())
    assert steep.runner_up.config.name in why and f"{steep.table[best]:.2f}x" in why, why
    assert f"{flat.cost_ratio:.2f}x a plain one" in autotune.why(flat.describe())
    # with free steps, a cap on the step's tokens picks the best prior under the cap
    monkeypatch.setattr(autotune, "cached_curve", lambda m, tokens, stop_above=None, batch=1: FLAT)
    limited = autotune.choose(model, max_step_tokens=20)
    fits = [k for k in autotune.PRIORS if lj.LookaheadConfig.for_tokens(k).tokens_per_step <= 20]
    assert limited.config is not None and limited.config.tokens_per_step <= 20
    assert limited.config.tuning_key == max(fits, key=autotune.PRIORS.get) != flat.config.tuning_key


def test_cost_ratio_interpolates_and_refuses_to_extrapolate():
    assert cost_curve.cost_ratio(STEEP, 1) == 1.0
    assert cost_curve.cost_ratio(STEEP, 6) == pytest.approx(5.5)
    assert cost_curve.cost_ratio(STEEP, 17) == float("inf")


def test_measured_curve_is_cached_and_stops_early(model, tmp_cache, monkeypatch):
    monkeypatch.setattr(cost_curve, "BUSY_CORES", float("inf"))  # however busy the machine is
    # stop right after the first size
    curve = cost_curve.cached_curve(model, PROBE_TOKENS, stop_above=1e-9)
    assert list(curve) == [1, 2]
    files = list((tmp_cache / "autotune").glob("cost-*.json"))
    assert len(files) == 1
    assert {int(k) for k in json.loads(files[0].read_text())["curve"]} == {1, 2}
    assert cost_curve.cached_curve(model, PROBE_TOKENS) == curve  # read back, not measured again


def test_on_an_accelerator_the_curve_times_whole_decode_steps(model, tmp_cache, monkeypatch):
    """step_curve.py: each T's layout (the one auto runs at T tokens a step) prefilled and
    stepped in the decode loop, plain at T = 1; stopped early as the forwards' curve is."""
    assert step_curve.layout_for(1) is None
    for t in PROBE_TOKENS[1:]:
        assert step_curve.layout_for(t).tokens_per_step == t
    monkeypatch.setattr(cost_curve, "whole_steps", lambda: True)
    monkeypatch.setattr(cost_curve, "measure_cost_curve", None)  # not the forwards'
    monkeypatch.setattr(step_curve, "STEPS", 2)
    curve = cost_curve.cached_curve(model, PROBE_TOKENS, stop_above=1e-9)
    assert list(curve) == [1, 2] and all(s > 0 for s in curve.values())


def test_a_deep_model_is_probed_through_a_loop_over_its_first_layers(model, monkeypatch):
    assert cost_curve.probe_model(model) == (model.lm, model.params)  # 2 layers: as it is
    assert cost_curve.cache_bytes() > 0
    # a model deeper than PROBE_LAYERS whose layers outgrow the caches: 1 layer x 2 passes
    monkeypatch.setattr(cost_curve, "PROBE_LAYERS", 1)
    monkeypatch.setattr(cost_curve, "cache_bytes", lambda: 0)
    lm, params = cost_curve.probe_model(model)
    assert (lm.cfg.num_layers, lm.layer_passes, len(params.layers)) == (1, 2, 1)
    assert cost_curve.probe_model(model, layers_per_pass=2) == (model.lm, model.params)
    probes = []
    lowered = cost_curve.lowered_step
    monkeypatch.setattr(
        cost_curve,
        "lowered_step",
        lambda lm, *a, **k: (
            probes.append((lm.cfg.num_layers, lm.layer_passes)) or lowered(lm, *a, **k)
        ),
    )
    curve = cost_curve.measure_cost_curve(model, tokens=(1, 2), repeats=1)
    assert probes == [(1, 2), (1, 2)] and set(curve) == {1, 2}
    assert all(0 < s < 1 for s in curve.values())
    # a size sure to cost too much, from the line through the two largest timed
    assert cost_curve._extrapolated({1: 1.0, 2: 1.0, 4: 1.2, 8: 1.6}, 16) == pytest.approx(2.4)
    assert cost_curve._extrapolated({1: 1.0}, 16) == 0.0  # nothing to extrapolate from yet


def test_a_loop_over_a_layer_is_that_layer_repeated(model):
    # the probe's passes compute what as many copies of the layer would, bit for bit
    first = model.params.layers[0]
    twice = dataclasses.replace(model.params, layers=(first, first))
    looped_lm, looped = model.lm.first_layers(model.params, 1)
    looped_lm = dataclasses.replace(looped_lm, layer_passes=2)
    tokens = jnp.asarray([[5, 6, 7, 8]], jnp.int32)
    args = (tokens, jnp.arange(4, dtype=jnp.int32)[None], jnp.tril(jnp.ones((4, 4), bool))[None])
    want, *_ = model.lm.apply(twice, *args, None)
    got, *_ = looped_lm.apply(looped, *args, None)
    np.testing.assert_array_equal(np.asarray(got), np.asarray(want))
    same_lm, same = model.lm.first_layers(model.params, model.lm.cfg.num_layers)
    assert same_lm == model.lm
    leaves = zip(jax.tree.leaves(same), jax.tree.leaves(model.params), strict=True)
    assert all(a is b for a, b in leaves)


def test_a_curve_measured_on_a_busy_cpu_is_kept_with_its_noise_until_a_quiet_run(
    model, tmp_cache, monkeypatch
):
    monkeypatch.setattr(cost_curve, "BUSY_CORES", -1.0)  # any other CPU use counts as busy
    monkeypatch.setattr(cost_curve, "_MEASURED", set())
    calls = []
    measure = cost_curve.measure_cost_curve
    monkeypatch.setattr(
        cost_curve, "measure_cost_curve", lambda *a, **k: calls.append(1) or measure(*a, **k)
    )
    curve = cost_curve.cached_curve(model, PROBE_TOKENS, stop_above=1e-9)
    (path,) = (tmp_cache / "autotune").glob("cost-*.json")
    assert json.loads(path.read_text())["other_cores"] is not None  # kept, with its noise
    assert cost_curve.cached_curve(model, PROBE_TOKENS) == curve and len(calls) == 1
    first_cores = json.loads(path.read_text())["other_cores"]
    for later in ("a later process", "another"):
        monkeypatch.setattr(cost_curve, "_MEASURED", set())
        monkeypatch.setattr(cost_curve, "_LOOKED", set())
        if later == "a later process":  # on a busy machine: the cached curve, no measure
            monkeypatch.setattr(cost_curve, "_quiet_now", lambda: False)
            assert cost_curve.cached_curve(model, PROBE_TOKENS) == curve and len(calls) == 1
            monkeypatch.setattr(cost_curve, "_quiet_now", lambda: True)  # looked once: kept
            assert cost_curve.cached_curve(model, PROBE_TOKENS) == curve and len(calls) == 1
        else:  # on a quiet one: measured again (busy again: the less busy curve is kept)
            cost_curve.cached_curve(model, PROBE_TOKENS)
            assert len(calls) == 2
            assert json.loads(path.read_text())["other_cores"] <= first_cores
    # asked to measure again, it does, once
    monkeypatch.setenv(cost_curve.RETUNE_ENV, "1")
    monkeypatch.setattr(cost_curve, "_MEASURED", set())
    cost_curve.cached_curve(model, PROBE_TOKENS, stop_above=1e-9)
    cost_curve.cached_curve(model, PROBE_TOKENS, stop_above=1e-9)
    assert len(calls) == 3


def test_no_cost_ratio_below_one_and_curves_are_kept_per_cpu_model(model, monkeypatch):
    noisy = {1: 0.010, 2: 0.009, 4: 0.0086, 8: 0.012, 12: 0.011}
    curve = cost_curve.monotone(noisy)
    assert curve == {1: 0.010, 2: 0.010, 4: 0.010, 8: 0.012, 12: 0.012}
    assert min(cost_curve.cost_ratio(curve, t) for t in curve) == 1.0
    here = cost_curve.cost_curve_path(model)
    monkeypatch.setattr(cost_curve, "_cpu_name", lambda: "another")
    assert cost_curve.cost_curve_path(model) != here


def test_auto_keeps_its_last_choice_over_a_near_equal_one(model, tmp_cache, monkeypatch):
    """Run to run on one machine the acceptance factor moves; a layout expected to beat
    the last choice by less than STICKY does not replace it (nor its compiled programs)."""
    curve = {1: 0.010, 2: 0.011, 4: 0.012, 8: 0.014, 12: 0.016, 16: 0.018, 32: 0.04}
    monkeypatch.setattr(autotune, "cached_curve", lambda m, tokens, stop_above=None, batch=1: curve)
    first = autotune.choose(model)
    assert first.config is not None
    near = {
        k: v * (1.02 if k != first.config.tuning_key else 1.0) for k, v in autotune.PRIORS.items()
    }
    best = max(near, key=lambda k: (near[k] - 1) / autotune.cost_ratio(curve, k))
    monkeypatch.setattr(autotune, "PRIORS", near)  # others a little better now
    assert autotune.choose(model).config.tuning_key == first.config.tuning_key
    far = {**near, best: near[best] * 1.5}  # one clearly better: it is chosen
    monkeypatch.setattr(autotune, "PRIORS", far)
    assert autotune.choose(model).config.tuning_key == best != first.config.tuning_key
    assert autotune.choose(model, batch=4).config.tuning_key == best  # (its own record)
    # a last layout no longer expected to beat plain by MARGIN is not kept
    monkeypatch.setattr(autotune, "cached_curve", lambda m, tokens, stop_above=None, batch=1: STEEP)
    plain = autotune.choose(model)
    assert plain.config is None and not plain.kept
    # plain kept over a layout expected within STICKY of MARGIN, and the stats say so
    monkeypatch.setattr(autotune, "PRIORS", {k: 2.0 for k in near})
    ratio = 2.0 / (autotune.MARGIN * 1.02)  # every layout: 1.02 x MARGIN expected
    curve2 = {t: FLAT[1] * (ratio if t > 1 else 1.0) for t in FLAT}
    monkeypatch.setattr(
        autotune, "cached_curve", lambda m, tokens, stop_above=None, batch=1: curve2
    )
    kept = autotune.choose(model)
    assert (
        kept.config is None
        and kept.kept
        and "the last choice, kept" in autotune.why(kept.describe())
    )


def test_other_cpu_use_sees_another_process():
    spin = "import time\nt = time.time()\nwhile time.time() - t < 1.5: pass"
    with cost_curve.OtherCpuUse() as others:
        proc = subprocess.Popen([sys.executable, "-c", spin])
        proc.wait()  # this process sleeps meanwhile
    assert others.cores is not None and others.cores > 0.5


def test_acceptance_factor_is_a_running_average(model, tmp_cache):
    assert autotune.acceptance_factor(model) == 1.0
    la = lj.LookaheadConfig.for_tokens(8)
    prior = autotune.PRIORS[la.tuning_key]
    autotune.record_acceptance(model, la, compression=1.0, steps=100)  # nothing accepted
    low = autotune.acceptance_factor(model)
    assert low < 1.0
    autotune.record_acceptance(model, la, compression=2 * prior, steps=100)
    assert autotune.acceptance_factor(model) > low
    autotune.record_acceptance(model, la, compression=1.0, steps=3)  # too short to count
    assert autotune.acceptance_factor(model) > low


def test_sampling_keeps_its_own_acceptance_factor(model, tmp_cache, monkeypatch):
    greedy_before = autotune.acceptance_factor(model)
    hot = lj.SamplingConfig(temperature=0.7)
    assert autotune.sampling_bucket(hot) == "t0.7"
    assert autotune.sampling_bucket(lj.SamplingConfig(temperature=0.7, top_k=1)) == "greedy"
    la = lj.LookaheadConfig.for_tokens(8)
    autotune.record_acceptance(model, la, compression=1.0, steps=100, sampling=hot)
    assert autotune.acceptance_factor(model, hot) < 1.0
    assert autotune.acceptance_factor(model) == greedy_before  # greedy untouched
    assert autotune.acceptance_factor(model, lj.SamplingConfig(temperature=1.0)) == 1.0
    # a sampling generation with auto records under its own bucket too
    cheap = {t: 1e-6 * (1 + t / 1000) for t in FLAT}
    monkeypatch.setattr(autotune, "cached_curve", lambda m, tokens, stop_above=None, batch=1: cheap)
    lj.generate(model, [[5, 6, 7]], max_new_tokens=40, lookahead="auto", temperature=1.0)
    assert autotune.acceptance_factor(model, lj.SamplingConfig(temperature=1.0)) != 1.0
    assert autotune.acceptance_factor(model) == greedy_before


def test_guard():
    guard = autotune.Guard(cost_ratio=1.5)
    assert guard.keep_going(compression=1.0, steps=40)  # warming up: no verdict
    assert guard.keep_going(compression=2.0, steps=160)  # 1.33x
    assert not guard.keep_going(compression=1.1, steps=160)  # 0.73x


def test_auto_generation_switches_to_plain_and_keeps_the_tokens(model, tmp_cache, monkeypatch):
    # A curve that promises lookahead a nearly free win, and a guard that demands the
    # impossible (100x): it must call the lookahead off after warm-up, mid-generation.
    fake = {t: 1e-6 * (1 + t / 1000) for t in FLAT}
    monkeypatch.setattr(autotune, "cached_curve", lambda m, tokens, stop_above=None, batch=1: fake)
    # A short warm-up (16 steps, judged every 8), so that a short generation gets past it.
    guard = functools.partial(autotune.Guard, give_up_below=100, warmup_steps=16, window_steps=8)
    monkeypatch.setattr(autotune, "Guard", guard)
    prompts = random_prompts(3, 128, 5, 12, seed=41)
    # enough tokens that even a well-guessing layout (3 tokens a step) runs past the warm-up
    plain = lj.generate(model, prompts, max_new_tokens=100, lookahead=None)
    for stream in (None, lambda new: None):
        out = lj.generate(model, prompts, max_new_tokens=100, lookahead="auto", stream=stream)
        config = out.stats.config
        assert out.token_ids == plain.token_ids
        assert config.auto.config is not None
        assert config.switched_to_plain_after_steps >= guard(cost_ratio=1.0).warmup_steps
        # the histogram covers every step, lookahead phase and plain phase together
        hist = out.stats.accepted_hist
        assert sum(hist.values()) == sum(out.steps)


def test_auto_can_choose_plain(model, tmp_cache, monkeypatch):
    monkeypatch.setattr(autotune, "cached_curve", lambda m, tokens, stop_above=None, batch=1: STEEP)
    out = lj.generate(model, [[5, 6, 7]], max_new_tokens=10, lookahead="auto")
    assert out.stats.config.lookahead is None
    assert out.stats.config.auto.config is None
    assert out.stats.as_dict()["config"]["lookahead_auto"]["chosen"] is None


def test_a_low_acceptance_factor_recovers_over_plain_runs(model, tmp_cache, monkeypatch):
    """Plain runs measure no acceptance: a factor that made auto choose plain moves back
    toward the prior run by run, until a layout is tried (and measured) again — but not
    where no layout could win even at the prior's acceptance."""
    curve = {1: 0.010, 2: 0.0115, 4: 0.013, 8: 0.016, 12: 0.019, 16: 0.022, 32: 0.05}
    monkeypatch.setattr(autotune, "cached_curve", lambda m, tokens, stop_above=None, batch=1: curve)
    la = lj.LookaheadConfig.for_tokens(8)
    for _ in range(8):  # runs that accepted nothing
        autotune.record_acceptance(model, la, compression=1.0, steps=100)
    low = autotune.acceptance_factor(model)
    assert autotune.choose(model).config is None  # plain, for what was accepted
    factors = [autotune.acceptance_factor(model)]
    runs = 1
    while autotune.choose(model).config is None:
        factors.append(autotune.acceptance_factor(model))
        runs += 1
        assert runs < 30, factors
    assert low < factors[0] <= factors[-1] < 1.0 and factors == sorted(factors)
    monkeypatch.setattr(autotune, "cached_curve", lambda m, tokens, stop_above=None, batch=1: STEEP)
    for _ in range(8):
        autotune.record_acceptance(model, la, compression=1.0, steps=100)
    steep_low = autotune.acceptance_factor(model)
    assert autotune.choose(model).config is None
    assert autotune.acceptance_factor(model) == steep_low  # nothing could win: left as it is
