"""Guesses across requests (decoding/guess_memory.py): with `shared_guesses`, new rows'
token-recycling tables start from what ended rows left, and suffix match reads their
outputs. Tokens never change (float64 tiny model, against an engine without it), and a
prompt asked again is guessed better.
"""

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import lookahead_jax as lj
from lookahead_jax.guesses import suffix_match as sm
from lookahead_jax.guesses import token_recycling as tr
from lookahead_jax.guesses.guess_source import Ended, Prompt

rng = np.random.default_rng(0)
PROMPTS = [rng.integers(1, 128, int(k)).tolist() for k in (5, 9, 12, 7)]


@pytest.fixture(scope="module")
def model64(tiny_ckpts):
    with jax.enable_x64(True):
        yield lj.load(tiny_ckpts["gqa"][1], dtype="float64")


def test_shared_guesses_keep_the_tokens_and_guess_a_repeat_better(model64):
    kw = dict(batch=2, max_new_tokens=32, lookahead=lj.LookaheadConfig.for_tokens(16))
    with jax.enable_x64(True):
        alone = lj.Engine(model64, **kw)
        cold = {r.id: r.token_ids for r in alone.run(PROMPTS)}
        engine = lj.Engine(model64, shared_guesses=True, **kw)
        first = {r.id: r.token_ids for r in engine.run(PROMPTS)}
        again = {r.id: r.token_ids for r in engine.run(PROMPTS)}
    assert first == cold and again == cold
    # the second time every row starts from the tables of the first run's answers, and
    # suffix match reads them: it gets more guessed tokens accepted than without
    assert engine.stats.compression > alone.stats.compression
    suffix = lambda e: e.stats.sources["suffix"].tokens  # noqa: E731
    assert suffix(engine) > suffix(alone)


V = 8


def test_remember_folds_the_chosen_rows_and_recall_seeds_the_prompt_over_it():
    source = tr.RecyclingSource(size=4, k=2)
    memory = source.memory(V)
    table = tr.init_table(3, V, 2)
    entries = lambda *ids: jnp.array(ids, jnp.int32)  # noqa: E731
    by_token = table.by_token.at[0, 5].set(entries(1, 2)).at[1, 5].set(entries(3, 4))
    table = dataclasses.replace(table, by_token=by_token.at[2, 6].set(entries(7, 7)))
    kept = source.remember(memory, table, jnp.array([True, True, False]), None)
    assert kept.by_token[0, 5].tolist() == [3, 4]  # the last chosen row that holds token 5
    assert kept.by_token[0, 6].tolist() == [tr.EMPTY] * 2  # row 2 was not chosen
    tokens = jnp.array([[5, 0, 0, 0], [1, 2, 0, 0]], jnp.int32)
    prompt = Prompt(tokens, jnp.array([1, 2]), jnp.array([True, True]),
                    jnp.zeros((2, 2), jnp.uint32), 4, V)  # fmt: skip
    rows = source.recall(kept, source.init(prompt), prompt)
    assert rows.by_token[0, 5].tolist() == [3, 4]  # from the memory
    assert rows.by_token[1, 1].tolist() == [2, tr.EMPTY]  # its own prompt: 1 then 2
    assert rows.by_token[1, 5].tolist() == [3, 4]


