"""Each new token's logprob and top alternatives (decoding/logprobs.py): the model's
own log_softmax at that position, equal under plain and lookahead decoding (any
layout), greedy or sampled, and through the engine for the rows that ask only."""

import numpy as np
import pytest

import lookahead_jax as lj
from lookahead_jax.errors import UserInputError
from tests import tiny
from tests.helpers import random_prompts
from tests.test_lookahead_exactness import PROMPTS, repetitive_prompts

LA = lj.LookaheadConfig
# the CPU's default tree, and a layout whose accepted rows are the window's (verify_window)
LAYOUTS = (LA.for_tokens(16), LA(4, 3, 2, recycle=9, verify_window=True))
MAX_NEW = 23  # the exactness suite's shapes
TOP = 3


@pytest.fixture(scope="module")
def model(tiny_ckpts):
    return lj.load(tiny_ckpts["gqa"][1])


def log_softmax(x):
    x = x - x.max(-1, keepdims=True)
    return x - np.log(np.exp(x).sum(-1, keepdims=True))


def test_logprobs_are_the_models_log_softmax(model):
    """Against one causal pass over prompt + new tokens (float64 numpy): each token's
    logprob, and the alternatives are the most likely tokens, most likely first."""
    prompts = PROMPTS[12:20]
    out = lj.generate(model, prompts, MAX_NEW, lookahead=LAYOUTS[0], logprobs=TOP)
    for prompt, ids, lps in zip(prompts, out.token_ids, out.logprobs, strict=True):
        assert len(lps) == len(ids)
        full = log_softmax(lj.testing.full_pass_logits(model, prompt + ids)[len(prompt) - 1 :])
        for i, (token, lp) in enumerate(zip(ids, lps, strict=True)):
            assert abs(lp.logprob - full[i, token]) < 1e-5
            top_ids = [t for t, _ in lp.top]
            assert len(top_ids) == TOP and top_ids[0] == token  # greedy: the best one
            np.testing.assert_allclose([v for _, v in lp.top], full[i, top_ids], atol=1e-5)
            assert np.sort(full[i])[-TOP:][::-1] == pytest.approx([v for _, v in lp.top], abs=1e-5)


@pytest.mark.parametrize(
    "sampling", [{}, {"temperature": 0.8, "top_p": 0.9, "seed": 5}], ids=["greedy", "sampled"]
)
def test_lookahead_logprobs_equal_plain_float32(model, sampling):
    """Every layout, greedy and sampled (raw logprobs: the same numbers whatever the
    temperature), within 1e-5 of plain decoding's (the harness's logprob check)."""
    prompts = repetitive_prompts(6, seed=3) + random_prompts(2, tiny.VOCAB, 2, 12, seed=4)
    near_tie = None if sampling else 1e-4
    accepted = lj.testing.assert_lookahead_matches_plain(
        model,
        prompts,
        configs=LAYOUTS,
        max_new_tokens=MAX_NEW,
        batch_sizes=(8,),
        near_tie=near_tie,
        logprobs=TOP,
        **sampling,
    )
    assert all(n > 0 for n in accepted.values()), accepted


def test_the_harness_fails_logprobs_that_differ(model, monkeypatch):
    """The logprob check can fail: a lookahead run whose logprobs are off by 1e-4."""
    real = lj.testing.generate

    def skewed(*args, lookahead=None, **kw):
        out = real(*args, lookahead=lookahead, **kw)
        if lookahead is not None:
            first = out.logprobs[0][0]
            out.logprobs[0][0] = lj.TokenLogprob(first.logprob + 1e-4, first.top)
        return out

    monkeypatch.setattr(lj.testing, "generate", skewed)
    with pytest.raises(AssertionError, match="logprobs != plain"):
        lj.testing.assert_lookahead_matches_plain(
            model,
            PROMPTS[12:20],
            configs=LAYOUTS[:1],
            max_new_tokens=MAX_NEW,
            batch_sizes=(8,),
            logprobs=TOP,
        )


