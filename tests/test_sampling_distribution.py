"""Lookahead sampling keeps the model's distribution exactly: a chi-square goodness-of-fit
test against the enumerated distribution of every 3-token continuation of a tiny model,
and the same test rejecting a deliberately wrong acceptance rule."""

import itertools

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from scipy import stats

import lookahead_jax as lj
from lookahead_jax.decoding import programs
from lookahead_jax.decoding.sampling import RowSampling, SamplingConfig, process_logits
from lookahead_jax.guesses import draft_tree
from lookahead_jax.models.llama import forward
from lookahead_jax.models.seam import causal_mask
from tests import tiny
from tests.helpers import with_eos

VOCAB = 8
NEW = 3
# 4096 samples per case: the right rules' p-values 0.30 (t1) and 0.35 (t13_k6_p095), 71
# and 78 cells expecting >= 5; the wrong rule's 0.0 (under float64's smallest) already
# from 1024 samples, so its test draws those only (measured)
ROWS = 1024
CALLS = 4
# every guess source: window (noise-coupled), pool, suffix match, token recycling
LA = lj.LookaheadConfig(3, 2, 4, suffix=2, suffix_span=4, recycle=12, tree=16)
CASES = {
    "t1": SamplingConfig(temperature=1.0),
    "t13_k6_p095": SamplingConfig(temperature=1.3, top_k=6, top_p=0.95),
}


@pytest.fixture(scope="module")
def model8(tmp_path_factory):
    from lookahead_jax.checkpoints.convert.convert import convert

    root = tmp_path_factory.mktemp("v8")
    tiny.hf_model("gqa", seed=7, std=0.3, vocab_size=VOCAB).save_pretrained(root / "hf")
    convert(root / "hf", root / "ckpt", progress=False)
    with jax.enable_x64(True):
        model = with_eos(lj.load(root / "ckpt", dtype="float64"), ())  # no EOS: 3 tokens always
        # A prompt the model itself would write (31 tokens), so the pool holds n-grams the
        # model likes: most samples then go through verification (checked below).
        text = lj.generate(
            model, [[5, 3, 6]], max_new_tokens=28, temperature=1.0, seed=123, lookahead=None
        )
        yield model, [5, 3, 6] + text.token_ids[0]


def exact_distribution(model, prompt, cfg: SamplingConfig) -> np.ndarray:
    """P(x1, x2, x3 | prompt) [V, V, V] from the model's processed next-token probabilities."""
    pairs = list(itertools.product(range(VOCAB), repeat=2))
    seqs = jnp.asarray([prompt + [x1, x2] for x1, x2 in pairs], jnp.int32)  # one batch
    T, n = seqs.shape[1], len(prompt)
    logits, _, _ = jax.jit(forward, static_argnums=1)(
        model.params, model.cfg, seqs, jnp.broadcast_to(jnp.arange(T), seqs.shape), causal_mask(T)
    )
    rows = RowSampling.of([cfg] * len(pairs))
    probs = np.asarray(jax.nn.softmax(process_logits(logits[:, n - 1 :], rows), axis=-1))
    assert probs.dtype == np.float64
    p = np.zeros((VOCAB,) * NEW)
    for (x1, x2), q in zip(pairs, probs, strict=True):  # q [3, V]: after prompt, x1, x2
        p[x1, x2, :] = q[0, x1] * q[1, x2] * q[2]
    assert abs(p.sum() - 1) < 1e-9
    return p


def sample_counts(
    model, prompt, cfg: SamplingConfig, la, seeds=range(CALLS)
) -> tuple[np.ndarray, int]:
    """Counts [V, V, V] of ROWS sampled continuations per seed, summed, and how many guessed
    tokens were accepted."""
    counts = np.zeros((VOCAB,) * NEW, np.int64)
    accepted = 0
    for seed in seeds:
        out = lj.generate(
            model,
            [prompt] * ROWS,
            max_new_tokens=NEW,
            lookahead=la,
            seed=seed,
            temperature=cfg.temperature,
            top_k=cfg.top_k,
            top_p=cfg.top_p,
        )
        for toks in out.token_ids:
            counts[tuple(toks)] += 1
        accepted += sum((int(k) - 1) * c for k, c in out.stats.accepted_hist.items())
    return counts, accepted


