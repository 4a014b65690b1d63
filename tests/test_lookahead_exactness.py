"""Lookahead greedy decoding == plain greedy decoding, token for token.

The tiny random models run in float64 so that no near-tie can hide (or fake) a
bug: any difference is a real one. On SmolLM2 in float32 a divergence is only
allowed where the plain model's top-2 logits are within 1e-4, checked explicitly.
"""

import dataclasses
import functools

import jax
import numpy as np
import pytest

import lookahead_jax as lj
from lookahead_jax.guesses import draft_tree
from tests import tiny
from tests.helpers import assert_same_or_near_tie, random_prompts, with_eos

LA = lj.LookaheadConfig
# The paper's (N, W, G): run at batch 8 (tests/test_engine.py runs the CPU's default tree
# at batches 1, 3 and 4).
PAPER_CONFIGS = [
    LA(2, 3, 2),  # N=2: bigrams, one token per candidate
    LA(3, 1, 3),  # W=1
    LA(4, 4, 0),  # G=0: the window runs but nothing is verified (always 1 token)
    LA(4, 3, 16),  # G larger than the pool can fill
    LA(6, 2, 3),  # N larger than some prompts
    LA(4, 3, 3, prompt_pool=False),
    LA(3, 1, 0, verify_window=True),  # no pool candidates: pure Jacobi verification
]
# Draft trees fed by every source; layouts of 32+ tokens are larger than the context of
# the shortest prompts when they start.
TREE_CONFIGS = [
    LA.for_tokens(8),  # token recycling + suffix match, no window
    LA.for_tokens(16),  # + a window feeding the pool, pool candidates
    LA.for_tokens(64),  # deep suffix spans (16) and a wide recycling template
    LA(2, 0, 0, suffix=3, suffix_span=12, tree=6),  # suffix match alone, tree cut short
    LA(4, 3, 2, recycle=9, verify_window=True),  # window paths verified beside the tree
    LA(5, 4, 4, pool_capacity=9),  # pool holding more than it verifies
]
CONFIGS = PAPER_CONFIGS + TREE_CONFIGS
MAX_NEW = 23  # not a multiple of any N above


def repetitive_prompts(n: int, seed: int) -> list[list[int]]:
    """Prompts that repeat a short phrase, so the prompt pool has matching n-grams."""
    rng = np.random.default_rng(seed)
    out = []
    for _ in range(n):
        phrase = rng.integers(3, tiny.VOCAB, rng.integers(2, 5)).tolist()
        out.append((phrase * 4)[: rng.integers(3, 17)])
    return out


# 24 prompts of 1..16 tokens (one prompt bucket): random and repetitive, 3 shorter than N.
PROMPTS = random_prompts(12, tiny.VOCAB, 1, 16, seed=11) + repetitive_prompts(12, seed=12)
PROMPTS[0], PROMPTS[1], PROMPTS[2] = PROMPTS[0][:1], PROMPTS[1][:2], PROMPTS[2][:3]


@pytest.fixture(scope="module")
def model64(tiny_ckpts):
    with jax.enable_x64(True):
        yield lj.load(tiny_ckpts["gqa"][1], dtype="float64")


def run(model, prompts, batch: int, **kw):
    """Generate in chunks of `batch` rows; returns (token_ids, steps, stats list)."""
    tokens, steps, stats = [], [], []
    for i in range(0, len(prompts), batch):
        kw = {"lookahead": None, **kw}
        out = lj.generate(model, prompts[i : i + batch], max_new_tokens=MAX_NEW, **kw)
        tokens += out.token_ids
        steps += out.steps
        stats.append(out.stats)
    return tokens, steps, stats


@pytest.fixture(scope="module")
def plain64(model64):
    with jax.enable_x64(True):
        return run(model64, PROMPTS, 8)[0]


