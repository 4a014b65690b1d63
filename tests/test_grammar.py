"""Grammars as token automata (lookahead_jax/grammar/): over a small vocabulary whose
answers are known by hand, and over SmolLM2's real one (its tokenizer only: no weights),
where every answer a random walk of the automaton completes matches the regex, or parses
and validates under the JSON schema (jsonschema)."""

from __future__ import annotations

import json
import re

import jsonschema
import numpy as np
import pytest

from lookahead_jax import grammar
from lookahead_jax.errors import UserInputError
from lookahead_jax.grammar import automaton as automaton_mod

EOS = 0
# a toy vocabulary: id -> bytes (0 is EOS, a special token)
TOY = [None, b"yes", b"no", b"y", b"es", b"n", b"o", b"{", b'"', b"a", b'{"a":', b"1", b"}", b":"]


def toy(pattern: str) -> grammar.TokenAutomaton:
    return grammar.from_regex(pattern, TOY, (EOS,), len(TOY))


def test_a_regex_over_a_toy_vocabulary_by_hand():
    """(yes|no): every tokenization of each answer is allowed, nothing else, and EOS only
    at the end (the automaton module's worked example)."""
    a = toy("(yes|no)")
    assert a.allowed(a.initial).tolist() == [1, 2, 3, 5]  # yes, no, y, n
    after_y = a.advance(a.initial, 3)
    assert a.allowed(after_y).tolist() == [4]  # es
    end = a.advance(after_y, 4)
    assert a.final_s[end] and a.allowed(end).tolist() == [EOS]
    assert a.advance(end, EOS) == end  # EOS keeps the final state
    for answer in ([1], [3, 4], [2], [5, 6]):
        assert a.accepts(answer), answer
    assert not a.accepts([3]) and a.walk([4]) == -1  # a prefix; a token not allowed
    assert a.class_v.shape == (len(TOY),) and a.next_sc.shape == (a.states, a.classes)
    # yes and no act alike (both end the answer at once): one class; y, es, n, o, EOS
    # each their own, and the tokens no state allows class 0
    assert a.class_v[1] == a.class_v[2] != 0 and a.classes == 7
    assert all(a.class_v[t] == 0 for t in range(len(TOY)) if t not in (1, 2, 3, 4, 5, 6, EOS))


def test_tokens_share_a_class_exactly_when_they_move_alike(monkeypatch):
    """automaton.token_classes: the table reproduces every move, tokens of one class have
    the same moves, and a hash collision (forced here) falls back to exact classes."""
    rng = np.random.default_rng(0)
    S, V = 6, 40
    moves = {(int(s), int(v)): int(rng.integers(S)) for s, v in rng.integers((S, 30), size=(90, 2))}
    for v in (30, 31):  # two tokens that act alike
        moves.update({(s, v): (s + 1) % S for s in range(S)})
    froms, tokens, tos = (
        np.asarray(x, np.int64) for x in zip(*[(*k, n) for k, n in moves.items()], strict=True)
    )

    def check(class_v, next_sc):
        assert np.array_equal(next_sc[froms, class_v[tokens]], tos)
        by_token = {v: {(s, n) for (s, t), n in moves.items() if t == v} for v in range(V)}
        for v in range(V):
            for w in range(V):
                assert (class_v[v] == class_v[w]) == (by_token[v] == by_token[w]), (v, w)
        assert all(class_v[v] == 0 for v in range(V) if not by_token[v])

    classes = automaton_mod.token_classes(froms, tokens, tos, S, V)
    check(*classes)
    assert classes[0][30] == classes[0][31]
    real = automaton_mod._classes_by_hash
    monkeypatch.setattr(
        automaton_mod, "_classes_by_hash", lambda *a: np.minimum(real(*a), 1)
    )  # every token with moves in one class
    collided = automaton_mod.token_classes(froms, tokens, tos, S, V)
    check(*collided)
    assert all(np.array_equal(x, y) for x, y in zip(classes, collided, strict=True))


def test_forced_runs_stop_where_the_grammar_branches_or_ends():
    """What the grammar forces from a state: the one allowed token while there is one."""
    a = toy('\\{"a":1\\}')
    # at the start '{' and '{"a":' both fit: nothing is forced yet
    assert a.forced(a.initial, 10) == []
    state = a.advance(a.initial, 10)  # '{"a":'
    assert a.forced(state, 10) == [11, 12]  # '1', '}', then the end (EOS or nothing)
    assert a.forced(state, 1) == [11]
    assert a.forced(a.advance(a.initial, 7), 10) == [8, 9, 8, 13, 11, 12]  # after '{' alone


