"""Guesses across requests (decoding/guess_memory.py): with `shared_guesses`, new rows'
token-recycling tables start from what ended rows left. Tokens never change (float64
tiny model, against an engine without it), and a prompt asked again is guessed better.
"""

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import lookahead_jax as lj
from lookahead_jax.guesses import token_recycling as tr
from lookahead_jax.guesses.guess_source import Prompt

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
    # the second time every row starts from the tables of the first run's answers
    assert engine.stats.compression > alone.stats.compression


def test_remember_folds_the_chosen_rows_and_recall_seeds_the_prompt_over_it():
    source = tr.RecyclingSource(size=4, k=2)
    V = 8
    memory = source.memory(V)
    table = tr.init_table(3, V, 2)
    entries = lambda *ids: jnp.array(ids, jnp.int32)  # noqa: E731
    by_token = table.by_token.at[0, 5].set(entries(1, 2)).at[1, 5].set(entries(3, 4))
    table = dataclasses.replace(table, by_token=by_token.at[2, 6].set(entries(7, 7)))
    kept = source.remember(memory, table, jnp.array([True, True, False]))
    assert kept.by_token[0, 5].tolist() == [3, 4]  # the last chosen row that holds token 5
    assert kept.by_token[0, 6].tolist() == [tr.EMPTY] * 2  # row 2 was not chosen
    tokens = jnp.array([[5, 0, 0, 0], [1, 2, 0, 0]], jnp.int32)
    prompt = Prompt(tokens, jnp.array([1, 2]), jnp.array([True, True]),
                    jnp.zeros((2, 2), jnp.uint32), 4, V)  # fmt: skip
    rows = source.recall(kept, source.init(prompt), prompt)
    assert rows.by_token[0, 5].tolist() == [3, 4]  # from the memory
    assert rows.by_token[1, 1].tolist() == [2, tr.EMPTY]  # its own prompt: 1 then 2
    assert rows.by_token[1, 5].tolist() == [3, 4]