@pytest.mark.parametrize(
    "la", CONFIGS, ids=lambda la: la.name + ("" if la in PAPER_CONFIGS else " tree")
)
def test_lookahead_equals_plain_float64(model64, plain64, la):
    accepted = 0
    with jax.enable_x64(True):
        for batch, prompts in [(8, PROMPTS)]:
            tokens, steps, stats = run(model64, prompts, batch, lookahead=la)
            start = PROMPTS.index(prompts[0])
            for i, (got, s) in enumerate(zip(tokens, steps, strict=True)):
                assert got == plain64[start + i], (la, batch, start + i)
                assert len(got) <= MAX_NEW
                assert s <= max(len(got), 1)
            for st in stats:
                hist = st.accepted_hist
                assert set(hist) == {str(k) for k in range(1, la.max_emit + 1)}
                accepted += sum(int(k) - 1 for k, c in hist.items() for _ in range(c))
    if la.tree_nodes > 0 or la.verify_window:
        assert accepted > 0, "no guess was ever accepted: the comparison would be vacuous"
    else:
        assert accepted == 0


@pytest.mark.parametrize("la", [None, LA.for_tokens(16)], ids=["plain", "tokens=16"])
def test_attention_in_blocks_of_the_cache_gives_the_same_tokens(model64, plain64, la):
    """Attention over the cache in blocks of 5 nodes (up to the longest row, the last
    block moved back to end at S; models/llama.py) decodes exactly what one block over
    the whole cache does: the blocks only regroup the softmax's sums, and a block past a
    row's length leaves that row untouched."""
    lm = dataclasses.replace(model64.lm, attention_block=5)
    blocked = dataclasses.replace(model64, lm=lm)
    with jax.enable_x64(True):
        tokens, _, stats = run(blocked, PROMPTS, 8, lookahead=la)
    assert tokens == plain64
    if la is not None:
        assert sum((int(k) - 1) * c for st in stats for k, c in st.accepted_hist.items())


def test_a_lone_row_padded_for_the_lm_head_decodes_the_same(model64, plain64):
    """head_rows = 2 (GPUs': models/llama.py head_rows_for) pads a lone row's LM head input
    with a zero row, its logits dropped: at batch 1, plain and lookahead decode exactly
    what batch 8 without padding decodes, and the logits of one row match."""
    lm = dataclasses.replace(model64.lm, head_rows=2)
    padded = dataclasses.replace(model64, lm=lm)
    with jax.enable_x64(True):
        ids = np.asarray([PROMPTS[3][:5]])
        args = (ids, np.arange(5)[None], np.tril(np.ones((1, 5, 5), bool)), None)
        one_row = np.asarray(lm.apply(model64.params, *args, np.asarray([[4]]))[0])
        apart = np.asarray(model64.lm.apply(model64.params, *args, np.asarray([[4]]))[0])
        assert one_row.shape == apart.shape == (1, 1, tiny.VOCAB)
        np.testing.assert_allclose(one_row, apart, rtol=0, atol=1e-12)
        for la in (None, LA.for_tokens(16)):
            assert run(padded, PROMPTS[4:7], 1, lookahead=la)[0] == plain64[4:7], la


def test_the_acceptance_record_weighs_the_merge_and_never_changes_the_output(
    model64, plain64, monkeypatch
):
    """With and without the record (`adapt`) the tokens are plain decoding's; with it the
    merge gets the record's weights and the rows' weights leave 1 (the update ran)."""
    seen = []
    merge = draft_tree.merge

    def spy(p, nodes, max_depth, weight_bja=None):  # runs when the step is traced
        seen.append(weight_bja is not None)
        return merge(p, nodes, max_depth, weight_bja)

    monkeypatch.setattr(draft_tree, "merge", spy)
    # recycle_k=7: a layout no other test compiles, so that both programs are traced here
    la = dataclasses.replace(LA.for_tokens(8), recycle_k=7)
    with jax.enable_x64(True):
        on = run(model64, PROMPTS[:16], 8, lookahead=la)
        on_seen = seen[:]
        seen.clear()
        off = run(model64, PROMPTS[:16], 8, lookahead=dataclasses.replace(la, adapt=False))
    assert on_seen and all(on_seen) and seen and not any(seen)
    assert on[0] == off[0] == plain64[:16]
    weights = [w for st in on[2] for s in st.sources.values() for w in s.weight_by_depth]
    assert any(abs(w - 1) > 0.05 for w in weights)
    assert all(s.weight_by_depth is None for st in off[2] for s in st.sources.values())