def test_the_fixed_text_ahead_and_its_tokens():
    """grammar/fixed_text.py: the bytes every answer writes next, then their tokens as an
    encoder writes them (here longest match first), as far as the automaton allows."""
    from lookahead_jax.grammar import fixed_text

    a = toy('\\{"a":1\\}')
    assert fixed_text.fixed_bytes(a, TOY, a.initial) == b'{"a":1}'
    after_one = a.walk([10, 11])  # '{"a":', '1'
    assert fixed_text.fixed_bytes(a, TOY, after_one) == b"}"
    assert fixed_text.fixed_bytes(toy("(yes|no)"), TOY, 0) == b""  # y or n: nothing fixed

    def longest_first(text: bytes) -> list[int]:
        out = []
        while text:
            t = max(
                (i for i, b in enumerate(TOY) if b and text.startswith(b)),
                key=lambda i: len(TOY[i]),
            )
            out.append(t)
            text = text[len(TOY[t]) :]
        return out

    chains = fixed_text.chains(a, TOY, longest_first, 4)
    assert chains[a.initial].tolist() == [10, 11, 12, -1]
    assert chains[after_one].tolist() == [12, -1, -1, -1]
    # an encoder whose first token the grammar forbids (sentencepiece's leading "▁"):
    # the text is written by the longest allowed tokens instead
    spaced = fixed_text.chains(a, TOY, lambda text: [1, *longest_first(text)], 4)
    assert np.array_equal(spaced, chains)


@pytest.fixture(scope="module")
def smol(smollm2_ckpt):
    """SmolLM2's tokenizer: its tokens' bytes, EOS ids and vocabulary size."""
    from lookahead_jax.checkpoints.tokenizer import Tokenizer

    tok = Tokenizer(smollm2_ckpt)
    return tok, tok.token_bytes(), (tok.eos_id,), tok.vocab_size


def walk(a: grammar.TokenAutomaton, eos, rng, limit: int = 600) -> list[int] | None:
    """A random answer: tokens drawn uniformly among the allowed ones (EOS apart), the end
    taken whenever allowed with probability 1/2; None past `limit` tokens."""
    state, out = a.initial, []
    while len(out) < limit:
        allowed = [t for t in a.allowed(state) if t not in eos]
        if a.final_s[state] and (not allowed or rng.random() < 0.5):
            return out
        t = int(rng.choice(allowed))
        out.append(t)
        state = a.advance(state, t)
        assert state >= 0
    return None


def decode(token_bytes, ids) -> str:
    return b"".join(token_bytes[i] for i in ids).decode()


def test_regex_answers_over_smollm2_match(smol):
    tok, tb, eos, V = smol
    pattern = r"[0-9]{3}-[0-9]{4}|(yes|no), thanks"
    a = grammar.from_regex(pattern, tb, eos, V)
    # the first token: exactly the tokens whose text starts an answer
    viable = [
        i
        for i, b in enumerate(tb)
        if b
        and re.fullmatch(
            r"[0-9]{1,3}|[0-9]{3}-[0-9]{0,4}|(y|ye|yes|n|no)(,( (t(h(a(n(k(s)?)?)?)?)?)?)?)?",
            b.decode("utf-8", "replace"),
        )
    ]
    assert a.allowed(a.initial).tolist() == viable
    rng = np.random.default_rng(0)
    for _ in range(20):
        ids = walk(a, eos, rng)
        assert ids is not None and a.accepts(ids)
        assert re.fullmatch(pattern, decode(tb, ids)), decode(tb, ids)


SCHEMA = {
    "type": "object",
    "properties": {
        "name": {"type": "string", "maxLength": 12},
        "age": {"type": "integer"},
        "tags": {"type": "array", "items": {"enum": ["red", "green"]}, "maxItems": 3},
        "address": {
            "type": "object",
            "properties": {
                "city": {"type": "string", "maxLength": 8},
                "zip": {"type": "string", "pattern": "[0-9]{5}"},
            },
            "required": ["city"],
            "additionalProperties": False,
        },
        "score": {"anyOf": [{"type": "number"}, {"type": "null"}]},
        "ok": {"type": "boolean"},
    },
    "required": ["name", "age", "address"],
    "additionalProperties": False,
}