def chi_square_p(counts: np.ndarray, p: np.ndarray) -> float:
    """Pearson chi-square p-value; cells expecting < 5 samples are pooled into one."""
    expected = p.ravel() * counts.sum()
    observed = counts.ravel()
    if observed[expected == 0].sum():
        return 0.0  # a sample the model cannot produce
    keep = expected >= 5
    exp, obs = expected[keep], observed[keep]
    if expected[~keep].sum() > 0:
        exp = np.append(exp, expected[~keep].sum())
        obs = np.append(obs, observed[~keep].sum())
    return float(stats.chisquare(obs, exp).pvalue)


@pytest.fixture
def fresh_compilations():
    """Compiled programs are cached per shape: the wrong-rule test must not reuse the right
    rule's, nor leave its own to the tests after it."""
    programs.clear()
    yield
    programs.clear()


@pytest.mark.slow
@pytest.mark.parametrize("case", CASES)
def test_lookahead_sampling_matches_the_exact_distribution(model8, case):
    cfg = CASES[case]
    model, prompt = model8
    with jax.enable_x64(True):
        p = exact_distribution(model, prompt, cfg)
        first, accepted = sample_counts(model, prompt, cfg, LA, seeds=[0])
        # the seeded sampler: same draws as plain decoding, fewer steps (one seed's ROWS
        # rows are enough to see it: the rows draw apart)
        assert (first == sample_counts(model, prompt, cfg, None, seeds=[0])[0]).all()
        rest, accepted_rest = sample_counts(model, prompt, cfg, LA, seeds=range(1, CALLS))
    counts, accepted = first + rest, accepted + accepted_rest
    # most samples had a guessed token accepted: the test exercises verification
    assert accepted > ROWS * CALLS // 3
    assert chi_square_p(counts, p) > 1e-3
    # the distribution is not degenerate: the test has power
    assert (p * counts.sum() >= 5).sum() > 40


@pytest.mark.slow
def test_a_wrong_acceptance_rule_fails_the_same_test(model8, monkeypatch, fresh_compilations):
    """Accepting every guess the tree offers (regardless of the model) is detected."""
    cfg = CASES["t1"]
    model, prompt = model8
    monkeypatch.setattr(
        draft_tree, "is_right", lambda tokens, expected: jnp.ones(tokens.shape, bool)
    )
    with jax.enable_x64(True):
        p = exact_distribution(model, prompt, cfg)
        counts, accepted = sample_counts(model, prompt, cfg, LA, seeds=[0])
    assert accepted > ROWS // 3
    assert chi_square_p(counts, p) < 1e-9


def three_prompts(prompt: list[int]) -> list[list[int]]:
    """The two tests below decode these, 16 tokens each: the same shapes, so they share
    their compiled programs."""
    return [prompt, prompt[:7], [4, 5, 6, 7, 4, 5, 6]]


def test_temperature_to_zero_and_top_k_1_equal_greedy_with_lookahead(model8):
    model, prompt = model8
    prompts = three_prompts(prompt)
    with jax.enable_x64(True):
        greedy = lj.generate(model, prompts, max_new_tokens=16, lookahead=None).token_ids
        for kw in (dict(temperature=1e-6), dict(temperature=1.0, top_k=1)):
            out = lj.generate(model, prompts, max_new_tokens=16, lookahead=LA, **kw)
            assert out.token_ids == greedy, kw


def test_seeded_lookahead_sampling_is_reproducible_and_row_independent(model8):
    model, prompt = model8
    prompts = three_prompts(prompt)
    kw = dict(max_new_tokens=16, lookahead=LA, temperature=1.0)
    with jax.enable_x64(True):
        a = lj.generate(model, prompts, seed=11, **kw).token_ids
        assert lj.generate(model, prompts, seed=11, **kw).token_ids == a
        assert lj.generate(model, prompts, seed=12, **kw).token_ids != a
        assert lj.generate(model, prompts[:1], seed=11, **kw).token_ids[0] == a[0]
        # the host (streaming) loop draws the same tokens as the device loop
        streamed = lj.generate(model, prompts, seed=11, stream=lambda new: None, **kw)
        assert streamed.token_ids == a