# llama_bias: its biases are per-token additions (qwen2 keeps q/k/v biases here, and
# tests/test_model_parity.py checks llama_bias against HF)
@pytest.mark.parametrize("variant", ["mistral", "qwen2", "qwen3"])
def test_family_lookahead_equals_plain_float64(tiny_ckpts, variant):
    """Biases, q/k norms and sliding windows (6 positions, so they cut in the prefill and
    in every step: each window and tree node sees only keys within 6 positions of its own
    position) keep lookahead exact."""
    with jax.enable_x64(True):
        model = lj.load(tiny_ckpts[variant][1], dtype="float64")
        accepted = lj.testing.assert_lookahead_matches_plain(
            model,
            PROMPTS[10:18],
            configs=(LA.for_tokens(16),),  # window, pool, suffix and recycling tree
            max_new_tokens=MAX_NEW,
            batch_sizes=(8,),
        )
    assert all(n > 0 for n in accepted.values()), accepted


def test_the_harness_fails_a_comparison_where_no_guess_is_accepted(model64):
    """A layout that verifies nothing (G = 0: the window runs, no guess is checked) equals
    plain decoding by construction, and the harness says so instead of passing. (The
    shapes and layout of the 4,4,0 case above: nothing new to compile.)"""
    with jax.enable_x64(True):
        check = functools.partial(
            lj.testing.assert_lookahead_matches_plain,
            model64,
            PROMPTS[:8],
            configs=(LA(4, 4, 0),),
            max_new_tokens=MAX_NEW,
            batch_sizes=(8,),
        )
        with pytest.raises(AssertionError, match="accepted no guessed token with 4,4,0"):
            check()
        assert check(allow_no_acceptance=True) == {"4,4,0": 0}


def test_eos_inside_an_accepted_span(model64):
    """A row stops at an EOS that sits in the middle of a multi-token step."""
    la = LA.for_tokens(16)
    with jax.enable_x64(True):
        # MAX_NEW, batch 8: the shapes (and so the programs) of the tokens=16 case above
        out = lj.generate(model64, PROMPTS[12:20], max_new_tokens=MAX_NEW, lookahead=la)
        found = None
        for row, (toks, step_of) in enumerate(zip(out.token_ids, out.step_of_token, strict=True)):
            for i in range(1, len(toks) - 1):
                # token i is in the middle of a span of >= 3 tokens emitted by one step,
                # and appears for the first time there
                if step_of[i - 1] == step_of[i] == step_of[i + 1] > 0 and toks[i] not in toks[:i]:
                    found = (row, i, toks[i])
                    break
            if found:
                break
        assert found, "no step emitted 3+ tokens; choose other prompts"
        row, i, eos = found
        m = with_eos(model64, (eos,))
        prompts = PROMPTS[12:20]
        la_out = lj.generate(m, prompts, max_new_tokens=MAX_NEW, lookahead=la)
        plain = lj.generate(m, prompts, max_new_tokens=MAX_NEW, lookahead=None)
    assert la_out.token_ids[row] == out.token_ids[row][:i]
    assert la_out.token_ids == plain.token_ids