def test_json_schema_answers_over_smollm2_validate(smol):
    tok, tb, eos, V = smol
    a = grammar.from_json_schema(SCHEMA, tb, eos, V)
    assert a.compile_s > 0
    rng = np.random.default_rng(1)
    finished = 0
    for _ in range(20):
        ids = walk(a, eos, rng)
        if ids is None:  # (an integer's digits may run on)
            continue
        finished += 1
        answer = json.loads(decode(tb, ids))
        jsonschema.validate(answer, SCHEMA)
    assert finished >= 15
    # the same schema again (as a JSON string): from the cache
    again = grammar.from_json_schema(json.dumps(SCHEMA), tb, eos, V)
    assert again.compile_s == 0.0 and again.next_sc is a.next_sc


def test_a_pydantic_model_is_its_schema(smol):
    import pydantic

    tok, tb, eos, V = smol

    class Pet(pydantic.BaseModel):
        kind: str = pydantic.Field(max_length=6)
        legs: int

    a = grammar.from_json_schema(Pet, tb, eos, V)
    b = grammar.from_json_schema(Pet.model_json_schema(), tb, eos, V)
    assert a.next_sc is b.next_sc
    assert a.accepts(tok.encode('{"kind":"cat","legs":4}', add_special_tokens=False))
    assert not a.accepts(tok.encode('{"kind":"cat"}', add_special_tokens=False))


@pytest.mark.parametrize(
    "schema, needle",
    [
        (
            {"type": "object", "properties": {"age": {"type": "integer", "minimum": 0}}},
            r"\$\.properties\.age\.minimum \('minimum'\) is not supported",
        ),
        (
            {"type": "object", "additionalProperties": True},
            r"\$\.additionalProperties must be false",
        ),
        ({"type": "string", "format": "ipv4"}, r"\$\.format 'ipv4' is not supported"),
        ({"type": "strng"}, r"unknown types \['strng'\]"),
        ({"anyOf": []}, r"\$\.anyOf must be a non-empty list"),
        ({"oneOf": [{"type": "integer"}, {"type": "number"}]}, r"\$\.oneOf \('oneOf'\)"),
        (
            {"type": "object", "properties": {"a": {"type": "null"}}, "required": ["b"]},
            r"\$\.required must list names of \$\.properties",
        ),
        ('{"type": "object",', "not valid JSON"),
        ([1, 2], "must be an object"),
    ],
)
def test_a_schema_it_cannot_enforce_is_refused_where(schema, needle):
    with pytest.raises(UserInputError, match=needle):
        grammar.from_json_schema(schema, TOY, (EOS,), len(TOY))


def test_bad_regexes_and_oversized_tables_are_refused(monkeypatch):
    with pytest.raises(UserInputError, match="not a valid regular expression"):
        grammar.from_regex("(yes", TOY, (EOS,), len(TOY))
    with pytest.raises(UserInputError, match="non-empty string"):
        grammar.from_regex("", TOY, (EOS,), len(TOY))
    monkeypatch.setattr(automaton_mod, "MAX_TABLE_BYTES", 100)
    with pytest.raises(
        UserInputError, match=r"makes \d+ automaton states: its table .* over the bound"
    ):
        grammar.from_regex("(no|yes){2}", TOY, (EOS,), len(TOY))


def test_a_bank_too_large_in_octaves_fits_closely(monkeypatch):
    """engine/grammar_bank.py: an offline run's tables are powers of two (at least
    MIN_SHAPE) unless that passes the bound, then fitted to what its grammars need."""
    from lookahead_jax.engine import grammar_bank

    a = toy('\\{"a":1\\}')
    assert grammar_bank.GrammarBank([a], len(TOY)).next_gc.shape == (1024, 256)
    monkeypatch.setattr(grammar_bank, "MAX_TABLE_BYTES", 64 << 10)
    bank = grammar_bank.GrammarBank([a], len(TOY))
    assert bank.next_gc.shape == (-(-(1 + a.states) // 16) * 16, 16)
    state = bank.initial_state(a)
    assert np.flatnonzero(bank.next_gc[state][bank.class_mv[bank.kind_g[state]]] >= 0).tolist() == (
        a.allowed(a.initial).tolist()
    )
