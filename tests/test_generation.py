"""Plain generation: equals Hugging Face greedy generate, the cache equals a full forward,
batches equal single prompts, stop rules, sampling reproducibility."""

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import torch

import lookahead_jax as lj
from lookahead_jax.decoding import programs
from lookahead_jax.models import kv_cache, llama
from lookahead_jax.models.seam import causal_mask
from tests import tiny
from tests.helpers import assert_same_or_near_tie, random_prompts, teacher_forced_logits, with_eos


def hf_greedy(hf, prompt: list[int], max_new_tokens: int, eos: int) -> list[int]:
    ids = torch.as_tensor([prompt])
    with torch.no_grad():
        out = hf.generate(
            ids,
            attention_mask=torch.ones_like(ids),
            max_new_tokens=max_new_tokens,
            do_sample=False,
            eos_token_id=eos,
            pad_token_id=0,
        )
    new = out[0, len(prompt) :].tolist()
    return new[: new.index(eos)] if eos in new else new


@pytest.mark.parametrize(
    "variant", ["mha", "gqa", "mqa", "tied", "llama3", "llama_bias", "mistral", "qwen2", "qwen3"]
)
def test_greedy_equals_hf_generate(tiny_ckpts, variant):
    hf_dir, ckpt = tiny_ckpts[variant]
    hf, model = tiny.load_hf(hf_dir), lj.load(ckpt)
    prompts = random_prompts(4, tiny.VOCAB, 2, 20, seed=1)
    out = lj.generate(model, prompts, max_new_tokens=40, lookahead=None)
    for p, got in zip(prompts, out.token_ids, strict=True):
        assert_same_or_near_tie(model, p, got, hf_greedy(hf, p, 40, eos=2))


@pytest.mark.parametrize("block", [64, 5])
def test_prefill_then_decode_equals_full_forward(tiny_ckpts, block):
    """Logits from a cache filled by a prefill plus one-token steps equal one full forward,
    whether the attention reads the cache in one block or in blocks of 5 slots (the last
    one moved back to end at the cache's 32 slots)."""
    model = lj.load(tiny_ckpts["gqa"][1])
    cfg, params = model.cfg, model.params
    forward = functools.partial(llama.forward, attention_block=block)
    ids = np.random.default_rng(3).integers(3, tiny.VOCAB, 24)
    full = teacher_forced_logits(model, ids.tolist())
    prefix = 10
    cache = model.lm.init_cache(1, 32, jnp.float32)
    x = jnp.asarray(ids[None, :prefix], jnp.int32)
    logits, k, v = forward(params, cfg, x, jnp.arange(prefix)[None], causal_mask(prefix))
    cache = kv_cache.write_prefix(cache, k, v, jnp.array([prefix]))
    steps = [np.asarray(logits[0, -1])]
    for t in range(prefix, len(ids) - 1):
        logits, k, v = forward(
            params,
            cfg,
            jnp.asarray([[ids[t]]], jnp.int32),
            jnp.asarray([[t]]),
            jnp.ones((1, 1, 1), bool),
            cache,
        )
        cache = kv_cache.commit(cache, k, v, jnp.zeros((1, 1), jnp.int32), jnp.array([1]))
        steps.append(np.asarray(logits[0, -1]))
    np.testing.assert_allclose(np.stack(steps), full[prefix - 1 : len(ids) - 1], atol=2e-5)


def test_generated_tokens_are_teacher_forced_argmax(tiny_ckpts):
    model = lj.load(tiny_ckpts["mqa"][1])
    prompt = random_prompts(1, tiny.VOCAB, 5, 5, seed=4)[0]
    got = lj.generate(model, [prompt], max_new_tokens=30, lookahead=None).token_ids[0]
    logits = teacher_forced_logits(model, prompt + got)
    want = logits[len(prompt) - 1 : -1].argmax(-1).tolist()
    assert_same_or_near_tie(model, prompt, got, want[: len(got)])


def test_batch_with_different_lengths_equals_single(tiny_ckpts):
    model = lj.load(tiny_ckpts["gqa"][1])
    prompts = [p for p in random_prompts(5, tiny.VOCAB, 1, 40, seed=5)]
    prompts[0] = prompts[0][:1]  # a one-token prompt
    batch = lj.generate(model, prompts, max_new_tokens=24, lookahead=None)
    for p, got in zip(prompts, batch.token_ids, strict=True):
        alone = lj.generate(model, [p], max_new_tokens=24, lookahead=None).token_ids[0]
        assert_same_or_near_tie(model, p, got, alone)
    assert batch.steps == [23] * 5  # the first token comes from the prefill


