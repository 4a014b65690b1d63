"""Structured output in the decode (decoding/grammar_rows.py, engine/grammar_bank.py):
under a grammar, lookahead emits exactly the tokens of plain decoding under the same
grammar (float64 tiny model with a character tokenizer, greedy and sampled), every answer
stays inside the grammar, and rows with and without grammars share a batch unchanged."""

from __future__ import annotations

import json

import jax
import pytest

import lookahead_jax as lj
from lookahead_jax import grammar
from tests.helpers import accepted_guesses

PROMPTS = ["say ab", "the cat", "x", "ba ba ba"]
MAX_NEW = 24
REGEX = r"[abc]{2,9}( [abc]{1,5}){0,4}\."
SCHEMA = {
    "type": "object",
    "properties": {
        "k": {"enum": ["ab", "ba"]},
        "n": {"type": "boolean"},
        "s": {"type": "string", "maxLength": 5},
    },
    "required": ["k", "n"],
}
GRAMMARS = {"regex": dict(regex=REGEX), "json_schema": dict(json_schema=SCHEMA)}


@pytest.fixture(scope="module")
def model64(tiny_text_ckpt):
    with jax.enable_x64(True):
        yield lj.load(tiny_text_ckpt, dtype="float64")


def automaton(model, kind) -> grammar.TokenAutomaton:
    args = (model.tokenizer.token_bytes(), tuple(model.eos_ids), model.lm.vocab_size)
    if kind == "regex":
        return grammar.from_regex(REGEX, *args)
    return grammar.from_json_schema(SCHEMA, *args)


def check_inside(model, kind, token_ids) -> None:
    """Each answer is a prefix of a match, a whole one when it ended before its budget
    (with EOS)."""
    a = automaton(model, kind)
    for ids in token_ids:
        assert a.walk(ids) >= 0, model.tokenizer.decode(ids)
        if len(ids) < MAX_NEW:
            assert a.accepts(ids), model.tokenizer.decode(ids)
            text = model.tokenizer.decode(ids)
            if kind == "json_schema":
                import jsonschema

                jsonschema.validate(json.loads(text), SCHEMA)


@pytest.mark.parametrize("temperature", [0.0, 1.0])
@pytest.mark.parametrize("kind", ["regex", "json_schema"])
def test_constrained_lookahead_equals_constrained_plain(model64, kind, temperature):
    kw = dict(max_new_tokens=MAX_NEW, temperature=temperature, seed=3, **GRAMMARS[kind])
    with jax.enable_x64(True):
        plain = lj.generate(model64, PROMPTS, lookahead=None, **kw)
        la = lj.generate(model64, PROMPTS, lookahead=lj.LookaheadConfig.for_tokens(8), **kw)
    assert la.token_ids == plain.token_ids
    check_inside(model64, kind, plain.token_ids)
    assert any(len(ids) < MAX_NEW for ids in plain.token_ids)  # some ended with EOS
    assert accepted_guesses(la.stats) > 0  # not vacuous: guesses were accepted
    assert sum(la.steps) < sum(plain.steps)
    # every row counted; the grammar compiled once (the second run's came from the cache)
    assert plain.stats.grammar_requests == la.stats.grammar_requests == len(PROMPTS)
    assert la.stats.grammar_compile_s == 0.0 and la.stats.as_dict()["grammar_compile_s"] == 0.0
    if kind == "json_schema":  # the schema's fixed text was guessed, and paid
        assert la.stats.sources["grammar"].tokens > 0, la.stats.sources


def test_one_compiled_loop_serves_grammars_of_different_sizes(model64):
    """An offline run's tables are bucketed (grammar_bank.MIN_SHAPE): a second
    `lj.generate` under another grammar, of another size, compiles no program."""
    la = lj.LookaheadConfig.for_tokens(8)
    args = (model64.tokenizer.token_bytes(), tuple(model64.eos_ids), model64.lm.vocab_size)
    longer = r"[abc]{1,90}\."
    assert grammar.from_regex(longer, *args).states > 2 * automaton(model64, "regex").states
    with jax.enable_x64(True):
        for regex in (REGEX, longer):
            out = lj.generate(model64, PROMPTS, max_new_tokens=MAX_NEW, lookahead=la, regex=regex)
    assert out.stats.compile_s == 0.0, out.stats.compile_s


