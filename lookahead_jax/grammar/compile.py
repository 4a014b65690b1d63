"""Grammars compiled to token automata, kept per (grammar, vocabulary): compiling a JSON
schema over a 49k-token vocabulary takes ~0.2 s, so a server meeting the same schema on
every request compiles it once (`TokenAutomaton.compile_s` is 0.0 for one from here)."""

from __future__ import annotations

import collections
import dataclasses
import hashlib
import re
import threading
import time

from lookahead_jax.errors import UserInputError
from lookahead_jax.grammar import json_schema
from lookahead_jax.grammar.automaton import TokenAutomaton, from_transitions

MAX_KEPT = 64  # automata kept (least recently used dropped first)
_KEPT: collections.OrderedDict = collections.OrderedDict()
_VOCABULARIES: dict = {}  # vocabulary key -> outlines_core.Vocabulary
_KEYS: dict = {}  # id(token_bytes) -> (token_bytes, its key): a tokenizer's list, hashed once
_LOCK = threading.Lock()


def from_regex(pattern: str, token_bytes, eos_ids, vocab_size: int) -> TokenAutomaton:
    """The automaton of answers that match `pattern` (whole) over the tokens' bytes
    (token_bytes: tokenizer.token_bytes(), None for special tokens); `eos_ids` end one."""
    check_regex(pattern)
    return _compiled("regex", pattern, pattern, token_bytes, eos_ids, vocab_size)


def check_regex(pattern) -> None:
    """Refuse what is not a regex (before anything loads: the CLI, a prompts file)."""
    if not isinstance(pattern, str) or not pattern:
        raise UserInputError(f"regex must be a non-empty string, got {pattern!r}")
    try:
        re.compile(pattern)
    except re.error as e:
        raise UserInputError(f"regex {pattern!r} is not a valid regular expression: {e}") from None


def from_json_schema(schema, token_bytes, eos_ids, vocab_size: int) -> TokenAutomaton:
    """The automaton of JSON answers valid under `schema` (a dict, a JSON string or a
    pydantic model class; json_schema.py says what it enforces)."""
    text, pattern = json_schema.to_regex(schema)
    return _compiled("json_schema", text, pattern, token_bytes, eos_ids, vocab_size)


def _compiled(kind, key_text, pattern, token_bytes, eos_ids, vocab_size) -> TokenAutomaton:
    eos_ids = tuple(int(e) for e in eos_ids)
    if not eos_ids:
        raise UserInputError("a grammar needs the model's EOS token (this model has none)")
    vocab_key = _vocabulary_key(token_bytes)
    key = (kind, key_text, vocab_key, eos_ids, vocab_size)
    with _LOCK:
        if key in _KEPT:
            _KEPT.move_to_end(key)
            return _KEPT[key]
    t = time.perf_counter()
    from outlines_core import Index

    what = f"{kind} {key_text[:60]!r}" + ("..." if len(key_text) > 60 else "")
    try:
        index = Index(pattern, _vocabulary(vocab_key, token_bytes, eos_ids[0]))
    except (ValueError, TypeError) as e:
        raise UserInputError(f"{what}: cannot be compiled to an automaton: {e}") from None
    automaton = from_transitions(
        index.get_transitions(),
        index.get_initial_state(),
        index.get_final_states(),
        vocab_size,
        eos_ids,
        what,
    )
    with _LOCK:
        _KEPT[key] = automaton
        while len(_KEPT) > MAX_KEPT:
            _KEPT.popitem(last=False)
    return dataclasses.replace(automaton, compile_s=time.perf_counter() - t)


def _vocabulary_key(token_bytes) -> str:
    """A digest of the tokens' bytes (per list object: a tokenizer keeps its own)."""
    known = _KEYS.get(id(token_bytes))
    if known is not None and known[0] is token_bytes:
        return known[1]
    digest = hashlib.sha1()
    for b in token_bytes:
        digest.update(b"\x00" if b is None else b"\x01" + len(b).to_bytes(2, "little") + b)
    if len(_KEYS) > 16:
        _KEYS.clear()
    _KEYS[id(token_bytes)] = (token_bytes, digest.hexdigest())
    return _KEYS[id(token_bytes)][1]


def _vocabulary(key: str, token_bytes, eos_id: int):
    """outlines-core's Vocabulary of these tokens (special ones left out), made once."""
    from outlines_core import Vocabulary

    with _LOCK:
        if key not in _VOCABULARIES:
            by_bytes: dict[bytes, list[int]] = {}
            for i, b in enumerate(token_bytes):
                if b and i != eos_id:
                    by_bytes.setdefault(b, []).append(i)
            _VOCABULARIES[key] = Vocabulary(eos_id, by_bytes)
        return _VOCABULARIES[key]