def test_device_loop_host_loop_and_chunks_agree(model64):
    la = LA(4, 3, 16)  # at batch 8 on PROMPTS[8:16]: the programs of the 4,3,16 case above
    with jax.enable_x64(True):
        prompts = PROMPTS[8:16]
        device = lj.generate(model64, prompts, max_new_tokens=MAX_NEW, lookahead=la)
        chunked = lj.generate(
            model64, prompts, max_new_tokens=MAX_NEW, lookahead=la, steps_per_call=2
        )
        streamed = [[] for _ in prompts]
        calls = []

        def on_tokens(new):
            calls.append([len(t) for t in new])
            for row, t in zip(streamed, new, strict=True):
                row.extend(t)

        host = lj.generate(model64, prompts, max_new_tokens=MAX_NEW, lookahead=la, stream=on_tokens)
    assert device.token_ids == chunked.token_ids == host.token_ids == streamed
    assert device.steps == host.steps
    assert max(max(c) for c in calls) > 1  # some callback delivered a multi-token step
    assert all(max(c) <= la.n for c in calls)


@pytest.mark.parametrize(
    # the paper's window with verification of its own n-grams (the default tree's sampling:
    # tests/test_engine.py and tests/test_sampling_distribution.py)
    "la",
    [LA(4, 3, 2, verify_window=True)],
    ids=lambda la: la.name,
)
def test_sampling_lookahead_equals_plain_sampling(model64, la):
    """With the seeded Gumbel-max rule, lookahead sampling reproduces plain sampling."""
    kw = dict(max_new_tokens=MAX_NEW, temperature=0.8, top_k=40, top_p=0.95, seed=3)
    with jax.enable_x64(True):
        plain = lj.generate(model64, PROMPTS[12:20], lookahead=None, **kw)
        look = lj.generate(model64, PROMPTS[12:20], lookahead=la, **kw)
    assert look.token_ids == plain.token_ids
    assert sum(look.steps) < sum(plain.steps)  # and it did accept guesses


@pytest.mark.smollm
def test_smollm2_float32_lookahead_equals_plain(smollm2):
    questions = [
        "Write a Python function that reverses a linked list.",
        "What are the main differences between TCP and UDP?",
        "Summarize the plot of Romeo and Juliet in three sentences.",
        "Solve for x: 3x + 7 = 22. Show your steps.",
    ]
    tok = smollm2.tokenizer
    prompts = [tok.encode_prompt(q, chat=True) for q in questions]
    # 32 tokens: compression 1.35 there (1.42 at 48), at two thirds of the decoding time
    plain = lj.generate(smollm2, prompts, max_new_tokens=32, lookahead=None)
    # the layout a CPU gets; the paper's layouts and the larger trees are covered on the
    # tiny models in float64
    for la in (LA.for_tokens(16),):
        out = lj.generate(smollm2, prompts, max_new_tokens=32, lookahead=la)
        for p, got, want in zip(prompts, out.token_ids, plain.token_ids, strict=True):
            assert_same_or_near_tie(smollm2, p, got, want)
        assert out.stats.compression > 1.2  # real acceptance on a real model


def test_config_validation():
    for bad in [(1, 3, 3), (3, -1, 3), (3, 3, -1), (3.5, 3, 3)]:
        with pytest.raises(ValueError, match="lookahead"):
            LA(*bad)
    assert LA(2, 1, 0).tokens_per_step == 2 and LA(5, 15, 15).tokens_per_step == 121
    assert hash(LA(5, 7, 7)) == hash(dataclasses.replace(LA(5, 7, 7)))
    # a tokens=T layout with fields changed: parsed, named, and parsed back
    fixed = LA.parse("tokens=16,adapt=False")
    assert fixed == dataclasses.replace(LA.for_tokens(16), adapt=False)
    assert fixed.name == "tokens=16,adapt=False" and LA.parse(fixed.name) == fixed
    assert LA.for_tokens(16).adapt and LA.for_tokens(16).name == "tokens=16"
    with pytest.raises(ValueError, match="unknown field 'speed'"):
        LA.parse("tokens=16,speed=2")