def test_rows_with_and_without_grammars_share_a_batch(model64):
    """One engine batch: a regex row, a schema row and two free rows; each row's tokens
    are those of its own decode alone (greedy, lookahead and plain)."""
    requests = [
        lj.Request(PROMPTS[0], regex=REGEX),
        lj.Request(PROMPTS[1]),
        lj.Request(PROMPTS[2], json_schema=SCHEMA),
        lj.Request(PROMPTS[3]),
    ]
    alone = {
        0: dict(regex=REGEX),
        1: {},
        2: dict(json_schema=SCHEMA),
        3: {},
    }
    with jax.enable_x64(True):
        want = [
            lj.generate(
                model64, [PROMPTS[i]], max_new_tokens=MAX_NEW, lookahead=None, **kw
            ).token_ids[0]
            for i, kw in alone.items()
        ]
        for la in (None, lj.LookaheadConfig.for_tokens(8)):
            engine = lj.Engine(model64, batch=4, max_new_tokens=MAX_NEW, lookahead=la)
            got = {r.id: r.token_ids for r in engine.run(requests)}
            assert [got[i] for i in range(4)] == want, la
    check_inside(model64, "regex", [want[0]])
    check_inside(model64, "json_schema", [want[2]])


def test_the_grammar_guesses_fit_the_layout():
    """A run with grammars turns the grammar source on: no deeper than a fixed tree holds,
    so the step's size is unchanged; a layout that sets it keeps its own."""
    from lookahead_jax.engine.grammar_bank import CHAIN, with_guesses

    for T in (2, 16):
        la = lj.LookaheadConfig.for_tokens(T)
        on = with_guesses(la, 2048)
        assert on.grammar_guess == min(CHAIN, la.tree) and on.tokens_per_step == T
        assert "grammar" in on.source_names


def test_bad_grammars_are_refused_before_decoding(model64):
    with pytest.raises(lj.UserInputError, match="not both"):
        lj.generate(model64, ["x"], max_new_tokens=4, regex="a", json_schema={"type": "string"})
    with pytest.raises(lj.UserInputError, match=r"\$\.minimum"):
        lj.generate(model64, ["x"], max_new_tokens=4, json_schema={"type": "integer", "minimum": 1})
    engine = lj.Engine(model64, batch=2, max_new_tokens=4, lookahead=None)
    with pytest.raises(lj.UserInputError, match="grammar_states > 0"):
        engine.submit(lj.Request("x", regex="a+"))
    small = lj.Engine(model64, batch=2, max_new_tokens=4, lookahead=None, grammar_states=3)
    holds = r"makes \d+ automaton states of \d+ token classes; this engine holds 15"
    with pytest.raises(lj.UserInputError, match=holds):
        small.submit(lj.Request("x", json_schema=SCHEMA))


def test_an_online_engine_swaps_grammars_in_its_table(model64):
    """An online engine's table holds one grammar at a time here: requests under the
    other wait until no row follows the first, which is then dropped for it; every
    request gets its lone decode's tokens (greedy, lookahead), free ones beside them."""
    from lookahead_jax.engine.grammar_bank import online_shape

    sizes = [automaton(model64, kind).states for kind in GRAMMARS]
    assert sum(sizes) > online_shape(max(sizes))[0] - 1  # one at a time
    order = ["regex", "json_schema", None, "regex", "json_schema"]
    done = {}
    with jax.enable_x64(True):
        want = [
            lj.generate(
                model64, [PROMPTS[i % 4]], max_new_tokens=MAX_NEW, lookahead=None,
                **(GRAMMARS[k] if k else {}),
            ).token_ids[0]
            for i, k in enumerate(order)
        ]  # fmt: skip
        engine = lj.Engine(
            model64, batch=2, max_new_tokens=MAX_NEW, lookahead=lj.LookaheadConfig.for_tokens(8),
            grammar_states=max(sizes),
        )  # fmt: skip
        for i, k in enumerate(order):
            request = lj.Request(PROMPTS[i % 4], id=i, **(GRAMMARS[k] if k else {}))
            engine.submit(request, lambda u: u.result and done.__setitem__(u.id, u.result))
        while engine.round():
            pass
    assert [done[i].token_ids for i in range(len(order))] == want


