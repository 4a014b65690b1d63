"""Each new token's logprob and top alternatives (decoding/logprobs.py): the model's
own log_softmax at that position, equal under plain and lookahead decoding (any
layout), greedy or sampled, and through the engine for the rows that ask only."""

import jax
import numpy as np
import pytest

import lookahead_jax as lj
from lookahead_jax.errors import UserInputError
from tests import tiny
from tests.helpers import random_prompts, with_eos
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
        # each layout once: which logits row a token came from does not depend on
        # sampling (the tree greedy, window paths verified sampled)
        configs=LAYOUTS[:1] if not sampling else LAYOUTS[1:],
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
    """Two slots for four requests (slots reused between rows that ask and rows that do
    not): rows without logprobs get None; rows with them get as many alternatives as
    they asked, for their new tokens and for their prompts (chunked passes:
    prompt_logprobs.py; a prompt longer than a chunk, max_new_tokens 0), equal to one
    causal pass's, and the EOS's; streamed updates carry the same logprobs as the result."""
    rng = np.random.default_rng(7)
    long = rng.integers(3, tiny.VOCAB, 100).tolist()  # bucket 128: two chunks of 64
    asks = [  # prompt, logprobs, prompt_logprobs, max_new_tokens
        (long, None, 3, 0),
        (PROMPTS[14], 2, None, 8),
        (PROMPTS[15], 5, 2, 8),
        (PROMPTS[13], None, None, 8),
    ]
    # tokens the tiny model emits for PROMPTS[14] (3rd) and [15] (8th) made EOS, so that
    # rows asking logprobs end at one (Result.eos: its logprob)
    model = with_eos(model, (2, 126, 71))
    engine = lj.Engine(model, batch=2, max_new_tokens=8, lookahead=LAYOUTS[0], sampled=False)
    streamed, results = {}, {}

    def listener(update):
        streamed.setdefault(update.id, []).extend(update.logprobs or [])
        if update.result is not None:
            results[update.id] = update.result

    for i, (p, k, kp, n) in enumerate(asks):
        request = lj.Request(p, id=i, logprobs=k, prompt_logprobs=kp, max_new_tokens=n)
        engine.submit(request, listener=listener)
    while engine.round():
        pass
    assert [results[i].finish for i in (1, 2)] == ["eos", "eos"]
    for i, (prompt, k, kp, n) in enumerate(asks):
        r = results[i]
        full = log_softmax(lj.testing.full_pass_logits(model, prompt + r.token_ids))
        if k is None:
            assert r.logprobs is None
        else:
            assert streamed[i] == r.logprobs and len(r.logprobs) == len(r.token_ids) > 0
            for j, (token, lp) in enumerate(zip(r.token_ids, r.logprobs, strict=True)):
                at = len(prompt) - 1 + j  # the row whose logits chose it
                assert abs(lp.logprob - full[at, token]) < 1e-5
                want = np.sort(full[at])[::-1][:k]
                np.testing.assert_allclose([v for _, v in lp.top], want, atol=1e-5)
            assert (r.eos is not None) == (r.finish == "eos")
            if r.eos is not None:  # the EOS after the last token: the last row's choice
                eos, lp = r.eos
                assert eos in model.eos_ids and abs(lp.logprob - full[-1, eos]) < 1e-5
        if kp is None:
            assert r.prompt_logprobs is None
            continue
        assert len(r.token_ids) <= n and len(r.prompt_logprobs) == len(prompt)
        assert r.prompt_logprobs[0] is None
        for j, lp in enumerate(r.prompt_logprobs[1:], start=1):
            assert abs(lp.logprob - full[j - 1, prompt[j]]) < 1e-5, (i, j)
            want = np.sort(full[j - 1])[::-1][:kp]
            np.testing.assert_allclose([v for _, v in lp.top], want, atol=1e-5)


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


@pytest.mark.parametrize("wanting", [(), (2,), (0, 6), (0, 1, 2), tuple(range(8))])
def test_logprobs_are_computed_for_the_rows_that_want_them(wanting):
    """of_tokens_if: none, a quarter of the rows or fewer (gathered), more (every row):
    the wanting rows get of_tokens' values; with few wanting, the others zeros."""
    from lookahead_jax.decoding import logprobs

    rng = np.random.default_rng(0)
    B, R, E, V, alternatives = 8, 5, 3, 640, 4
    x = rng.standard_normal((B, R, V)).astype(np.float32)
    rows, tokens = rng.integers(0, R, (B, E)), rng.integers(0, V, (B, E))
    want_b = np.isin(np.arange(B), wanting)
    got = jax.jit(logprobs.of_tokens_if, static_argnums=4)(want_b, x, rows, tokens, alternatives)
    full = logprobs.of_tokens(x, rows, tokens, alternatives)
    for g, f in zip(got, full, strict=True):
        np.testing.assert_allclose(np.asarray(g)[want_b], np.asarray(f)[want_b], atol=1e-6)
        if len(wanting) <= B // 4:
            assert not np.asarray(g)[~want_b].any()