def test_engine_rows_ask_for_logprobs_apart(model):
    """In one batch, rows without logprobs get None, rows with them get as many
    alternatives as they asked; streamed updates carry the same logprobs as the result;
    and the numbers equal a lone lj.generate's."""
    engine = lj.Engine(model, batch=4, max_new_tokens=MAX_NEW, lookahead=LAYOUTS[0])
    prompts = PROMPTS[12:16]
    streamed = {}
    results = {}

    def listener(update):
        streamed.setdefault(update.id, []).extend(update.logprobs or [])
        if update.result is not None:
            results[update.id] = update.result

    asks = [None, 2, None, 5]
    for i, (p, k) in enumerate(zip(prompts, asks, strict=True)):
        engine.submit(lj.Request(p, id=i, logprobs=k), listener=listener)
    while engine.round():
        pass
    alone = lj.generate(model, prompts, MAX_NEW, lookahead=None, logprobs=5)
    for i, k in enumerate(asks):
        r = results[i]
        assert r.token_ids == alone.token_ids[i]
        if k is None:
            assert r.logprobs is None
            continue
        assert streamed[i] == r.logprobs and len(r.logprobs) == len(r.token_ids)
        for got, want in zip(r.logprobs, alone.logprobs[i], strict=True):
            assert len(got.top) == k
            assert abs(got.logprob - want.logprob) < 1e-5
            assert [t for t, _ in got.top] == [t for t, _ in want.top[:k]]


def test_bad_logprobs_are_refused(model):
    engine = lj.Engine(model, batch=2, max_new_tokens=8, max_logprobs=4)
    for bad in (-1, 1.5, True, 5):
        with pytest.raises(UserInputError, match="logprobs") as e:
            engine.submit(lj.Request([1, 2], logprobs=bad))
        assert e.value.field == "logprobs"
    none = lj.Engine(model, batch=2, max_new_tokens=8, max_logprobs=None)
    with pytest.raises(UserInputError, match="keeps no logprobs"):
        none.submit(lj.Request([1, 2], logprobs=0))
    with pytest.raises(UserInputError, match="max_logprobs"):
        lj.Engine(model, max_logprobs=-2)


def test_prompt_logprobs_are_the_models_log_softmax(model):
    """A prompt's own logprobs (chunked passes over the prompt: prompt_logprobs.py),
    prompts longer than a chunk and shorter, beside rows that do not ask, with no token
    generated and with some; against one causal pass (float64 numpy)."""
    rng = np.random.default_rng(7)
    long = rng.integers(3, tiny.VOCAB, 100).tolist()  # bucket 128: two chunks of 64
    asks = [(long, 3, 0), (PROMPTS[14], None, 5), (PROMPTS[15], 2, 4), (long[:40], 0, 0)]
    engine = lj.Engine(model, batch=4, max_new_tokens=8, lookahead=LAYOUTS[0])
    requests = [
        lj.Request(p, id=i, prompt_logprobs=k, max_new_tokens=n or (1 if k is None else 0))
        for i, (p, k, n) in enumerate(asks)
    ]
    results = {r.id: r for r in engine.run(requests)}
    for i, (prompt, k, n) in enumerate(asks):
        r = results[i]
        if k is None:
            assert r.prompt_logprobs is None
            continue
        assert len(r.token_ids) == n and len(r.prompt_logprobs) == len(prompt)
        assert r.prompt_logprobs[0] is None
        full = log_softmax(lj.testing.full_pass_logits(model, prompt))
        for j, lp in enumerate(r.prompt_logprobs[1:], start=1):
            assert abs(lp.logprob - full[j - 1, prompt[j]]) < 1e-5, (i, j)
            assert len(lp.top) == k
            np.testing.assert_allclose(
                [v for _, v in lp.top], np.sort(full[j - 1])[::-1][:k], atol=1e-5
            )