def test_cached_prompt_blocks_serve_rows_under_grammars(model64, monkeypatch):
    """The prefix cache with grammars (an online engine): a prompt's cached blocks serve
    the next request under a schema and one under a regex (their suffixes' prefills mask
    the first token as a prompt's does); each gets its lone decode's tokens."""
    from lookahead_jax.engine.prefill_shapes import PaddedShapes

    # (a suffix whose shape is not compiled would run from scratch: test_prefix_cache.py)
    monkeypatch.setattr(PaddedShapes, "instead", lambda *a, **k: None)
    stem = "a b c ab ba " * 2  # (two of the cache's 16-token blocks with the suffix)
    asks = [(stem + "x", "json_schema"), (stem + "x", "json_schema"), (stem + "the cat", "regex")]
    done = {}
    with jax.enable_x64(True):
        want = [
            lj.generate(
                model64, [p], max_new_tokens=MAX_NEW, lookahead=None, **GRAMMARS[k]
            ).token_ids[0]
            for p, k in asks
        ]
        engine = lj.Engine(
            model64,
            batch=2,
            max_new_tokens=MAX_NEW,
            lookahead=lj.LookaheadConfig.for_tokens(8),
            grammar_states=max(automaton(model64, k).states for k in GRAMMARS),
            prefix_cache_mb=1,
        )  # fmt: skip  (the swap test's tables: its programs)
        for i, (p, k) in enumerate(asks):  # one after the other: each finds the last cached
            engine.submit(
                lj.Request(p, id=i, **GRAMMARS[k]),
                lambda u: u.result and done.__setitem__(u.id, u.result),
            )
            while engine.round():
                pass
    assert [done[i].token_ids for i in range(len(asks))] == want
    assert engine.online_stats.prefix_hits == 2, engine.online_stats


def test_constrained_lookahead_in_float32_up_to_near_ties(tiny_text_ckpt):
    """float32 (the product's dtype): constrained lookahead == constrained plain but where
    plain decoding's two best logits were a near-tie (lj.testing's harness)."""
    model = lj.load(tiny_text_ckpt)
    for kind in GRAMMARS:
        accepted = lj.testing.assert_lookahead_matches_plain(
            model, PROMPTS, configs=(lj.LookaheadConfig.for_tokens(8),), max_new_tokens=MAX_NEW,
            batch_sizes=(4,), near_tie=1e-3, **GRAMMARS[kind],
        )  # fmt: skip
        assert all(n > 0 for n in accepted.values()), (kind, accepted)


def test_a_grammars_guesses_are_made_as_it_is_submitted(model64, monkeypatch):
    """The fixed-text chains (0.4-1.2 s a schema at a 49k vocabulary) are made with the
    automaton on the submitting thread, not when the engine's thread places it; their
    time counts in the grammar's compile_s; and the compile does not hold the engine's
    lock (its thread takes it as requests finish; the server's event loop, to submit)."""
    from lookahead_jax.engine import grammar_bank

    regex = r"[abc]{3,7} done\."  # (compiled nowhere else)
    engine = lj.Engine(model64, batch=2, max_new_tokens=4, lookahead=None, grammar_states=64)
    locked, compile_regex = [], grammar.from_regex

    def compiling(*args, **kwargs):
        locked.append(engine._known_lock.locked())
        return compile_regex(*args, **kwargs)

    monkeypatch.setattr(grammar, "from_regex", compiling)
    engine.submit(lj.Request("x", regex=regex))
    monkeypatch.undo()
    assert locked == [False]
    vocab = (model64.tokenizer.token_bytes(), tuple(model64.eos_ids), model64.lm.vocab_size)
    a = grammar.from_regex(regex, *vocab)  # (the compile cache's)
    assert id(a.next_sc) in grammar_bank._CHAINS  # before any round ran