def test_eos_and_budget_stop_rows_independently(tiny_ckpts):
    model = lj.load(tiny_ckpts["gqa"][1])
    prompts = random_prompts(3, tiny.VOCAB, 4, 12, seed=6)
    free = lj.generate(model, prompts, max_new_tokens=20, lookahead=None).token_ids
    eos = free[1][7]  # row 1 emits this token first at index <= 7
    cut = free[1].index(eos)
    out = lj.generate(with_eos(model, (eos,)), prompts, max_new_tokens=20, lookahead=None)
    assert out.token_ids[1] == free[1][:cut]
    for b in (0, 2):
        want = free[b][: free[b].index(eos)] if eos in free[b] else free[b]
        assert out.token_ids[b] == want
    assert out.steps[1] == cut  # the EOS step was its last forward pass
    # rows ended by EOS and by the budget: a plain step emits exactly one token (an EOS
    # too), and the prefill's first token is not a step's
    assert out.stats.step_tokens == out.stats.row_steps and out.stats.compression == 1.0
    one = lj.generate(model, prompts, max_new_tokens=1, lookahead=None)
    assert [len(t) for t in one.token_ids] == [1, 1, 1] and one.steps == [0, 0, 0]


def test_sampling_reproducible_and_row_independent(tiny_ckpts):
    model = lj.load(tiny_ckpts["gqa"][1])
    prompts = random_prompts(3, tiny.VOCAB, 4, 12, seed=7)
    kw = dict(max_new_tokens=20, temperature=1.0, top_k=20, top_p=0.9, lookahead=None)
    a = lj.generate(model, prompts, seed=1, **kw).token_ids
    assert lj.generate(model, prompts, seed=1, **kw).token_ids == a
    assert lj.generate(model, prompts, seed=2, **kw).token_ids != a
    # row 0's tokens depend on (seed, row, prompt) only, not on the other rows
    assert lj.generate(model, prompts[:1], seed=1, **kw).token_ids[0] == a[0]
    greedy = lj.generate(model, prompts, max_new_tokens=20, lookahead=None).token_ids
    assert a != greedy
    assert (
        lj.generate(
            model, prompts, max_new_tokens=20, temperature=1.0, top_k=1, lookahead=None
        ).token_ids
        == greedy
    )
    assert (
        lj.generate(model, prompts, max_new_tokens=20, temperature=1e-6, lookahead=None).token_ids
        == greedy
    )


def test_prompt_buckets_share_compilations(tiny_ckpts):
    programs.clear()  # nothing compiled by earlier tests in this process
    model = lj.load(tiny_ckpts["mha"][1])
    first = lj.generate(model, [[5, 6, 7]], max_new_tokens=8, lookahead=None)
    assert first.stats.compile_s > 0
    compiled = set(programs._COMPILED)  # this bucket's programs
    second = lj.generate(model, [[5, 6, 7, 8, 9, 10, 11]], max_new_tokens=8, lookahead=None)
    assert second.stats.compile_s == 0.0 and set(programs._COMPILED) == compiled
    third = lj.generate(
        model, [[5] * 20], max_new_tokens=8, lookahead=None
    )  # the next bucket: new programs
    assert set(programs._COMPILED) > compiled and third.stats.compile_s > 0


def test_bad_arguments_raise_value_errors(tiny_ckpts):
    model = lj.load(tiny_ckpts["mha"][1])
    for kwargs, match in [
        (dict(max_new_tokens=0), "max_new_tokens"),
        (dict(temperature=-1.0), "temperature"),
        (dict(temperature=1.0, top_p=1.5), "top-p"),
        (dict(temperature=1.0, top_k=-1), "top-k"),
        (dict(max_new_tokens=5000), "context"),
    ]:
        with pytest.raises(ValueError, match=match):
            lj.generate(model, [[5, 6]], lookahead=None, **kwargs)
    with pytest.raises(ValueError, match="outside"):
        lj.generate(model, [[5, 100000]], lookahead=None)
    with pytest.raises(ValueError, match="non-empty"):
        lj.generate(model, [], lookahead=None)
    with pytest.raises(ValueError, match="no tokenizer"):
        lj.generate(model, ["text"], lookahead=None)


def test_float64_generation_matches_float32_on_clear_winners(tiny_ckpts):
    ckpt = tiny_ckpts["gqa"][1]
    prompts = random_prompts(2, tiny.VOCAB, 3, 9, seed=8)
    f32 = lj.generate(lj.load(ckpt), prompts, max_new_tokens=16, lookahead=None).token_ids
    with jax.enable_x64(True):
        model64 = lj.load(ckpt, dtype="float64")
        assert model64.params.embed.dtype == jnp.float64
        f64 = lj.generate(model64, prompts, max_new_tokens=16, lookahead=None).token_ids
    for p, a, b in zip(prompts, f32, f64, strict=True):
        assert_same_or_near_tie(lj.load(ckpt), p, a, b)