def test_suffix_memory_keeps_ended_outputs_and_a_new_row_continues_from_them():
    """Suffix match's memory (suffix_match.py): each ended row's output, with the key_max
    prompt tokens before it, as a segment; a segment that would reach the last position
    starts again at 0; a new row's match over its copy stops at the segment's end."""
    source = sm.SuffixSource(count=2, span=4, key_max=2, memory_tokens=12)
    SEP = sm.SEPARATOR
    tokens = jnp.array([[7, 8, 1, 2, 3, 0, 0], [9, 9, 9, 4, 5, 6, 7]], jnp.int32)
    ended = Ended(tokens, prompt_len=jnp.array([2, 3]), end=jnp.array([5, 7]))
    memory = source.remember(source.memory(V), None, jnp.array([True, False]), ended)
    assert memory.tokens[0].tolist() == [7, 8, 1, 2, 3] + [SEP] * 7 and memory.head[0] == 6
    # a new row: its text ends in `8 1`, which the memory's first segment holds
    text_tokens = jnp.array([[4, 8, 1, 0, 0]], jnp.int32)
    prompt = Prompt(text_tokens, jnp.array([3]), jnp.array([True]),
                    jnp.zeros((1, 2), jnp.uint32), 5, V)  # fmt: skip
    state = source.recall(memory, source.init(prompt), prompt)
    assert state.tolist() == memory.tokens.tolist()
    cont, length, key_len = sm.propose(
        jnp.concatenate([state, text_tokens], axis=1), jnp.array([12 + 3]),
        key_max=2, span=4, count=2,
    )  # fmt: skip
    assert cont[0, 0, :2].tolist() == [2, 3] and length[0, 0] == 2 and key_len[0, 0] == 2
    # without the memory the row has no earlier `1`: nothing to propose
    assert sm.propose(text_tokens, jnp.array([3]), key_max=2, span=4, count=2)[1][0, 0] == 0
    # row 1 (6 tokens and a separator from head 6 would reach position 12 > 11): from 0
    memory = source.remember(memory, None, jnp.array([False, True]), ended)
    assert memory.tokens[0, :7].tolist() == [9, 9, 4, 5, 6, 7, SEP] and memory.head[0] == 7
    # an exact fit: 3 tokens and a separator at 7..10; the last position is never written
    exact = Ended(tokens, prompt_len=jnp.array([2, 6]), end=jnp.array([3, 7]))
    memory = source.remember(memory, None, jnp.array([False, True]), exact)
    assert memory.tokens[0, 7:].tolist() == [5, 6, 7, SEP, SEP] and memory.head[0] == 11
    # two rows in one call, in row order; an output longer than the memory keeps its end
    long = jnp.arange(20, 40, dtype=jnp.int32)[None].repeat(2, axis=0)
    both = Ended(long, prompt_len=jnp.array([18, 2]), end=jnp.array([20, 20]))
    memory = source.remember(memory, None, jnp.array([True, True]), both)
    assert memory.tokens[0].tolist() == list(range(30, 40)) + [SEP, SEP]
    assert memory.head[0] == 11


def test_a_separator_before_a_segment_does_not_lengthen_a_short_texts_match():
    """A text shorter than key_max reads back into the memory's copy, whose last position
    is a separator: that must not match the separator before a segment."""
    SEP = sm.SEPARATOR
    memory = [7, 8, 1, SEP, 5, 6, 9, 9, SEP, SEP]
    tokens = jnp.array([memory + [5, 6]], jnp.int32)  # the text: 5 6
    cont, length, key_len = sm.propose(tokens, jnp.array([12]), key_max=3, span=4, count=1)
    assert key_len[0, 0] == 2 and length[0, 0] == 2 and cont[0, 0, :2].tolist() == [9, 9]


def test_recall_takes_the_prefilled_state_donated(tiny_ckpts):
    """A prefill's new rows start from the memory (recall) in a program that takes the
    fresh state donated: every buffer it does not replace, the cache above all, is the
    output's own (aliased in the compiled HLO), not a copy."""
    from lookahead_jax.decoding import guess_memory, programs
    from lookahead_jax.decoding.decode_state import DecodeSpec
    from lookahead_jax.decoding.sampling import RowSampling
    from lookahead_jax.engine.device_slots import recall_program

    model = lj.load(tiny_ckpts["gqa"][1])
    config = lj.LookaheadConfig.for_tokens(16)
    spec = DecodeSpec(model.lm, tuple(model.eos_ids), False, config, cache_dtype="float32")
    rows = lambda *shape, dtype=jnp.int32: jax.ShapeDtypeStruct((2, *shape), dtype)  # noqa: E731
    sampling = RowSampling.shaped(2)
    args = (model.params, rows(16), rows(), rows(), rows(2, dtype=jnp.uint32), sampling)
    state = programs.state_shape(model, spec, 32, args)
    memories = jax.eval_shape(lambda: guess_memory.memories(spec))
    hlo = recall_program().lower(state, memories, spec=spec, bucket=16).compile().as_text()
    header = hlo.splitlines()[0]
    aliased = header.count("alias)")
    assert aliased >= len(jax.tree.leaves(state.cache)), header[:300]
